"""systemd integration: the unit files pass `systemd-analyze verify` (skipped where systemd's tools
are absent), sysusers/tmpfiles snippets apply to a scratch root, the units carry the settings the
daemon relies on, and the sd_notify / LISTEN_FDS helpers speak the protocol."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.sdnotify import Notifier, listen_fds, pick_activated

ROOT = Path(__file__).resolve().parents[1]
UNITS = ("tts-appliance.service", "tts-appliance.socket", "tts-appliance@.service")
BIN = "/usr/local/bin/tts-appliance"


def tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        pytest.skip(f"{name} not installed (apt-get install -y systemd); the unit check needs systemd's tools")
    return path


def render(tmp: Path) -> Path:
    """Units as install.sh installs them, with ExecStart pointing at an existing executable."""
    for name in UNITS:
        text = (ROOT / "systemd" / name).read_text().replace(BIN, sys.executable)
        (tmp / name).write_text(text)
    return tmp


def test_units_pass_systemd_analyze_verify(tmp_path):
    analyze = tool("systemd-analyze")
    d = render(tmp_path)
    r = subprocess.run([analyze, "verify", "--man=no", str(d / "tts-appliance.service"),
                        str(d / "tts-appliance.socket"), str(d / "tts-appliance@0.service")],
                       capture_output=True, text=True, cwd=d, env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"})
    complaints = [ln for ln in (r.stdout + r.stderr).splitlines() if "tts-appliance" in ln]
    assert r.returncode == 0 and not complaints, r.stdout + r.stderr


def test_security_exposure_is_low(tmp_path):
    """`systemd-analyze security` of the unit files as they are (the live test checks the loaded units)."""
    analyze = tool("systemd-analyze")
    d = render(tmp_path)
    r = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", "tts-appliance.service",
                        "tts-appliance@0.service"], capture_output=True, text=True, cwd=d)
    if "--offline" in r.stderr:
        pytest.skip(f"systemd-analyze too old for --offline (systemd >= 250): {r.stderr.strip()}")
    scores = {m[1]: float(m[2]) for m in re.finditer(r"Overall exposure level for (\S+): ([\d.]+)", r.stdout)}
    assert set(scores) == {"tts-appliance.service", "tts-appliance@0.service"}, r.stdout[-2000:] + r.stderr
    assert max(scores.values()) <= 3.5, scores


def hardening(name: str) -> str:
    """The block from '# Hardening' to the next blank line (setup.sh strips it from user units)."""
    text = (ROOT / "systemd" / name).read_text()
    return text[text.index("# Hardening"):].split("\n\n", 1)[0]


def test_service_and_template_share_the_hardening():
    block = hardening("tts-appliance.service")
    assert block == hardening("tts-appliance@.service")
    for line in ("CapabilityBoundingSet=\n", "SystemCallFilter=@system-service", "SystemCallArchitectures=native",
                 "IPAddressDeny=any", "PrivateUsers=yes", "ProtectProc=invisible", "DevicePolicy=closed"):
        assert line in block, line
    for opened in ("PrivateDevices=yes", "MemoryDenyWriteExecute=yes", "ProcSubset=pid"):  # the GPU needs them open
        assert opened not in block, opened


def test_verify_catches_a_broken_unit(tmp_path):
    analyze = tool("systemd-analyze")
    bad = tmp_path / "tts-appliance.service"
    bad.write_text((ROOT / "systemd" / "tts-appliance.service").read_text().replace(BIN, "/nonexistent/x"))
    r = subprocess.run([analyze, "verify", "--man=no", str(bad)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode != 0 or "not executable" in r.stderr


def test_sysusers_and_tmpfiles_apply_to_a_scratch_root(tmp_path):
    sysusers, tmpfiles = tool("systemd-sysusers"), tool("systemd-tmpfiles")
    if os.geteuid() != 0:
        pytest.skip("applying tmpfiles with owners needs root")
    (tmp_path / "etc").mkdir()
    r = subprocess.run([sysusers, f"--root={tmp_path}", str(ROOT / "systemd/sysusers.d/tts-appliance.conf")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "tts-appliance:" in (tmp_path / "etc/passwd").read_text()
    r = subprocess.run([tmpfiles, f"--root={tmp_path}", "--create", str(ROOT / "systemd/tmpfiles.d/tts-appliance.conf")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    inbox = tmp_path / "var/lib/tts-appliance/inbox"
    assert inbox.is_dir() and oct(inbox.stat().st_mode & 0o7777) == "0o2770"


def test_units_carry_what_the_daemon_relies_on():
    svc = (ROOT / "systemd/tts-appliance.service").read_text()
    for line in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "TimeoutStopSec=", "ProtectSystem=strict",
                 "ReadWritePaths=/var/lib/tts-appliance", "DeviceAllow=char-nvidia-frontend rw",
                 "DeviceAllow=char-davinci rw", "ExecReload=/bin/sh -c 'kill -HUP $$MAINPID'", "RuntimeDirectoryPreserve=yes"):
        assert line in svc, line
    # reload checks the config first: an invalid one fails `systemctl reload` and the signal is not sent
    reloads = [line for line in svc.splitlines() if line.startswith("ExecReload=")]
    assert reloads == ["ExecReload=/usr/local/bin/tts-appliance daemon --check",
                       "ExecReload=/bin/sh -c 'kill -HUP $$MAINPID'"], reloads
    assert "PrivateDevices=yes" not in svc
    sock = (ROOT / "systemd/tts-appliance.socket").read_text()
    assert "ListenStream=/run/tts-appliance/api.sock" in sock and "SocketMode=0660" in sock
    tpl = (ROOT / "systemd/tts-appliance@.service").read_text()
    assert "--instance %i" in tpl and "RuntimeDirectory=tts-appliance/%i" in tpl
    assert [line for line in tpl.splitlines() if line.startswith("ExecReload=")][0] == \
        "ExecReload=/usr/local/bin/tts-appliance daemon --instance %i --check"


def test_notifier_sends_datagrams_and_is_a_noop_without_socket(tmp_path):
    path = tmp_path / "n"
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(str(path))
    rx.settimeout(2)
    n = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())})
    assert n.watchdog_s == 4.0
    assert n.ready("warm") and rx.recv(100) == b"READY=1\nSTATUS=warm"
    assert n.status("a") and not n.status("a")  # unchanged status is not resent
    assert rx.recv(100) == b"STATUS=a"
    assert n.watchdog() and rx.recv(100) == b"WATCHDOG=1"
    assert n.stopping() and rx.recv(100) == b"STOPPING=1"
    # the config's stop timeout stretches the unit's TimeoutStopSec (the unit no longer overrides the config)
    assert n.stopping(90.5) and rx.recv(100) == b"STOPPING=1\nEXTEND_TIMEOUT_USEC=90500000"
    n.close()
    assert Notifier({"WATCHDOG_USEC": "1000", "WATCHDOG_PID": "1"}).watchdog_s is None
    assert not Notifier({}).ready()


def test_abstract_notify_socket():
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"tts-appliance-test-{os.getpid()}"
    rx.bind("\0" + name)
    rx.settimeout(2)
    assert Notifier({"NOTIFY_SOCKET": "@" + name}).watchdog() and rx.recv(100) == b"WATCHDOG=1"


def test_listen_fds_only_for_our_pid(tmp_path):
    assert listen_fds({"LISTEN_FDS": "1", "LISTEN_PID": "1"}) == {}
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp_path / "a.sock"))
    saved = os.dup(3) if _fd_open(3) else None
    os.dup2(s.fileno(), 3)
    try:
        env = {"LISTEN_FDS": "1", "LISTEN_PID": str(os.getpid()), "LISTEN_FDNAMES": "x"}
        fds = listen_fds(env)
        assert list(fds) == ["x"] and "LISTEN_FDS" not in env
        assert pick_activated(dict(fds), "api", tmp_path / "a.sock") is fds["x"]
        fds["x"].detach()
    finally:
        if saved is not None:
            os.dup2(saved, 3)
            os.close(saved)
        else:
            os.close(3)
        s.close()


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def test_setup_script_installs_and_uninstalls_keeping_user_data(tmp_path):
    """install.sh's systemd part into a scratch root (system mode) and a scratch HOME (user mode)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    root = tmp_path / "root"
    env = {**os.environ, "TTS_APPLIANCE_SYSROOT": str(root), "TTS_APPLIANCE_INSTALL_MODE": "system"}
    setup = str(ROOT / "systemd" / "setup.sh")
    r = subprocess.run([setup, "install", str(venv)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "TINY TEST MODEL" in r.stdout
    assert (root / "etc/systemd/system/tts-appliance.service").is_file()
    assert os.readlink(root / "usr/local/bin/tts-appliance") == str(venv / "bin" / "tts-appliance")
    from appliance.config import load_config

    cfg = load_config(root / "etc/tts-appliance/config.yaml", environ={})
    # paths as the service sees them, not under the build root
    assert cfg.model.path == "/var/lib/tts-appliance/models/tiny-test-RANDOM-WEIGHTS", cfg.model.path
    assert (root / cfg.model.path.lstrip("/")).resolve() == (ROOT / "tests/data/tiny/cv_small").resolve()
    # the CLI of every user finds the daemon, and `info` names the service's sockets and runtime folder
    assert (cfg.runtime_dir(), cfg.http_socket(), cfg.wyoming_socket()) == (
        Path("/run/tts-appliance"), Path("/run/tts-appliance/api.sock"), Path("/run/tts-appliance/wyoming.sock"))
    assert cfg.jobs.home == "/var/lib/tts-appliance"  # and info, preview, logs read the service's queue
    assert cfg.runtime.engine_cache == "/var/lib/tts-appliance/engines"  # build-engines builds where it looks
    conf = root / "etc/tts-appliance/config.yaml"
    assert oct(conf.stat().st_mode & 0o777) == "0o640"  # it may hold jobs.queue's password
    conf.chmod(0o644)  # as an earlier version left it: a re-install tightens it
    r = subprocess.run([setup, "install", str(venv), str(ROOT / "tests/data/tiny/base_small")], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0 and load_config(root / "etc/tts-appliance/config.yaml", environ={}).model.path == \
        "/var/lib/tts-appliance/models/base_small"
    assert oct(conf.stat().st_mode & 0o777) == "0o640"
    r = subprocess.run([setup, "install", str(venv), "nobody/no-such-model"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "--model /path/to/folder" in r.stderr
    (root / "var/lib/tts-appliance/queue.db").write_text("user data")
    r = subprocess.run([setup, "uninstall", str(venv)], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and not venv.exists()
    assert not (root / "etc/systemd/system/tts-appliance.service").exists()
    assert (root / "var/lib/tts-appliance/queue.db").exists() and (root / "etc/tts-appliance/config.yaml").exists()


def test_setup_script_user_units(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    env = {**os.environ, "HOME": str(tmp_path), "TTS_APPLIANCE_INSTALL_MODE": "user"}
    for k in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "TTS_APPLIANCE_HOME", "TTS_APPLIANCE_SYSROOT"):
        env.pop(k, None)
    r = subprocess.run([str(ROOT / "systemd" / "setup.sh"), "install", str(venv)], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    unit = (tmp_path / ".config/systemd/user/tts-appliance.service").read_text()
    assert f"ExecStart={venv}/bin/tts-appliance daemon --config" in unit and "User=" not in unit
    conf = tmp_path / ".config/tts-appliance/config.yaml"
    assert f"ExecReload={venv}/bin/tts-appliance daemon --config {conf} --check" in unit, unit
    assert "DeviceAllow" not in unit and "WantedBy=default.target" in unit
    sock = (tmp_path / ".config/systemd/user/tts-appliance.socket").read_text()
    assert "ListenStream=%t/tts-appliance/api.sock" in sock and "SocketUser" not in sock
    assert oct((tmp_path / ".config/tts-appliance/config.yaml").stat().st_mode & 0o777) == "0o600"


def test_the_units_override_no_key_of_the_admins_config():
    """An `Environment=TTS_APPLIANCE_<SECTION>__<KEY>=` in a unit beats the config files (the environment comes
    after them): the service unit sets none, so service.stop_timeout_s and the rest are the admin's. The template
    names only its instance's own sockets."""
    from appliance.config import env_overrides

    def overrides(name):
        env = dict(line[len("Environment="):].split("=", 1) for line in (ROOT / "systemd" / name).read_text().splitlines()
                   if line.startswith("Environment="))
        return env_overrides(env)

    assert overrides("tts-appliance.service") == {}
    assert overrides("tts-appliance@.service") == {"wyoming": {"socket": "/run/tts-appliance/%i/wyoming.sock"},
                                                   "http": {"socket": "/run/tts-appliance/%i/api.sock"}}


def test_setup_script_builds_the_codec_engines_where_the_service_looks(tmp_path):
    """`sudo ./install.sh --model DIR`: the codec engines land in the service's engine cache (runtime.engine_cache of
    the config it writes: the service's HOME is not root's), and the service's settings look there."""
    from appliance.config import load_config
    from engines.codec.manifest import default_cache_dir

    root, home, model = tmp_path / "root", tmp_path / "home", ROOT / "tests/data/tiny/cv_small"
    env = {**os.environ, "TTS_APPLIANCE_SYSROOT": str(root), "TTS_APPLIANCE_INSTALL_MODE": "system",
           "SETUP_BUILD": "1", "SETUP_SYSTEMD": "0", "HOME": str(home), "XDG_CACHE_HOME": ""}
    env.pop("TTS_APPLIANCE_ENGINE_CACHE", None)
    r = subprocess.run([str(ROOT / "systemd" / "setup.sh"), "install", sys.prefix, str(model)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (root / "var/lib/tts-appliance/engines/cv_small/manifest.json").is_file(), r.stdout + r.stderr
    assert not (home / ".cache/tts-appliance").exists()
    assert not (root / "etc/systemd/system/tts-appliance.service").exists()  # --no-systemd: the model part only
    cfg = load_config(root / "etc/tts-appliance/config.yaml", environ={})
    assert default_cache_dir(model, cfg.runtime.engine_cache) == Path("/var/lib/tts-appliance/engines/cv_small")
