"""Settings of every command and the daemon: YAML files + environment + command line, validated
into dataclasses. `resolve()` is the one entry point.

Sources, later ones win (section by section, key by key):

1. the dataclass defaults (appliance.config_keys; the shipped `configs/default.yaml` repeats them with comments)
2. the main config file: `--config PATH`, else `$TTS_APPLIANCE_CONFIG`, else the user's
   `~/.config/tts-appliance/config.yaml` (`$XDG_CONFIG_HOME`) when it exists, else
   `/etc/tts-appliance/config.yaml`
3. every `config.d/*.yaml` next to that file, in name order (drop-ins)
4. environment variables `TTS_APPLIANCE_<SECTION>__<KEY>=value` (value parsed as YAML, so
   `TTS_APPLIANCE_HTTP__TCP=true` is a bool), plus the older `TTS_APPLIANCE_MODEL` and
   `TTS_APPLIANCE_HOME` as fallbacks for `model.path` and `jobs.home`
5. command-line flags (`--model`, `--device`, `--dtype`, `--home`, the job commands' worker and inbox
   flags) given to `resolve()`

What the result stands for on this machine (every `auto`) is decided by `appliance.settings`.

What the configuration holds (sections, keys, defaults) is `appliance.config_keys`; every source is checked by
`appliance.config_check.merge`: unknown sections or keys and wrongly typed values raise `ConfigError` naming the
source, the key and the valid choices.
"""
from __future__ import annotations

import os
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Optional

import yaml

from appliance.config_check import choices, merge  # noqa: F401 - choices: the config's API
from appliance.config_keys import ENV_PREFIX, SECTIONS, SYSTEM_CONFIG, Config, ConfigError  # noqa: F401 - as above

CONFIG_ENV = ENV_PREFIX + "CONFIG"
SHIPPED_DEFAULTS = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"


def _read_yaml(path: Path):
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    except PermissionError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}{_group_hint(path)}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None


def _group_hint(path: Path) -> str:
    """What to do about a config file this user may not read: the service's file is for its group."""
    import grp
    import stat

    try:
        st = path.stat()
        group = grp.getgrgid(st.st_gid).gr_name
    except (OSError, KeyError):
        return ""
    if not st.st_mode & stat.S_IRGRP or group == "root":
        return f" (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}: ask its administrator)"
    return (f". It is readable by group {group!r} (the service's users): sudo usermod -aG {group} $USER, "
            "then log in again")


def env_overrides(environ) -> dict:
    """`TTS_APPLIANCE_<SECTION>__<KEY>` variables as a nested mapping (values parsed as YAML)."""
    out: dict = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        sec, _, key = name[len(ENV_PREFIX):].lower().partition("__")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        out.setdefault(sec, {})[key] = value
    return out


def user_config(environ=None) -> Path:
    """The user's config file: $XDG_CONFIG_HOME/tts-appliance/config.yaml (default ~/.config/...)."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "tts-appliance" / "config.yaml"


def config_file(path: Optional[str | os.PathLike] = None, environ=None) -> tuple[Path, bool]:
    """The main config file and whether it was named (`path` or $TTS_APPLIANCE_CONFIG): a named file
    must exist; else the user's file when it exists, else /etc/tts-appliance/config.yaml (optional)."""
    environ = os.environ if environ is None else environ
    named = path or environ.get(CONFIG_ENV)
    if named:
        return Path(named).expanduser(), True
    user = user_config(environ)
    return (user if user.is_file() else SYSTEM_CONFIG), False


def load_config(path: Optional[str | os.PathLike] = None, environ=None) -> Config:
    """Read and validate files and environment (see the module docstring for the order)."""
    environ = os.environ if environ is None else environ
    cfg = Config()
    if SHIPPED_DEFAULTS.is_file():
        merge(cfg, _read_yaml(SHIPPED_DEFAULTS), str(SHIPPED_DEFAULTS))
    main, named = config_file(path, environ)
    if named and not main.is_file():
        raise ConfigError(f"{main}: no such config file")
    files = ([main] if main.is_file() else []) + sorted((main.parent / "config.d").glob("*.yaml"))
    for f in files:
        merge(cfg, _read_yaml(f), str(f))
        cfg.sources.append(str(f))
    if not cfg.model.path and environ.get(ENV_PREFIX + "MODEL"):
        cfg.model.path = environ[ENV_PREFIX + "MODEL"]
    if not cfg.jobs.home and environ.get(ENV_PREFIX + "HOME"):
        cfg.jobs.home = environ[ENV_PREFIX + "HOME"]
    return merge(cfg, env_overrides(environ), "environment")


def resolve(config_path: Optional[str | os.PathLike] = None, *, model=None, device: Optional[str] = None,
            dtype: Optional[str] = None, home=None, flags: Optional[dict] = None, environ=None) -> Config:
    """The configuration every command and the daemon run with: `load_config` (files, drop-ins,
    environment), then the command line's flags on top (None: not given), validated the same way:
    `model`, `device`, `dtype`, `home`, and `flags` {section: {key: value}} for the other keys a
    command takes a flag for."""
    cfg = load_config(config_path, environ)
    given = {"model": {"path": model, "device": device, "dtype": dtype}, "jobs": {"home": home}}
    for sec, keys in (flags or {}).items():
        given.setdefault(sec, {}).update(keys)
    given = {sec: {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in keys.items() if v is not None}
             for sec, keys in given.items()}
    return merge(cfg, {sec: keys for sec, keys in given.items() if keys}, "command line")


def as_dict(cfg: Config) -> dict:
    """The effective configuration as plain data (for `daemon --print-config`)."""
    from jobs.queue.location import parse_location, redact

    out = {name: {f.name: getattr(getattr(cfg, name), f.name) for f in fields(getattr(cfg, name))}
           for name in SECTIONS if is_dataclass(getattr(cfg, name))}
    if cfg.jobs.queue:
        out["jobs"]["queue"] = redact(str(parse_location(cfg.jobs.queue)))  # the database password is not shown
    if cfg.http.api_key:
        out["http"]["api_key"] = "(set)"  # nor the API key
    return out
