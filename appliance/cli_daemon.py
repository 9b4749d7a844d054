"""`tts-appliance daemon` command."""
from __future__ import annotations

import json
import sys

import click

from appliance.cli_common import config_path as group_config_path


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="Config file (as the group's --config; default $TTS_APPLIANCE_CONFIG, the user's "
                   "~/.config/tts-appliance/config.yaml, /etc/tts-appliance/config.yaml); its config.d/*.yaml "
                   "are read too.")
@click.option("--instance", help="Accelerator/device index (the instance of tts-appliance@.service).")
@click.option("--check", is_flag=True, help="Validate the configuration and exit.")
@click.option("--print-config", is_flag=True, help="Print the effective configuration as JSON and exit.")
def daemon(config_path, instance, check, print_config):
    """Serve streaming speech (HTTP over a Unix socket, Wyoming), the job queue and the inbox.

    Works the same under systemd (Type=notify, watchdog, socket activation) and by hand.
    SIGTERM stops cleanly, SIGHUP reloads the configuration.
    """
    from appliance.config import ConfigError, as_dict, resolve
    from appliance.logs import error_line

    try:
        from appliance.daemon import main as daemon_main
    except Exception as exc:  # noqa: BLE001 - a broken installation: one line (priority err), not a traceback
        error_line(f"error: the daemon's code does not load ({type(exc).__name__}: {exc}); reinstall (./install.sh)")
        sys.exit(1)

    path = config_path or group_config_path()
    if print_config:
        try:
            cfg = resolve(path)
            out = as_dict(cfg)
            if cfg.model.path:  # what "auto" stands for on this machine
                from appliance.settings import settings
                from engines.load import settings as engine_settings

                engines = [engine_settings(spec) for spec in settings(cfg).engines]
                out["resolved"] = engines[0]
                if len(engines) > 1:  # model.device names several devices: one engine each
                    out["resolved_engines"] = engines
            click.echo(json.dumps(out, indent=2, default=str))
        except ConfigError as exc:
            raise click.ClickException(f"config error: {exc}")
        return
    sys.exit(daemon_main(path, instance, check_only=check))
