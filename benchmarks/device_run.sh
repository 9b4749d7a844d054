#!/usr/bin/env bash
# One device session for one model shape: engine benchmark, the official qwen-tts package on the same
# random weights (same run, same GPU), and client-side TTFA over the daemon's Unix socket.
# Needs the wheels the GPU image lacks in .whl (our runtime deps) and .whl_off (the official package:
# ../shared/tools/device-wheels.sh). Results land in $OUT (or ./out).
#   bash benchmarks/device_run.sh 0.6b        # GPU_TESTS=1 also runs the gpu-marked tests first
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "$2"/*.whl; }
[ -d .whl ] && pipi /tmp/site .whl && export PYTHONPATH=/tmp/site
[ -d .whl_off ] && pipi /tmp/offsite .whl_off
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
if [ "${GPU_TESTS:-0}" = 1 ]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider tests/ 2>&1 | tail -15 | tee "$OUT/gpu_tests.txt"
fi
for shape in "${@:-0.6b}"; do
  timeout "${BENCH_TIMEOUT:-330}" python3 -m benchmarks.bench --dummy "$shape" ${BENCH_ARGS:-} \
    --json "$OUT/bench_$shape.json" --md "$OUT/bench_$shape.md" > "$OUT/bench_$shape.log" 2>&1
  tail -16 "$OUT/bench_$shape.log"
  if [ -d /tmp/offsite ]; then
    PYTHONPATH="/tmp/offsite:$PWD" timeout "${OFFICIAL_TIMEOUT:-150}" python3 -m benchmarks.official_baseline \
      --dummy "$shape" --seed 0 --device cuda --frames 150 --batch 1,8 --json "$OUT/official_$shape.json" \
      --md "$OUT/official_$shape.md" --compare "$OUT/bench_$shape.json" > "$OUT/official_$shape.log" 2>&1
    tail -12 "$OUT/official_$shape.log"
  fi
  timeout "${TTFA_TIMEOUT:-120}" python3 -m benchmarks.socket_ttfa --dummy "$shape" --device cuda --concurrency 1,32 \
    --json "$OUT/ttfa_$shape.json" --md "$OUT/ttfa_$shape.md" > "$OUT/ttfa_$shape.log" 2>&1
  tail -8 "$OUT/ttfa_$shape.log"
done
