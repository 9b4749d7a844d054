#!/usr/bin/env bash
# Books through the shipped daemon on one GPU and on every GPU of the machine, with a sampling profile of
# the one-GPU engine process; results in $OUT (default ./out) as book_SHAPE_{1gpu,all}.{json,md,daemon.log}
# and profile_book_SHAPE.txt. Run from the project root on a multi-GPU machine:
#   SHAPE=0.6b SEGMENTS=3000 bash benchmarks/device_books.sh [--config-extra runtime.attn_kernel=false]
# Wheels the GPU image lacks go in .whl (soundfile, mutagen, py-spy, ...: docs/PERFORMANCE.md).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
SHAPE=${SHAPE:-0.6b}; SEGMENTS=${SEGMENTS:-3000}
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="$PWD:/tmp/site"
book() {  # name, timeout, extra args...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m benchmarks.daemon_book --dummy "$SHAPE" --segments "$SEGMENTS" "$@" \
    --json "$OUT/book_${SHAPE}_$name.json" --md "$OUT/book_${SHAPE}_$name.md" > "$OUT/book_${SHAPE}_$name.log" 2>&1
}
profile() {  # the engine process once the book runs, for PROFILE_S seconds
  local log="$OUT/book_${SHAPE}_1gpu.daemon.log"
  until grep -q "engine process .* ready" "$log" 2>/dev/null; do sleep 1; done
  sleep "${PROFILE_DELAY_S:-15}"
  local child; child=$(pgrep -f "engines.process.child" | head -n 1)
  [ -n "$child" ] && /tmp/site/bin/py-spy record -p "$child" -d "${PROFILE_S:-20}" -r 50 -f raw --threads \
    -o "$OUT/profile_book_$SHAPE.txt" > "$OUT/profile_book_$SHAPE.log" 2>&1
}
book all "${T_ALL:-240}" --config-extra model.device=all "$@"
profile & prof=$!
CUDA_VISIBLE_DEVICES=0 book 1gpu "${T_ONE:-240}" "$@"
wait "$prof"
for f in "$OUT"/book_"$SHAPE"_*.md; do cat "$f"; done
