#!/usr/bin/env bash
# Install tts-appliance into a virtual environment (idempotent: re-running updates it in place).
#   ./install.sh              as a normal user: the venv only (torch's CPU build, or its CUDA build when an NVIDIA
#                             GPU is present); nothing outside this folder is touched
#   sudo ./install.sh         the service: the venv plus the systemd units, service user and spool folders
#                             (see systemd/); without --model the TINY TEST MODEL (random weights, noise).
#                             Over an existing install (an upgrade) it restarts the running service
#   ./install.sh --dev        also install the test tools (no systemd set-up unless --systemd is given): the
#                             test extras, the test oracle (.venv-oracle: tests/fixtures/oracle_venv.sh), Ace by
#                             DAISY (.ace: tests/fixtures/ace_install.sh, with npm), axe-core (npm,
#                             tests/fixtures/axe) and, as root, Debian's postgresql, ffmpeg, flac, epubcheck,
#                             chromium, npm, pandoc and calibre
#   --model ID|PATH           use this checkpoint: a local folder is linked, a hub ID is downloaded when
#                             huggingface_hub is installed and the network allows (else: a clear message)
#   --no-systemd / --systemd  skip / force the systemd part (as root: system units, user tts-appliance,
#                             /var/lib/tts-appliance; otherwise user units in ~/.config/systemd/user)
#   --no-restart              an upgrade leaves the running service alone (it says how to restart it)
#   --dry-run                 print what would be done, change nothing
#   --uninstall               remove the units and the venv; keeps user data (queue, outputs, voices, config)
# Environment: TTS_APPLIANCE_VENV (default ./.venv), PYTHON (default python3),
#              TORCH_SPEC (default torch==2.13.0), TORCH_INDEX_URL (extra pip index for torch wheels),
#              TORCH_CPU_INDEX (torch's CPU wheels, used without an NVIDIA GPU; default
#              https://download.pytorch.org/whl/cpu), TTS_APPLIANCE_ACCELERATOR=nvidia|ascend|cpu (default: detected),
#              TTS_APPLIANCE_SYSROOT (install system files under this root instead of /, for packaging),
#              TTS_APPLIANCE_INSTALL_MODE=system|user (default: system as root, else user).
set -euo pipefail
cd "$(dirname "$0")"
VENV=${TTS_APPLIANCE_VENV:-.venv}
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
DEV=0 SYSTEMD=auto MODEL="" UNINSTALL=0 DRY=0 RESTART=1
while [ $# -gt 0 ]; do
  case "$1" in
    --dev) DEV=1 ;;
    --systemd) SYSTEMD=1 ;;
    --no-systemd) SYSTEMD=0 ;;
    --model) [ $# -ge 2 ] || { echo "install.sh: --model needs an ID or a PATH" >&2; exit 2; }; MODEL=$2; shift ;;
    --model=*) MODEL=${1#--model=} ;;
    --uninstall) UNINSTALL=1 ;;
    --no-restart) RESTART=0 ;;
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
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
# the accelerator decides which torch build the venv gets
if [ -n "${TTS_APPLIANCE_ACCELERATOR:-}" ]; then ACCEL=$TTS_APPLIANCE_ACCELERATOR
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then ACCEL=nvidia
elif [ -e /dev/davinci0 ] || command -v npu-smi >/dev/null 2>&1; then ACCEL=ascend
else ACCEL=cpu
fi
has_torch() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; }
# Where torch comes from, when the venv has none: TORCH_PIP (pip's extra arguments) and TORCH_FROM (the line that
# says so). Without an NVIDIA GPU, torch's CPU build from its own index (PyPI's Linux x86_64 torch is the CUDA build:
# about 4.8 GB with its nvidia wheels and Triton, none of which a machine without an NVIDIA GPU can use).
torch_source() {
  TORCH_PIP=()
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    TORCH_PIP=(--extra-index-url "$TORCH_INDEX_URL") TORCH_FROM="$TORCH_SPEC, also from $TORCH_INDEX_URL (TORCH_INDEX_URL)"
  elif [ "$ACCEL" != cpu ]; then
    TORCH_FROM="$TORCH_SPEC from pip's index (the build for the $ACCEL accelerator)"
  elif why=$(index_unreachable "$TORCH_CPU_INDEX"); then
    TORCH_FROM="$TORCH_SPEC from pip's index: torch's CPU index $TORCH_CPU_INDEX cannot be reached ($why). Unless \
pip finds a CPU wheel (its --find-links), Linux x86_64 gets the CUDA build there: about 4.8 GB in the venv (15 \
nvidia wheels, Triton) that this machine cannot use. To avoid it: TORCH_CPU_INDEX=URL-of-a-mirror ./install.sh"
  else
    TORCH_PIP=(--extra-index-url "$TORCH_CPU_INDEX") TORCH_FROM="$TORCH_SPEC, the CPU build from $TORCH_CPU_INDEX (no NVIDIA GPU here)"
  fi
}
# prints why the simple index URL $1 cannot be reached and succeeds; fails (prints nothing) when it can
index_unreachable() {
  "$PY" - "$1" <<'PY'
import os, sys, urllib.parse, urllib.request
url = sys.argv[1].rstrip("/") + "/torch/"
if url.startswith("file:"):  # a local mirror of the index
    if os.path.isdir(urllib.request.url2pathname(urllib.parse.urlparse(url).path)):
        sys.exit(1)
    sys.exit(print("no such folder"))
try:
    urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10).close()
except Exception as exc:  # noqa: BLE001 - DNS, refused, timeout, HTTP error: all mean "not from here"
    print(getattr(exc, "reason", None) or exc)
    sys.exit(0)
sys.exit(1)
PY
}
# the venv's size and torch build, and a note when the CUDA build sits on a machine without an NVIDIA GPU
venv_report() {
  local kb torch cuda nv
  kb=$({ du -sk "$VENV" 2>/dev/null || true; } | cut -f1)
  read -r torch cuda < <("$VENV/bin/python" -c "import torch; print(torch.__version__, torch.version.cuda or '-')" 2>/dev/null || echo "- -")
  echo "$1venv $VENV: $(awk -v k="${kb:-0}" 'BEGIN { if (k >= 1048576) printf "%.1f GB", k / 1048576; else printf "%d MB", k / 1024 }'), torch $torch ($([ "$cuda" = - ] && echo "the CPU build" || echo "the CUDA $cuda build"))"
  if [ "$ACCEL" = cpu ] && [ "$torch" != - ] && [ "$cuda" != - ]; then
    nv=$({ du -sck "$VENV"/lib/python3*/site-packages/{nvidia,triton} 2>/dev/null || true; } | tail -1 | cut -f1)
    echo "$1note: this machine has no NVIDIA GPU, yet torch is the CUDA build ($(awk -v k="${nv:-0}" 'BEGIN { printf "%.1f GB", k / 1048576 }') of nvidia wheels and Triton unused); for the CPU build: rm -rf $VENV && ./install.sh"
  fi
}
if [ "$DRY" = 1 ]; then  # the decisions above, and what they would change
  say() { echo "install.sh --dry-run: $*"; }
  if [ "$UNINSTALL" = 1 ]; then say "would remove the units and $VENV (systemd/setup.sh uninstall)"; exit 0; fi
  say "venv $VENV: $([ -x "$VENV/bin/python" ] && echo "exists, updated in place" || echo "new ($PY -m venv)"), $TORCH_SPEC when torch is missing, the package$([ "$DEV" = 1 ] && echo " with the test tools; the test oracle in .venv-oracle" || true)"
  say "accelerator: $ACCEL"
  if has_torch; then venv_report "install.sh --dry-run: "; else torch_source; say "torch: $TORCH_FROM"; fi
  [ -z "$MODEL" ] || say "model: $MODEL, in the $TTS_APPLIANCE_INSTALL_MODE config (systemd/setup.sh)"
  if [ "$SYSTEMD" = 0 ]; then say "systemd: skipped ($WHY)"
  elif [ "$TTS_APPLIANCE_INSTALL_MODE" = system ]; then
    say "systemd: the service (system units, user tts-appliance, /var/lib/tts-appliance, /etc/tts-appliance);" \
        "a running service is $([ "$RESTART" = 1 ] && echo "restarted" || echo "left running (--no-restart)")"
  else say "systemd: user units in ~/.config/systemd/user"
  fi
  exit 0
fi
if [ "$UNINSTALL" = 1 ]; then
  exec "$(dirname "$0")/systemd/setup.sh" uninstall "$VENV"
fi
echo "install.sh: accelerator: $ACCEL"

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
if ! has_torch; then
  torch_source
  echo "install.sh: torch: $TORCH_FROM"
  # numpy with it: torch warns at every import until numpy is there
  "${PIP[@]}" ${TORCH_PIP[@]+"${TORCH_PIP[@]}"} "$TORCH_SPEC" numpy
fi
"$VENV/bin/python" -c "import numpy" >/dev/null 2>&1 || "${PIP[@]}" numpy
# keep the installed torch: the constraint stops pip from swapping it for another build
"$VENV/bin/python" -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > "$VENV/torch-pin.txt"
if [ "$DEV" = 1 ]; then
  # Debian packages the tests use (best effort: without them their tests skip with the reason): postgresql
  # (the PostgreSQL queue tests start a throwaway server), ffmpeg (m4b books, aac, decoding streamed formats),
  # flac (the reference decoder tests the FLAC books spliced from their chapters' frames),
  # epubcheck (validates the narrated EPUBs; it brings Java), chromium and chromium-driver (the page's browser
  # test, tests/test_web_page.py; Ace by DAISY and axe-core run in it), npm (installs Ace by DAISY and axe-core,
  # below), pandoc and calibre (books converted by them: tests/test_ingest_converted.py; EPUBs with a cover
  # for the library's tests)
  missing=()
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
  command -v ffmpeg >/dev/null 2>&1 || missing+=(ffmpeg)
  command -v flac >/dev/null 2>&1 || missing+=(flac)
  command -v epubcheck >/dev/null 2>&1 || missing+=(epubcheck)
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  command -v pandoc >/dev/null 2>&1 || missing+=(pandoc)
  command -v ebook-convert >/dev/null 2>&1 || missing+=(calibre)
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
  # Ace by DAISY (the narrated EPUBs' accessibility check) from the npm registry into .ace/ (ignored by git)
  tests/fixtures/ace_install.sh || echo "install.sh: warning: installing Ace by DAISY failed (above); the Ace tests will skip" >&2
else
  "${PIP[@]}" -c "$VENV/torch-pin.txt" -e .
fi
venv_report "install.sh: "
# systemd/setup.sh: the model in the config, the codec engines built where the daemon that reads it looks
# (SETUP_BUILD), the units; an upgrade restarts the running service unless --no-restart (SETUP_RESTART)
export SETUP_RESTART=$RESTART
if [ -n "$MODEL" ]; then  # the model was asked for: failing to set it up is an error
  SETUP_SYSTEMD=$SYSTEMD SETUP_BUILD=1 systemd/setup.sh install "$VENV" "$MODEL"
elif [ "$SYSTEMD" = 1 ]; then  # the venv works without it: warn only
  SETUP_SYSTEMD=1 systemd/setup.sh install "$VENV" || echo "install.sh: warning: systemd set-up failed (see above)" >&2
else
  echo "install.sh: systemd: skipped ($WHY)"
fi
echo "install.sh: done. Run: $VENV/bin/tts-appliance --help"
