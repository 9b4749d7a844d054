#!/usr/bin/env bash
# systemd integration and model set-up of tts-appliance; called by install.sh (idempotent).
#   systemd/setup.sh install VENV [MODEL]     (SETUP_SYSTEMD=0 skips the units, only the model/config)
#   systemd/setup.sh uninstall VENV           removes units, links and the venv; keeps user data
# As root: system units in /etc/systemd/system, user tts-appliance (sysusers.d), spool
# /var/lib/tts-appliance (tmpfiles.d), config /etc/tts-appliance/config.yaml, /usr/local/bin/tts-appliance.
# Otherwise: user units in ~/.config/systemd/user, spool ~/.local/share/tts-appliance, config
# ~/.config/tts-appliance/config.yaml. TTS_APPLIANCE_SYSROOT puts system files under another root;
# TTS_APPLIANCE_INSTALL_MODE=system|user overrides the choice by uid.
set -euo pipefail
cd "$(dirname "$0")/.."
ACTION=${1:?install or uninstall} VENV=${2:?venv folder} MODEL=${3:-}
REPO=$(pwd)
VENV_ABS=$(cd "$VENV" 2>/dev/null && pwd || echo "$REPO/$VENV")
SYSROOT=${TTS_APPLIANCE_SYSROOT:-}
MODE=${TTS_APPLIANCE_INSTALL_MODE:-$([ "$(id -u)" = 0 ] && echo system || echo user)}
TINY="$REPO/tests/data/tiny/cv_small"
say() { echo "install.sh: $*"; }

if [ "$MODE" = system ]; then
  UNIT_DIR=$SYSROOT/etc/systemd/system CONF_DIR=$SYSROOT/etc/tts-appliance DATA=$SYSROOT/var/lib/tts-appliance
  BIN_LINK=$SYSROOT/usr/local/bin/tts-appliance
  SYSUSERS=$SYSROOT/etc/sysusers.d/tts-appliance.conf TMPFILES=$SYSROOT/etc/tmpfiles.d/tts-appliance.conf
  CTL=(systemctl)
else
  CFG_HOME=${XDG_CONFIG_HOME:-$HOME/.config}
  UNIT_DIR=$CFG_HOME/systemd/user CONF_DIR=$CFG_HOME/tts-appliance
  DATA=${TTS_APPLIANCE_HOME:-${XDG_DATA_HOME:-$HOME/.local/share}/tts-appliance}
  BIN_LINK="" SYSUSERS="" TMPFILES=""
  CTL=(systemctl --user)
fi
UNITS=(tts-appliance.service tts-appliance.socket tts-appliance@.service)
live_systemd() { [ -z "$SYSROOT" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; }

if [ "$ACTION" = uninstall ]; then
  if live_systemd; then "${CTL[@]}" disable --now tts-appliance.socket tts-appliance.service 2>/dev/null || true; fi
  for u in "${UNITS[@]}"; do rm -f "$UNIT_DIR/$u"; done
  [ -n "$SYSUSERS" ] && rm -f "$SYSUSERS" "$TMPFILES"
  if [ -n "$BIN_LINK" ] && [ -L "$BIN_LINK" ]; then rm -f "$BIN_LINK"; fi
  if live_systemd; then "${CTL[@]}" daemon-reload 2>/dev/null || true; fi
  rm -rf "$VENV"
  say "uninstalled units and $VENV; kept user data in $DATA (queue, outputs, voices) and config in $CONF_DIR"
  exit 0
fi

# -- model ------------------------------------------------------------------------------------------
mkdir -p "$DATA/models" "$CONF_DIR"
MODEL_PATH=""
if [ -n "$MODEL" ] && [ -d "$MODEL" ]; then
  [ -f "$MODEL/config.json" ] || { say "error: $MODEL has no config.json: not a Qwen3-TTS checkpoint folder" >&2; exit 1; }
  MODEL_PATH="$DATA/models/$(basename "$(cd "$MODEL" && pwd)")"
  ln -sfn "$(cd "$MODEL" && pwd)" "$MODEL_PATH"
  say "model: linked $MODEL_PATH -> $MODEL"
elif [ -n "$MODEL" ]; then
  MODEL_PATH="$DATA/models/${MODEL##*/}"
  if ! "$VENV/bin/python" -c "import huggingface_hub" 2>/dev/null; then
    say "error: $MODEL is not a local folder, and huggingface_hub is not installed to download it." >&2
    say "  either: $VENV/bin/pip install huggingface_hub && ./install.sh --model $MODEL" >&2
    say "  or download the checkpoint elsewhere and run ./install.sh --model /path/to/folder" >&2
    exit 1
  fi
  say "model: downloading $MODEL to $MODEL_PATH"
  if ! "$VENV/bin/python" -c "import sys; from huggingface_hub import snapshot_download; \
snapshot_download(repo_id=sys.argv[1], local_dir=sys.argv[2])" "$MODEL" "$MODEL_PATH"; then
    say "error: downloading $MODEL failed (no network, or the hub refused it); download it elsewhere and run" >&2
    say "  ./install.sh --model /path/to/folder" >&2
    exit 1
  fi
fi
# config: written when absent; --model updates model.path in place (every command and the daemon read it). Paths
# in it are those the service sees (without TTS_APPLIANCE_SYSROOT)
"$VENV/bin/python" - "$CONF_DIR/config.yaml" "$MODEL_PATH" "$TINY" "$DATA/models" "$MODE" "$SYSROOT" <<'PY'
import os, sys, yaml
conf, model, tiny, models, mode, sysroot = sys.argv[1:]
seen = lambda path: "/" + os.path.relpath(path, sysroot) if sysroot else path  # as the service sees it
cfg = (yaml.safe_load(open(conf)) or {}) if os.path.exists(conf) else {}
before = repr(cfg)
current = (cfg.get("model") or {}).get("path")
if not model and not current:
    if not os.path.isdir(tiny):
        sys.exit(print("install.sh: no model configured and the tiny test model is missing; use --model"))
    model = os.path.join(models, "tiny-test-RANDOM-WEIGHTS")
    if not os.path.lexists(model):
        os.symlink(tiny, model)
    print(f"install.sh: model: TINY TEST MODEL {seen(model)} (random weights: noise, not speech; "
          "pass --model ID|PATH for real speech)")
if model:
    cfg.setdefault("model", {})["path"] = seen(model)
# the service's spool folder in the file every command reads: a user's `info`, `preview` and reading commands then
# describe the service's queue, not a private one in their home
cfg.setdefault("jobs", {}).setdefault("home", seen(os.path.dirname(models)))
if mode == "system":
    # every user's CLI finds the daemon (and says so when it cannot reach it; with the service stopped, socket
    # activation starts it), and `info` names the folders the service uses: its sockets (RuntimeDirectory=) and
    # the codec engines build-engines makes for it (not root's ~/.cache)
    cfg.setdefault("http", {}).setdefault("socket", "/run/tts-appliance/api.sock")
    cfg.setdefault("service", {}).setdefault("runtime_dir", "/run/tts-appliance")
    cfg.setdefault("runtime", {}).setdefault("engine_cache", seen(os.path.join(os.path.dirname(models), "engines")))
if repr(cfg) != before or not os.path.exists(conf):  # its values are kept, its comments not: own settings go to config.d/
    with open(conf, "w") as f:
        f.write("# written by install.sh (own settings: config.d/*.yaml); all keys with comments: configs/default.yaml\n")
        yaml.safe_dump(cfg, f, sort_keys=False)
    print(f"install.sh: config: {conf} (model.path = {cfg['model']['path']})")
PY
# the config may hold secrets (jobs.queue's database password): readable by the service, not by everyone
CONF_MODE=$([ "$MODE" = system ] && echo 0640 || echo 0600)
[ -f "$CONF_DIR/config.yaml" ] && chmod "$CONF_MODE" "$CONF_DIR/config.yaml"
# the codec engines for this machine, where the daemon reading that config looks (runtime.engine_cache; under
# TTS_APPLIANCE_SYSROOT inside it); the daemon falls back to the torch codec without them
if [ "${SETUP_BUILD:-0}" = 1 ] && [ -n "$MODEL_PATH" ]; then
  ENGINES=()
  [ "$MODE" = system ] && ENGINES=(env "TTS_APPLIANCE_RUNTIME__ENGINE_CACHE=$DATA/engines")
  ${ENGINES[@]+"${ENGINES[@]}"} "$VENV/bin/tts-appliance" --config "$CONF_DIR/config.yaml" build-engines --model "$MODEL_PATH" \
    || say "warning: build-engines failed; the daemon will use the torch codec" >&2
fi
[ "${SETUP_SYSTEMD:-1}" = 1 ] || exit 0

# -- units ------------------------------------------------------------------------------------------
mkdir -p "$UNIT_DIR"
if [ "$MODE" = system ]; then
  for u in "${UNITS[@]}"; do install -m 0644 "systemd/$u" "$UNIT_DIR/$u"; done
  mkdir -p "$(dirname "$SYSUSERS")" "$(dirname "$TMPFILES")" "$(dirname "$BIN_LINK")"
  install -m 0644 systemd/sysusers.d/tts-appliance.conf "$SYSUSERS"
  install -m 0644 systemd/tmpfiles.d/tts-appliance.conf "$TMPFILES"
  ln -sfn "$VENV_ABS/bin/tts-appliance" "$BIN_LINK"
  case "$VENV_ABS/" in /tmp/*|/var/tmp/*)
    say "warning: the venv is under $(echo "$VENV_ABS" | cut -d/ -f1-2)/: the service (PrivateTmp=yes) cannot see it;" \
        "install from a folder outside /tmp and /var/tmp (e.g. /opt/tts-appliance)" ;;
  esac
  if [ -z "$SYSROOT" ] && command -v systemd-sysusers >/dev/null 2>&1; then
    # the spool folders (models and engines included) get their owner and mode from tmpfiles.d; nothing else in
    # the spool is touched (a file someone else put there keeps its owner); the engine cache build-engines just
    # filled as root is the service's to use and add to
    systemd-sysusers "$SYSUSERS" && systemd-tmpfiles --create "$TMPFILES" || say "warning: sysusers/tmpfiles failed"
    [ ! -d "$DATA/engines" ] || chown -R tts-appliance:tts-appliance "$DATA/engines" 2>/dev/null \
      || say "warning: could not give $DATA/engines to user tts-appliance"
    chown root:tts-appliance "$CONF_DIR/config.yaml" 2>/dev/null || say "warning: could not give $CONF_DIR/config.yaml to group tts-appliance"
  else
    say "note: systemd-sysusers not available here; create user tts-appliance and $DATA yourself," \
        "and give $CONF_DIR/config.yaml to its group (chown root:tts-appliance)"
  fi
else  # user units: same daemon, no system hardening (the block from '# Hardening' to the next blank line)
      # and no user switching, sockets in $XDG_RUNTIME_DIR
  sed -e '/^\(User\|Group\|SupplementaryGroups\|StateDirectory\|StateDirectoryMode\|ConfigurationDirectory\)=/d' \
      -e '/^# Hardening/,/^$/d' \
      -e "s|^Environment=TTS_APPLIANCE_HOME=.*|Environment=TTS_APPLIANCE_HOME=$DATA|" \
      -e "s|^ExecStart=/usr/local/bin/tts-appliance daemon|ExecStart=$VENV_ABS/bin/tts-appliance daemon --config $CONF_DIR/config.yaml|" \
      -e "s|^ExecReload=/usr/local/bin/tts-appliance daemon|ExecReload=$VENV_ABS/bin/tts-appliance daemon --config $CONF_DIR/config.yaml|" \
      -e 's|^WantedBy=multi-user.target|WantedBy=default.target|' systemd/tts-appliance.service > "$UNIT_DIR/tts-appliance.service"
  sed -e '/^Socket\(User\|Group\)=/d' -e 's|^ListenStream=/run/tts-appliance/|ListenStream=%t/tts-appliance/|' \
      systemd/tts-appliance.socket > "$UNIT_DIR/tts-appliance.socket"
fi
# -- a running service (an upgrade) ------------------------------------------------------------------------
running=""
if live_systemd; then
  "${CTL[@]}" daemon-reload 2>/dev/null || say "note: could not reload systemd (${CTL[*]})"
  running=$("${CTL[@]}" list-units --plain --no-legend --state=active,activating,reloading \
            tts-appliance.service 'tts-appliance@*.service' 2>/dev/null | awk '{printf "%s%s", sep, $1; sep=" "}')
fi
if [ -n "$running" ] && [ "${SETUP_RESTART:-1}" = 1 ]; then
  # it still runs the code it started with (its engine processes would start from the new one): restarted, as a
  # stop lets its in-flight segments finish
  say "upgrade: restarting $running so that it runs this version (in-flight segments finish first)"
  # shellcheck disable=SC2086 - one word per unit
  if ! "${CTL[@]}" restart $running; then
    say "error: $running did not start again after the upgrade; why: journalctl${CTL[1]:+ ${CTL[1]}} -u tts-appliance -p err -b" >&2
    exit 1
  fi
  say "upgrade: $running restarted and ready"
elif [ -n "$running" ]; then
  say "upgrade: $running still runs the version it started with (--no-restart); to run this one:" \
      "${CTL[*]} restart $running"
elif live_systemd && "${CTL[@]}" is-enabled --quiet tts-appliance.socket 2>/dev/null; then
  say "units updated in $UNIT_DIR; the service is enabled, not running now: its socket or the next boot starts it"
else
  say "units installed in $UNIT_DIR; start with: ${CTL[*]} enable --now tts-appliance.socket tts-appliance.service"
fi
