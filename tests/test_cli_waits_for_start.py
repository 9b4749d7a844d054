"""A CLI call on a stopped, socket-activated service: systemd holds the socket, the call starts the daemon,
and the CLI waits for it (saying so) instead of giving up after a few seconds with "timed out".

Socket activation as systemd does it: the test holds the listening socket (the call is queued in its
backlog) and hands it to the daemon as fd 3 with LISTEN_FDS/LISTEN_PID once the CLI says it waits; the
live systemd test (tests/test_systemd_live.py) does the same under a real systemd.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import yaml

from daemon_util import ROOT, Daemon, base_config, needs_daemon

pytestmark = needs_daemon


def test_the_cli_waits_for_a_daemon_that_is_starting(tmp_path):
    cfg = base_config(tmp_path, jobs={"enabled": False, "watch": False}, wyoming={"enabled": False})
    d = Daemon(tmp_path, cfg)
    cfg["http"]["socket"] = d.socket  # as install.sh configures it: every user's CLI finds the service
    cli_cfg = tmp_path / "cli.yaml"
    cli_cfg.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(d.socket)
    listener.listen(16)

    def put_on_fd3():
        os.dup2(listener.fileno(), 3)
        os.set_inheritable(3, True)

    def wrap(argv):  # LISTEN_PID must be the daemon's own pid: set it in the shell that execs it
        return ["/bin/sh", "-c", 'LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=api exec "$@"', "sh", *argv]

    cli = subprocess.Popen([sys.executable, "-m", "appliance.cli", "--config", str(cli_cfg), "list", "--json"],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={k: v for k, v in os.environ.items() if k != "TTS_APPLIANCE_SOCKET"})
    said = threading.Event()
    err: list[str] = []

    def read_stderr():
        for line in cli.stderr:
            err.append(line)
            if "has not answered yet" in line:
                said.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        # the CLI waits past its first few seconds and says so; only then does the "service" start
        deadline = time.monotonic() + 180
        while not said.is_set() and reader.is_alive() and time.monotonic() < deadline:
            said.wait(0.5)  # (the reader ends when the CLI does: it gave up)
        assert said.is_set(), f"the CLI never said it waits (exit {cli.poll()}): {''.join(err)}"
        d.start(wait=False, wrap=wrap, preexec_fn=put_on_fd3, pass_fds=(3,))
        out, _ = cli.communicate(timeout=300)
        reader.join(10)
        assert cli.returncode == 0, "".join(err) + out + d.log_text()[-2000:]
        assert out.strip().startswith("["), out  # the daemon's job list (empty), not an error
        assert "it is starting" in "".join(err) and "timed out" not in "".join(err)
    finally:
        if cli.poll() is None:
            cli.kill()
        d.stop()
        listener.close()
