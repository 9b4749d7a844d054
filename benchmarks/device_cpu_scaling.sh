#!/usr/bin/env bash
# The CPU engine on 2, 4 and 8 cores of a bigger machine (taskset pins the whole run; the engine's threads
# follow, model.threads auto): the book of real text through the shipped daemon, and one stream; no GPU used.
# Results in $OUT (default ./out): book_cpu_N.{json,md,log} and stream_cpu_N.log, then a summary.
# Run from the project root; one core count and one part a call keeps each under the device machine's 10 minutes:
#   CORES=8 WHAT=book bash benchmarks/device_cpu_scaling.sh      # then CORES=4, CORES=2; WHAT=stream likewise
#   CORES=1 WHAT=book BOOK_ARGS="--segments 12 --frames 132" bash benchmarks/device_cpu_scaling.sh   # a shorter book
# Wheels the image lacks go in .whl (soundfile, mutagen: docs/PERFORMANCE.md).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
CORES=${CORES:-"2 4 8"}; WHAT=${WHAT:-"book stream"}
BOOK_ARGS=${BOOK_ARGS:-"--text benchmarks/texts/founding.txt --frames auto"}
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=""
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="$PWD:/tmp/site"
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-400 > "$OUT/cpu.txt"
for n in $CORES; do
  cpus="0-$((n - 1))"
  case " $WHAT " in *" book "*)
    # shellcheck disable=SC2086
    timeout "${T_BOOK:-570}" taskset -c "$cpus" python3 -m benchmarks.daemon_book --dummy 0.6b --device cpu $BOOK_ARGS \
      --timeout 540 --json "$OUT/book_cpu_$n.json" --md "$OUT/book_cpu_$n.md" > "$OUT/book_cpu_$n.log" 2>&1;;
  esac
  case " $WHAT " in *" stream "*)
    timeout "${T_STREAM:-570}" taskset -c "$cpus" python3 -m benchmarks.peer_cpu --peer "${PEER:-none}" --frames 48,96 \
      --reps 3 --json "$OUT/stream_cpu_$n.json" > "$OUT/stream_cpu_$n.log" 2>&1;;
  esac
done
cat "$OUT/cpu.txt"
for n in $CORES; do
  echo "== $n cores"; cat "$OUT/book_cpu_$n.md" 2>/dev/null || tail -5 "$OUT/book_cpu_$n.log"
  grep -A8 "^CPU:" "$OUT/stream_cpu_$n.log" 2>/dev/null || tail -5 "$OUT/stream_cpu_$n.log"
done
