"""install.sh decides what it touches: a normal user's plain `./install.sh` sets up the venv only (no
systemd units, no files outside the checkout), `sudo ./install.sh` installs the service; `--dry-run`
prints those decisions and changes nothing. Without an NVIDIA GPU torch is the CPU build, from torch's CPU
index (a local index stands in for it here: no gigabytes are downloaded), or a line says why not and what the
other build costs; the venv's size and torch build are said."""
from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def dry_run(tmp_path, *args, mode=None, env=None, new=True) -> str:
    """install.sh --dry-run ARGS with a venv path in tmp_path (`mode`: system/user, else by this uid; `new`: no
    venv there yet)."""
    env = {**os.environ, "TTS_APPLIANCE_VENV": str(tmp_path / "venv"), "HOME": str(tmp_path / "home"), **(env or {})}
    env.pop("TTS_APPLIANCE_INSTALL_MODE", None)
    if mode:
        env["TTS_APPLIANCE_INSTALL_MODE"] = mode
    r = subprocess.run([str(ROOT / "install.sh"), "--dry-run", *args], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (tmp_path / "venv").exists() or not new
    assert not (tmp_path / "home").exists()  # nothing changed
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


def torch_line(tmp_path, accelerator, **env) -> str:
    """The `torch:` decision of a dry run on a new venv, on a machine with `accelerator`."""
    out = dry_run(tmp_path, mode="user", env={"TTS_APPLIANCE_ACCELERATOR": accelerator, **env})
    return next(line for line in out.splitlines() if line.startswith("install.sh --dry-run: torch: "))


def test_without_an_nvidia_gpu_torch_is_the_cpu_build_from_its_index(tmp_path):
    index = tmp_path / "index"
    (index / "torch").mkdir(parents=True)  # a simple index with a torch page, as download.pytorch.org/whl/cpu
    (index / "torch" / "index.html").write_text("<a href='torch-2.13.0+cpu.whl'>torch</a>\n")
    url = index.as_uri()  # (a local mirror: pip takes file: indexes too)
    line = torch_line(tmp_path, "cpu", TORCH_CPU_INDEX=url)
    assert f"the CPU build from {url}" in line, line
    line = torch_line(tmp_path, "cpu", TORCH_CPU_INDEX=(tmp_path / "elsewhere").as_uri())
    assert "cannot be reached (no such folder)" in line, line


def test_an_unreachable_cpu_index_is_said_with_what_it_costs(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/whl/cpu"
    line = torch_line(tmp_path, "cpu", TORCH_CPU_INDEX=url)
    assert f"torch's CPU index {url} cannot be reached" in line and "4.8 GB" in line, line
    assert "TORCH_CPU_INDEX=" in line, line  # and what to do about it


def test_an_nvidia_gpu_gets_the_build_from_pips_index(tmp_path):
    line = torch_line(tmp_path, "nvidia", TORCH_CPU_INDEX="http://127.0.0.1:9/never-asked")
    assert "from pip's index (the build for the nvidia accelerator)" in line, line


@pytest.mark.parametrize("version, says", [
    ("2.13.0+cpu -", "torch 2.13.0+cpu (the CPU build)"),
    ("2.13.0 12.8", "torch 2.13.0 (the CUDA 12.8 build)"),
])
def test_the_venv_size_and_torch_build_are_said(tmp_path, version, says):
    """An existing venv: its size and torch build; the CUDA build on a machine without an NVIDIA GPU is pointed out."""
    bin_ = tmp_path / "venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").write_text(f"#!/bin/sh\necho '{version}'\n")  # answers the version question, imports torch
    (bin_ / "python").chmod(0o755)
    (tmp_path / "venv" / "filler").write_bytes(b"\0" * 3 * 2**20)
    out = dry_run(tmp_path, mode="user", env={"TTS_APPLIANCE_ACCELERATOR": "cpu"}, new=False)
    line = next((x for x in out.splitlines() if re.match(rf"install.sh --dry-run: venv {tmp_path / 'venv'}: \d+ MB, ", x)),
                out)
    assert says in line, line
    assert ("this machine has no NVIDIA GPU, yet torch is the CUDA build" in out) == ("CUDA" in says), out
    assert "rm -rf" not in out or "CUDA" in says


def test_an_upgrade_restarts_the_running_service_unless_told_not_to(tmp_path):
    assert "a running service is restarted" in dry_run(tmp_path, mode="system")
    assert "left running (--no-restart)" in dry_run(tmp_path, "--no-restart", mode="system")

