#!/usr/bin/env bash
# The fp8 key/value cache on a GPU, in one call: its GPU tests, the step A/B at book contexts and the
# agreement yardstick. Results in $OUT (default ./out). Run from the project root:
#   bash benchmarks/device_fp8kv.sh            (SHAPES="0.6b 1.7b" BATCHES=256,512 to change what is timed)
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="$PWD:/tmp/site"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/cards.txt"
timeout "${T_TESTS:-200}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kv_fp8.py tests/test_attention_kernel.py \
  tests/test_layer_kernel.py > "$OUT/gpu_tests.log" 2>&1; echo "gpu tests: exit $?"; tail -n 3 "$OUT/gpu_tests.log"
for shape in ${SHAPES:-0.6b}; do
  timeout "${T_AB:-300}" python3 -m benchmarks.ab_step --dummy "$shape" --batches "${BATCHES:-256,512}" --context 450 \
    --variants layer:64:kernel:kernel,layer:64:kernel:kernel:fp8 --json "$OUT/ab_step_fp8kv_$shape.json" \
    > "$OUT/ab_step_fp8kv_$shape.log" 2>&1; echo "ab_step $shape: exit $?"; tail -n 12 "$OUT/ab_step_fp8kv_$shape.log"
done
timeout "${T_AGREE:-120}" python3 -m benchmarks.bf16_agreement --dummy 0.6b --device cuda --frames 60 \
  --json "$OUT/fp8kv_agreement_0.6b.json" > "$OUT/agreement.log" 2>&1; echo "agreement: exit $?"; tail -n 8 "$OUT/agreement.log"
