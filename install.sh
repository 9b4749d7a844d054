#!/usr/bin/env bash
# Install tts-appliance into a virtual environment (idempotent: re-running updates it in place).
#   ./install.sh            install the appliance (CPU torch, or a CUDA build when an NVIDIA GPU is present)
#   ./install.sh --dev      also install the test tools
# Environment: TTS_APPLIANCE_VENV (default ./.venv), PYTHON (default python3),
#              TORCH_SPEC (default torch==2.13.0), TORCH_INDEX_URL (extra pip index for torch wheels).
set -euo pipefail
cd "$(dirname "$0")"
VENV=${TTS_APPLIANCE_VENV:-.venv}
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
DEV=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  ACCEL=nvidia
elif [ -e /dev/davinci0 ] || command -v npu-smi >/dev/null 2>&1; then
  ACCEL=ascend
else
  ACCEL=cpu
fi
echo "install.sh: accelerator: $ACCEL"

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "install.sh: installing $TORCH_SPEC"
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    "${PIP[@]}" --extra-index-url "$TORCH_INDEX_URL" "$TORCH_SPEC"
  else
    "${PIP[@]}" "$TORCH_SPEC"
  fi
fi
# keep the installed torch: the constraint stops pip from swapping it for another build
"$VENV/bin/python" -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > "$VENV/torch-pin.txt"
"$VENV/bin/python" -c "import torch; print(torch.__version__)" | sed 's/^/install.sh: torch /'
if [ "$DEV" = 1 ]; then
  "${PIP[@]}" -c "$VENV/torch-pin.txt" -e ".[test]"
else
  "${PIP[@]}" -c "$VENV/torch-pin.txt" -e .
fi
echo "install.sh: done. Run: $VENV/bin/tts-appliance --help"
