"""`tts-appliance daemon` command (registered by `appliance.cli._register_extras`)."""
from __future__ import annotations

import json
import sys

import click


def register(cli_group: click.Group) -> None:
    """Add the `daemon` command to `cli_group`."""

    @cli_group.command()
    @click.option("--config", "config_path", type=click.Path(dir_okay=False),
                  help="Config file instead of /etc/tts-appliance/config.yaml (its config.d/*.yaml are read too).")
    @click.option("--instance", help="Accelerator/device index (the instance of tts-appliance@.service).")
    @click.option("--check", is_flag=True, help="Validate the configuration and exit.")
    @click.option("--print-config", is_flag=True, help="Print the effective configuration as JSON and exit.")
    def daemon(config_path, instance, check, print_config):
        """Serve streaming speech (HTTP over a Unix socket, Wyoming), the job queue and the inbox.

        Works the same under systemd (Type=notify, watchdog, socket activation) and by hand.
        SIGTERM stops cleanly, SIGHUP reloads the configuration.
        """
        from appliance.config import ConfigError, as_dict, load_config
        from appliance.daemon import main as daemon_main

        if print_config:
            try:
                click.echo(json.dumps(as_dict(load_config(config_path)), indent=2))
            except ConfigError as exc:
                raise click.ClickException(f"config error: {exc}")
            return
        sys.exit(daemon_main(config_path, instance, check_only=check))
