"""install.sh decides what it touches: a normal user's plain `./install.sh` sets up the venv only (no
systemd units, no files outside the checkout), `sudo ./install.sh` installs the service; `--dry-run`
prints those decisions and changes nothing."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def dry_run(tmp_path, *args, mode=None) -> str:
    """install.sh --dry-run ARGS with a venv path in tmp_path (`mode`: system/user, else by this uid)."""
    env = {**os.environ, "TTS_APPLIANCE_VENV": str(tmp_path / "venv"), "HOME": str(tmp_path / "home")}
    env.pop("TTS_APPLIANCE_INSTALL_MODE", None)
    if mode:
        env["TTS_APPLIANCE_INSTALL_MODE"] = mode
    r = subprocess.run([str(ROOT / "install.sh"), "--dry-run", *args], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (tmp_path / "venv").exists() and not (tmp_path / "home").exists()  # nothing changed
    return r.stdout


@pytest.mark.parametrize("mode,args,systemd", [
    ("user", [], "systemd: skipped (not root: the venv only; sudo ./install.sh installs the service)"),
    ("system", [], "systemd: the service (system units, user tts-appliance"),
    ("system", ["--dev"], "systemd: skipped (--dev)"),
    ("system", ["--no-systemd"], "systemd: skipped (--no-systemd)"),
    ("user", ["--systemd"], "systemd: user units in ~/.config/systemd/user"),
])
def test_what_install_sh_would_touch(tmp_path, mode, args, systemd):
    out = dry_run(tmp_path, *args, mode=mode)
    assert f"venv {tmp_path / 'venv'}: new" in out and systemd in out, out


def test_without_a_mode_the_uid_decides(tmp_path):
    out = dry_run(tmp_path)
    root = os.geteuid() == 0
    assert ("systemd: the service" in out) == root and ("not root: the venv only" in out) == (not root), out
