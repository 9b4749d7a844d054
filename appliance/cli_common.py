"""What the command modules share: a command's settings (the group's `--config` plus the command's
own flags, through `appliance.config.resolve`), the shared options and the engine for in-process work."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import click

from appliance.config import Config, ConfigError, resolve
from engines.names import AUTO, DTYPE_NAMES, DTYPE_SHORT


def config_path() -> Optional[str]:
    """The group's `--config PATH` ($TTS_APPLIANCE_CONFIG is read by appliance.config itself)."""
    ctx = click.get_current_context(silent=True)
    return ctx.find_root().params.get("config_path") if ctx else None


def settings(**flags) -> Config:
    """The settings of the running command: config file, drop-ins, environment, then `flags`
    (model, device, dtype, home; None: not given)."""
    try:
        return resolve(config_path(), **flags)
    except ConfigError as exc:
        raise click.ClickException(f"config error: {exc}") from None


def load_runner(cfg: Config, slots: int, usage_error: bool = False):
    """The engine of `cfg` behind an EngineRunner with `slots` slots, for work in this process
    (appliance.engine_host.load_runner); no model configured -> a click error."""
    from appliance.engine_host import load_runner as load

    try:  # room for a batch and for retries of its requests one by one
        return load(cfg, max_slots=slots, max_queue=max(2 * slots, cfg.runtime.max_queue))
    except ConfigError as exc:
        raise (click.UsageError if usage_error else click.ClickException)(str(exc)) from None


def known_voices(cfg: Config, model_type: Optional[str], speakers: list) -> Optional[list]:
    """The voices a job may name with the configured checkpoint, from its (`model_type`, `speakers`) as
    jobs.submit.checkpoint_voices reads them: CustomVoice speakers, a Base checkpoint's saved voices;
    None when they are not known (no checkpoint, or the worker checks voices when it loads the model)."""
    from engines.engine import VOICE_SUFFIX

    if model_type == "custom_voice":
        return sorted(speakers)
    vdir = Path(cfg.model.voices_dir or cfg.home().home / "voices")
    if model_type == "base" and vdir.is_dir():
        return sorted(p.name[: -len(VOICE_SUFFIX)] for p in vdir.glob(f"*{VOICE_SUFFIX}"))
    return None


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
