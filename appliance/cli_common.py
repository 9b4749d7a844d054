"""What the command modules share: a command's configuration (the group's `--config` plus the command's
own flags, through `appliance.config.resolve`) and its settings (appliance.settings), the shared options
and `say`'s engine."""
from __future__ import annotations

import json
from typing import Optional

import click

from appliance.config import Config, ConfigError, resolve
from engines.names import AUTO, DTYPE_NAMES, DTYPE_SHORT


def config_path() -> Optional[str]:
    """The group's `--config PATH` ($TTS_APPLIANCE_CONFIG is read by appliance.config itself)."""
    ctx = click.get_current_context(silent=True)
    return ctx.find_root().params.get("config_path") if ctx else None


FLAG_KEYS = {"batch_size": ("jobs", "batch_size"), "lease_seconds": ("jobs", "lease_s"), "guard": ("jobs", "guard"),
             "quiet_seconds": ("jobs", "watch_quiet_s"), "poll": ("jobs", "watch_poll")}  # flag -> config key


def settings(**flags) -> Config:
    """The configuration of the running command: config file, drop-ins, environment, then `flags` by
    parameter name (model, device, dtype, home and those of FLAG_KEYS; None: not given). The one place a
    command's flags override the config."""
    plain = {k: flags.pop(k) for k in ("model", "device", "dtype", "home") if k in flags}
    keys: dict = {}
    for name, value in flags.items():
        sec, key = FLAG_KEYS[name]
        keys.setdefault(sec, {})[key] = value
    try:
        return resolve(config_path(), **plain, flags=keys)
    except ConfigError as exc:
        raise click.ClickException(f"config error: {exc}") from None


def run_settings(cfg: Optional[Config] = None, need_model: bool = False, **flags):
    """The configuration `cfg` (default: `settings(**flags)`) with every auto decided
    (appliance.settings.Settings): what a command that runs or describes engines works with.
    `need_model`: no model configured is a click error saying how to set one."""
    from appliance.settings import settings as decide

    cfg = cfg or settings(**flags)
    if need_model:
        try:
            cfg.require_model()
        except ConfigError as exc:  # says how to set one
            raise click.ClickException(str(exc)) from None
    try:
        return decide(cfg)
    except ConfigError as exc:
        raise click.ClickException(f"config error: {exc}") from None


def load_runner(cfg: Config, slots: int, usage_error: bool = False):
    """The engine of `cfg` behind an EngineRunner with `slots` slots in this process, for `say`
    (appliance.engine_host.load_runner; the job commands start theirs through appliance.compose); no model
    configured -> a click error."""
    from appliance.engine_host import load_runner as load

    try:  # room for a batch and for retries of its requests one by one
        return load(cfg, max_slots=slots, max_queue=max(2 * slots, cfg.runtime.max_queue))
    except ConfigError as exc:
        raise (click.UsageError if usage_error else click.ClickException)(str(exc)) from None


def model_options(f):
    """--model, --device, --dtype: override model.path, model.device, model.dtype of the config."""
    f = click.option("--dtype", type=click.Choice((AUTO, *DTYPE_NAMES)),
                     help="Weights dtype (default: model.dtype of the config: auto = bfloat16 on a GPU, float32 on the CPU).")(f)
    f = click.option("--device", help="cpu, cuda[:N], npu[:N] or auto (default: model.device of the config, "
                                      "auto).")(f)
    return click.option("--model", type=click.Path(), help="Folder of a Qwen3-TTS checkpoint (official layout; "
                        "default: model.path of the config, else $TTS_APPLIANCE_MODEL).")(f)


def home_option(f):
    return click.option("--home", type=click.Path(file_okay=False),
                        help="Spool folder with queue.db, audio/, output/, inbox/ (default: jobs.home of the config, "
                             "else $TTS_APPLIANCE_HOME, else ~/.local/share/tts-appliance).")(f)


def json_option(f):
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(f)


def emit(as_json: bool, data, text: str) -> None:
    click.echo(json.dumps(data, indent=2, default=str) if as_json else text)


def fail(msg: str):
    raise click.ClickException(msg)
