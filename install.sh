#!/usr/bin/env bash
# Install tts-appliance into a virtual environment (idempotent: re-running updates it in place).
#   ./install.sh              as a normal user: the venv only (CPU torch, or a CUDA build when an NVIDIA GPU is
#                             present); nothing outside this folder is touched
#   sudo ./install.sh         the service: the venv plus the systemd units, service user and spool folders
#                             (see systemd/); without --model the TINY TEST MODEL (random weights, noise)
#   ./install.sh --dev        also install the test tools (no systemd set-up unless --systemd is given): the
#                             test extras, the test oracle (.venv-oracle: tests/fixtures/oracle_venv.sh),
#                             axe-core (npm, tests/fixtures/axe) and, as root, Debian's postgresql and ffmpeg
#   --model ID|PATH           use this checkpoint: a local folder is linked, a hub ID is downloaded when
#                             huggingface_hub is installed and the network allows (else: a clear message)
#   --no-systemd / --systemd  skip / force the systemd part (as root: system units, user tts-appliance,
#                             /var/lib/tts-appliance; otherwise user units in ~/.config/systemd/user)
#   --dry-run                 print what would be done, change nothing
#   --uninstall               remove the units and the venv; keeps user data (queue, outputs, voices, config)
# Environment: TTS_APPLIANCE_VENV (default ./.venv), PYTHON (default python3),
#              TORCH_SPEC (default torch==2.13.0), TORCH_INDEX_URL (extra pip index for torch wheels),
#              TTS_APPLIANCE_SYSROOT (install system files under this root instead of /, for packaging),
#              TTS_APPLIANCE_INSTALL_MODE=system|user (default: system as root, else user).
set -euo pipefail
cd "$(dirname "$0")"
VENV=${TTS_APPLIANCE_VENV:-.venv}
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
DEV=0 SYSTEMD=auto MODEL="" UNINSTALL=0 DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dev) DEV=1 ;;
    --systemd) SYSTEMD=1 ;;
    --no-systemd) SYSTEMD=0 ;;
    --model) [ $# -ge 2 ] || { echo "install.sh: --model needs an ID or a PATH" >&2; exit 2; }; MODEL=$2; shift ;;
    --model=*) MODEL=${1#--model=} ;;
    --uninstall) UNINSTALL=1 ;;
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
export TTS_APPLIANCE_INSTALL_MODE=${TTS_APPLIANCE_INSTALL_MODE:-$([ "$(id -u)" = 0 ] && echo system || echo user)}
# the service is a root install; a user's plain ./install.sh sets up the venv only (--systemd: user units)
if [ "$SYSTEMD" = auto ]; then
  if [ "$DEV" = 1 ]; then SYSTEMD=0 WHY="--dev"
  elif [ "$TTS_APPLIANCE_INSTALL_MODE" = system ]; then SYSTEMD=1
  else SYSTEMD=0 WHY="not root: the venv only; sudo ./install.sh installs the service"
  fi
elif [ "$SYSTEMD" = 0 ]; then WHY="--no-systemd"
fi
if [ "$DRY" = 1 ]; then  # the decisions above, and what they would change
  say() { echo "install.sh --dry-run: $*"; }
  if [ "$UNINSTALL" = 1 ]; then say "would remove the units and $VENV (systemd/setup.sh uninstall)"; exit 0; fi
  say "venv $VENV: $([ -x "$VENV/bin/python" ] && echo "exists, updated in place" || echo "new ($PY -m venv)"), $TORCH_SPEC when torch is missing, the package$([ "$DEV" = 1 ] && echo " with the test tools; the test oracle in .venv-oracle" || true)"
  [ -z "$MODEL" ] || say "model: $MODEL, in the $TTS_APPLIANCE_INSTALL_MODE config (systemd/setup.sh)"
  if [ "$SYSTEMD" = 0 ]; then say "systemd: skipped ($WHY)"
  elif [ "$TTS_APPLIANCE_INSTALL_MODE" = system ]; then
    say "systemd: the service (system units, user tts-appliance, /var/lib/tts-appliance, /etc/tts-appliance)"
  else say "systemd: user units in ~/.config/systemd/user"
  fi
  exit 0
fi
if [ "$UNINSTALL" = 1 ]; then
  exec "$(dirname "$0")/systemd/setup.sh" uninstall "$VENV"
fi

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
  # numpy with it: torch warns at every import until numpy is there
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    "${PIP[@]}" --extra-index-url "$TORCH_INDEX_URL" "$TORCH_SPEC" numpy
  else
    "${PIP[@]}" "$TORCH_SPEC" numpy
  fi
fi
"$VENV/bin/python" -c "import numpy" >/dev/null 2>&1 || "${PIP[@]}" numpy
# keep the installed torch: the constraint stops pip from swapping it for another build
"$VENV/bin/python" -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > "$VENV/torch-pin.txt"
"$VENV/bin/python" -c "import torch; print(torch.__version__)" | sed 's/^/install.sh: torch /'
if [ "$DEV" = 1 ]; then
  # Debian packages the tests use (best effort: without them their tests skip with the reason): postgresql
  # (the PostgreSQL queue tests start a throwaway server), ffmpeg (m4b books, aac, decoding streamed formats),
  # epubcheck (validates the narrated EPUBs; it brings Java), chromium and chromium-driver (the page's browser
  # test, tests/test_web_page.py), npm (axe-core, the accessibility checker that test runs in Chromium), pandoc
  # (EPUBs with a cover for the library's tests)
  missing=()
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
  command -v ffmpeg >/dev/null 2>&1 || missing+=(ffmpeg)
  command -v epubcheck >/dev/null 2>&1 || missing+=(epubcheck)
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  command -v pandoc >/dev/null 2>&1 || missing+=(pandoc)
  if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=600 install "${missing[@]}" >/dev/null 2>&1 \
      || { apt-get -q update >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=600 install "${missing[@]}" >/dev/null 2>&1; } \
      || echo "install.sh: apt-get install ${missing[*]} failed; their tests will skip"
  elif [ ${#missing[@]} -gt 0 ]; then
    echo "install.sh: ${missing[*]} missing; their tests will skip (sudo apt-get install ${missing[*]})"
  fi
  "${PIP[@]}" -c "$VENV/torch-pin.txt" -e ".[test]"
  # axe-core for the page's accessibility check, at the version tests/fixtures/axe/package-lock.json pins
  if command -v npm >/dev/null 2>&1; then
    (cd tests/fixtures/axe && npm ci --no-audit --no-fund --silent) \
      || echo "install.sh: npm ci in tests/fixtures/axe failed; the page's accessibility check will skip"
  fi
  # the official qwen-tts package, the oracle of the parity tests, in a venv of its own (it pins transformers)
  tests/fixtures/oracle_venv.sh || echo "install.sh: warning: building the test oracle failed (above); the oracle tests will skip" >&2
else
  "${PIP[@]}" -c "$VENV/torch-pin.txt" -e .
fi
if [ -n "$MODEL" ]; then  # the model was asked for: failing to set it up is an error
  SETUP_SYSTEMD=$SYSTEMD systemd/setup.sh install "$VENV" "$MODEL"
  if [ -d "$MODEL" ]; then  # device engines for this machine; the daemon falls back to torch without them
    "$VENV/bin/tts-appliance" build-engines --model "$MODEL" \
      || echo "install.sh: warning: build-engines failed; the daemon will use the torch codec" >&2
  fi
elif [ "$SYSTEMD" = 1 ]; then  # the venv works without it: warn only
  SETUP_SYSTEMD=1 systemd/setup.sh install "$VENV" || echo "install.sh: warning: systemd set-up failed (see above)" >&2
else
  echo "install.sh: systemd: skipped ($WHY)"
fi
echo "install.sh: done. Run: $VENV/bin/tts-appliance --help"
