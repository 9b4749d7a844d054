#!/usr/bin/env bash
# GPU session runner: each argument is a stage, run in order, each under its own time limit, results
# (JSON, markdown, logs) in $OUT (default ./out). Wheels the GPU image lacks go in .whl (see docs/PERFORMANCE.md).
#   SHAPE=0.6b bash benchmarks/device_run.sh tests ab bench book
# Stages: tests (pytest -m gpu), ab (decode-step variants), bench (engine benchmark), book (book job),
#         load (open-loop streams against the daemon), loadbook (the same with a book running),
#         live (live-text WebSocket sessions: first word -> first audio, last word -> end, at 1 and 16 sessions),
#         ttsbench (tts-bench, the Nari server's open-loop client, WebSocket and HTTP: .whl from
#         benchmarks/tts_bench_wheels.sh), say (CLI).
# Knobs: SHAPE, FUSE (layer|pass), CODEC (torch|torch-compiled), BENCH_ARGS, AB_ARGS, BOOK_ARGS, LOAD_ARGS, LIVE_ARGS, TTSBENCH_ARGS,
#        T_<STAGE>.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/tts-inductor}  # shared by the stages' processes
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the subprocesses (daemon, checkpoint writer) import the repo too
SHAPE=${SHAPE:-0.6b} FUSE=${FUSE:-layer} CODEC=${CODEC:-torch}
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader | tee -a "$OUT/gpu.txt"
run() {  # run NAME LIMIT CMD... : time-limited, log in $OUT/NAME.log, its tail printed
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: rc $? in $((SECONDS - t0)) s"
  tail -n "${TAIL:-14}" "$OUT/$name.log"
}
for stage in "$@"; do
  case $stage in
    tests) run gpu_tests "${T_TESTS:-240}" python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/ ;;
    ab) run "ab_$SHAPE" "${T_AB:-240}" python3 -m benchmarks.ab_step --dummy "$SHAPE" ${AB_ARGS:-} --json "$OUT/ab_$SHAPE.json" ;;
    bench) run "bench_$SHAPE" "${T_BENCH:-240}" python3 -m benchmarks.bench --dummy "$SHAPE" --codec "$CODEC" ${BENCH_ARGS:-} \
             --json "$OUT/bench_$SHAPE.json" --md "$OUT/bench_$SHAPE.md" ;;
    book) run "book_$SHAPE" "${T_BOOK:-180}" python3 -m benchmarks.book_job --dummy "$SHAPE" --codec "$CODEC" --fuse "$FUSE" \
            ${BOOK_ARGS:-} --json "$OUT/book_$SHAPE.json" ;;
    ttsbench) run "ttsbench_$SHAPE" "${T_TTSBENCH:-560}" python3 -m benchmarks.tts_bench --dummy "$SHAPE" --device cuda \
                --dtype bfloat16 --bench "python3 -m tts_bench" ${TTSBENCH_ARGS:---slots 64 --config-extra runtime.max_queue=256 \
                --frames 60 --rates 1,4,10,20 --transports websocket,http --warmup 5 --duration 15} --out "$OUT/tts_bench_$SHAPE" ;;
    load) run "load_$SHAPE" "${T_LOAD:-420}" python3 -m benchmarks.load --dummy "$SHAPE" --device cuda --dtype bfloat16 \
            ${LOAD_ARGS:---slots 64 --frames 60 --rates 1,4,10,20,30} --json "$OUT/load_$SHAPE.json" --md "$OUT/load_$SHAPE.md" ;;
    loadbook) run "loadbook_$SHAPE" "${T_LOAD:-300}" python3 -m benchmarks.load --dummy "$SHAPE" --device cuda --dtype bfloat16 \
            ${LOAD_ARGS:---slots 64 --frames 60 --rates 10} --book 300 --json "$OUT/loadbook_$SHAPE.json" --md "$OUT/loadbook_$SHAPE.md" ;;
    live) run "live_$SHAPE" "${T_LIVE:-300}" python3 -m benchmarks.live --dummy "$SHAPE" --device cuda --dtype bfloat16 \
            ${LIVE_ARGS:---slots 64 --sessions 1,16} --json "$OUT/live_$SHAPE.json" --md "$OUT/live_$SHAPE.md" ;;
    *) echo "unknown stage $stage" ;;
  esac
done
