#!/usr/bin/env bash
# Books past the key/value floor (issue 47) on one GPU: parity of the attention kernels, the kernels alone, the
# step A/B with the attention launch probed in and out of the step, and books through the shipped daemon. Each
# part bounded by `timeout` inside one budget (BUDGET_S, default 530 s: a 10-minute call with room to spare);
# a part that fails or runs out leaves the others. Logs and JSON go to $LOGS (default /tmp/gpu-books), then
# into one file, $OUT/gpu_books_logs.tar.gz (default OUT ./out), beside the table printed last
# ($OUT/gpu_books_table.md, benchmarks.gpu_books_table). From the project root:
#
#   bash benchmarks/device_gpu_books.sh                              # PARTS="tests asm ab kernels" (~8.5 min)
#   PARTS="runner_tests book" bash benchmarks/device_gpu_books.sh    # a second call (~8.5 min)
#
# Knobs: PARTS (tests runner_tests window_tests asm ab kernels book), BUDGET_S, SHAPE (0.6b), SEGMENTS (2500),
# BOOKS (which daemon configurations; default "default split_fp8"; also split, split_fp8_512, custom: BOOK_EXTRA, e.g.
# "--config-extra runtime.kv_cache=fp8"; text: BOOK_TEXT, a text file segmented as a submit would; text_all: the
# same on every GPU of the machine (model.device: all); text_nowin: one GPU, the batch codec lane without
# windows, runtime.codec_windows=false), AB_VARIANTS, AB_BATCHES, T_<PART> (each part's limit); PROFILE="NAME
# ..." (book names): py-spy records the daemon process and its engine processes for PROFILE_S seconds (default 8)
# from PROFILE_DELAY_S (default 4) after that book's submission (py-spy's wheel in .whl). Wheels the GPU image
# lacks go in .whl (soundfile for the books).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
FINAL=$OUT; OUT=${LOGS:-/tmp/gpu-books}  # the parts write here; $FINAL gets the tarball and the table
[ -z "${LOGS:-}" ] && rm -rf "$OUT"  # (the default folder is this script's alone: no earlier run's files)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/tts-inductor}  # shared by every process below
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="$PWD:/tmp/site"
PARTS=${PARTS:-tests asm ab kernels}
BUDGET_S=${BUDGET_S:-530}
SHAPE=${SHAPE:-0.6b}; SEGMENTS=${SEGMENTS:-2500}
BOOKS=${BOOKS:-default split_fp8}
AB_BATCHES=${AB_BATCHES:-256,512}
V=layer:64:kernel:kernel  # the shipped step (EngineRunner's defaults), then the kernel, the cache, the opaque call
AB_VARIANTS=${AB_VARIANTS:-$V,$V:split,$V:fp8:split,$V:fp8:split:opaque}
START=$SECONDS
: > "$OUT/parts.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/gpu.txt"

part() {  # part NAME LIMIT CMD...: run within the budget left, log in $OUT/NAME.log, a line in parts.txt
  local name=$1 limit=$2; shift 2
  local left=$((BUDGET_S - (SECONDS - START)))
  if [ "$left" -lt 30 ]; then
    echo "$name skipped 0 (budget spent)" | tee -a "$OUT/parts.txt"; return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s (limit ${limit}s)" | tee -a "$OUT/parts.txt"
  tail -n "${TAIL:-6}" "$OUT/$name.log"
}

profile() {  # profile NAME: py-spy on the daemon and its engine processes once book NAME has been submitted
  local log="$OUT/book_${SHAPE}_$1.log" t0=$SECONDS
  until grep -q "book job" "$log" 2>/dev/null; do
    sleep 0.5; [ $((SECONDS - t0)) -gt "${T_BOOK:-240}" ] && return
  done
  sleep "${PROFILE_DELAY_S:-4}"
  local pids; pids=$(pgrep -f "appliance.cli daemon"; pgrep -f "engines.process.child")
  for p in $pids; do
    /tmp/site/bin/py-spy record -p "$p" -d "${PROFILE_S:-8}" -r 100 -f raw --threads \
      -o "$OUT/profile_${SHAPE}_$1_$p.txt" > "$OUT/profile_${SHAPE}_$1_$p.log" 2>&1 &
  done
  wait
}

book() {  # book NAME EXTRA...: the book through a daemon on the shared random checkpoint
  local name=$1; shift
  case " ${PROFILE:-} " in *" $name "*) profile "$name" & ;; esac
  part "book_${SHAPE}_$name" "${T_BOOK:-240}" python3 -m benchmarks.daemon_book --model "$CKPT" --fixed-length \
    --segments "$SEGMENTS" --json "$OUT/book_${SHAPE}_$name.json" --md "$OUT/book_${SHAPE}_$name.md" \
    --daemon-log "$OUT/book_${SHAPE}_$name.daemon.log" "$@"
}

for p in $PARTS; do
  case $p in
    tests)  # parity at the real shapes: each attention kernel (and the layer kernel) against the torch form
      part gpu_tests "${T_TESTS:-120}" python3 -m pytest -v -m gpu -p no:cacheprovider -k "real_shapes and not step or one_launch" \
        tests/test_attention_split.py tests/test_attention_kernel.py tests/test_kv_fp8.py tests/test_layer_kernel.py ;;
    runner_tests)  # the runner's fp32 greedy codes through compiled regions and graphs: the split kernel, the fp8 cache
      part gpu_runner_tests "${T_RUNNER_TESTS:-200}" python3 -m pytest -v -m gpu -p no:cacheprovider -k "runner or step" \
        tests/test_attention_split.py tests/test_kv_fp8.py tests/test_attention_kernel.py tests/test_layer_kernel.py ;;
    window_tests)  # the batch codec lane's windows through captured graphs against the reference
      part gpu_window_tests "${T_WINDOW_TESTS:-150}" python3 -m pytest -v -m gpu -p no:cacheprovider \
        tests/test_codec_windows.py ;;
    asm)  # what the compiler of this image makes of each kernel (registers, shared memory, loads, conversions)
      part kernel_asm "${T_ASM:-60}" python3 -m benchmarks.kernel_asm --keep "$OUT/asm" ;;
    kernels)  # the attention alone at book shape: both kernels, both caches, split counts, launch settings
      part attention_bench "${T_KERNELS:-150}" python3 -m benchmarks.attention_bench --rows 256,512 --context 450 \
        --json "$OUT/attention_bench.json" ;;
    ab)  # the decode step at 256 and 512 rows at contexts 450-499; the launch probed on the first and last variant
      first=${AB_VARIANTS%%,*}; last=${AB_VARIANTS##*,}
      part ab_step "${T_AB:-330}" python3 -m benchmarks.ab_step --dummy "$SHAPE" --batches "$AB_BATCHES" --context 450 \
        --variants "$AB_VARIANTS" --probe "$first,$last" --json "$OUT/ab_step.json" ;;
    book)
      CKPT=/tmp/gpu-books-ckpt/dummy-$SHAPE
      [ -f "$CKPT/config.json" ] || part checkpoint 120 python3 -m benchmarks.dummy_checkpoint --dummy "$SHAPE" \
        --device cuda --out "$CKPT"
      for b in $BOOKS; do
        case $b in
          default) book default ;;
          split) book split --config-extra runtime.attn_split=true ;;
          split_fp8) book split_fp8 --config-extra runtime.attn_split=true --config-extra runtime.kv_cache=fp8 ;;
          split_fp8_512) book split_fp8_512 --config-extra runtime.attn_split=true --config-extra runtime.kv_cache=fp8 \
                           --config-extra runtime.max_slots=512 ;;
          custom) book custom ${BOOK_EXTRA:-} ;;
          text|text_all|text_nowin)
                if [ ! -f "${BOOK_TEXT:-}" ]; then
                  echo "book_$b skipped 0 (BOOK_TEXT: no such file)" | tee -a "$OUT/parts.txt"
                elif [ "$b" = text_all ]; then
                  book "$b" --text "$BOOK_TEXT" --config-extra model.device=all ${BOOK_EXTRA:-}
                elif [ "$b" = text_nowin ]; then CUDA_VISIBLE_DEVICES=0 book "$b" --text "$BOOK_TEXT" \
                  --config-extra runtime.codec_windows=false ${BOOK_EXTRA:-}
                else CUDA_VISIBLE_DEVICES=0 book "$b" --text "$BOOK_TEXT" ${BOOK_EXTRA:-}; fi ;;
          *) echo "unknown book $b" ;;
        esac
      done ;;
    *) echo "unknown part $p" ;;
  esac
done
wait  # (profiles)
echo "total $((SECONDS - START))s" | tee -a "$OUT/parts.txt"
python3 -m benchmarks.gpu_books_table "$OUT" > "$OUT/gpu_books_table.md" 2>&1
cp "$OUT/gpu_books_table.md" "$FINAL/"
tar -czf "$FINAL/gpu_books_logs.tar.gz" -C "$OUT" . 2>/dev/null
cat "$FINAL/gpu_books_table.md"
