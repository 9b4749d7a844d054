#!/usr/bin/env bash
# One device session: GPU tests, then the engine benchmark for the given shapes. Results land in $OUT
# (or ./out). Usage: bash benchmarks/device_run.sh [shapes...]   e.g.  bash benchmarks/device_run.sh 0.6b 1.7b
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  python3 -m pytest -q -m gpu tests/test_runtime.py 2>&1 | tail -15 | tee "$OUT/gpu_tests.txt"
fi
for shape in "${@:-0.6b}"; do
  python3 -m benchmarks.bench --dummy "$shape" ${BENCH_ARGS:-} --json "$OUT/bench_$shape.json" \
    --md "$OUT/bench_$shape.md" 2>&1 | tail -25
done
