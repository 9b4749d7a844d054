#!/usr/bin/env bash
# Before/after on a 2-GPU machine in one go: the same benchmark command runs against the checkout in .base
# (the code before, e.g. `git archive REV | tar -x -C .base`) on GPU 0 and against this checkout on GPU 1, at the
# same time; results and logs in $OUT (default ./out) as base_NAME.* and new_NAME.*. With PROFILE=1 a sampling
# profiler (py-spy, from .whl) records the new daemon's processes for PROFILE_S seconds once the log shows the
# first measured rate's warm-up ("rate R/s:"), as raw folded stacks (threads apart).
#   bash benchmarks/device_ab.sh loadbook -- python3 -m benchmarks.load --dummy 1.7b --device cuda --frames 60 \
#        --rates 10,20 --book 300 --no-prime
# The first argument names the run; everything after `--` is the command (its --json/--md are added here).
# Wheels the GPU image lacks go in .whl (shared/tools/device-wheels.sh and docs/PERFORMANCE.md say which).
set -uo pipefail
name=$1; shift; [ "${1:-}" = "--" ] && shift
OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # the .base run works from its own folder
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv,noheader | tee "$OUT/gpu.txt"
start=$SECONDS
pids=()
if [ -d .base ]; then
  (cd .base && CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_CACHE_DIR=/tmp/ind-base PYTHONPATH="$PWD:/tmp/site" \
     "$@" --json "$OUT/base_$name.json" --md "$OUT/base_$name.md" > "$OUT/base_$name.log" 2>&1) &
  pids+=($!)
fi
CUDA_VISIBLE_DEVICES=${NEW_GPU:-1} TORCHINDUCTOR_CACHE_DIR=/tmp/ind-new PYTHONPATH="$PWD:/tmp/site" \
  "$@" --json "$OUT/new_$name.json" --md "$OUT/new_$name.md" > "$OUT/new_$name.log" 2>&1 &
new=$!
pids+=($new)
if [ "${PROFILE:-0}" = 1 ]; then
  (until grep -q "rate .*/s: .*warm-up" "$OUT/new_$name.log" 2>/dev/null || ! kill -0 $new 2>/dev/null; do sleep 2; done
   sleep "${PROFILE_DELAY_S:-10}"
   child=$(pgrep -f "engines.process.child" | head -n 1)
   for pid in $child $(ps -o ppid= -p "$child" 2>/dev/null); do  # the engine process and its daemon
     /tmp/site/bin/py-spy record -p "$pid" -d "${PROFILE_S:-20}" -r 50 -f raw --threads -o "$OUT/profile_$pid.txt" \
       > "$OUT/profile_$pid.log" 2>&1 &
   done
   wait) &
fi
trap 'kill -TERM "${pids[@]}" 2>/dev/null; for p in "${pids[@]}"; do wait "$p"; done' TERM INT  # keep what was measured
for p in "${pids[@]}"; do wait "$p"; done
echo "== $name: $((SECONDS - start)) s"
for f in "$OUT"/base_"$name".md "$OUT"/new_"$name".md; do [ -f "$f" ] && { echo "-- $f"; cat "$f"; }; done
tail -n 5 "$OUT"/*_"$name".log
