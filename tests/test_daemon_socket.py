"""The daemon's Unix sockets: mode 0660 + group keeps out users outside the group (real users made
with useradd; needs root), and systemd socket activation (LISTEN_FDS/LISTEN_PID) is honoured."""
from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from daemon_util import Daemon, base_config, needs_daemon

pytestmark = needs_daemon
GROUP, INSIDER, OUTSIDER = "ttsapitest", "ttsapi_in", "ttsapi_out"
PROBE = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\n"
         "try:\n    s.connect(sys.argv[1]); s.sendall(b'GET /health HTTP/1.0\\r\\n\\r\\n'); "
         "print(s.recv(64).split(b'\\r\\n')[0].decode())\nexcept PermissionError:\n    print('EACCES')\n")


def _can_make_users():
    if os.geteuid() != 0:
        return "needs root to create test users with useradd (run the tests as root, e.g. in CI containers)"
    for tool in ("useradd", "groupadd", "userdel", "groupdel", "setpriv"):
        if not shutil.which(tool):
            return f"{tool} not installed"
    if not Path("/usr/bin/python3").exists():
        return "/usr/bin/python3 needed to probe as another user"
    return None


@pytest.fixture()
def users():
    reason = _can_make_users()
    if reason:
        pytest.skip(reason)
    subprocess.run(["groupadd", "-f", GROUP], check=True)
    for user, extra in ((INSIDER, ["-G", GROUP]), (OUTSIDER, [])):
        subprocess.run(["userdel", user], capture_output=True)
        subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", *extra, user], check=True)
    yield
    for user in (INSIDER, OUTSIDER):
        subprocess.run(["userdel", user], capture_output=True)
    subprocess.run(["groupdel", GROUP], capture_output=True)


def probe_as(user: str, path: str) -> str:
    r = subprocess.run(["setpriv", f"--reuid={user}", "--regid=nogroup",
                        "--init-groups", "/usr/bin/python3", "-c", PROBE, path],
                       capture_output=True, text=True, timeout=30, cwd="/")
    return (r.stdout + r.stderr).strip()


def test_socket_refuses_users_outside_its_group(tmp_path, users):
    d = Daemon(tmp_path, base_config(tmp_path, http={"group": GROUP}, jobs={"enabled": False, "watch": False}))
    d.start()
    try:
        for path in (d.socket, d.wyoming):
            st = os.stat(path)
            assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == __import__("grp").getgrnam(GROUP).gr_gid
        got = probe_as(INSIDER, d.socket)
        assert got.startswith("HTTP/1.") and " 200 " in got, f"a group member must get in: {got}"
        assert probe_as(OUTSIDER, d.socket) == "EACCES"
        assert d.get("/health")[0] == 200  # the daemon is unharmed
    finally:
        assert d.stop() == 0


def test_socket_activation_is_honoured(tmp_path):
    cfg = base_config(tmp_path, jobs={"enabled": False, "watch": False}, wyoming={"enabled": False})
    d = Daemon(tmp_path, cfg)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(d.socket)
    listener.listen(16)
    os.chmod(d.socket, 0o660)

    def put_on_fd3():
        os.dup2(listener.fileno(), 3)
        os.set_inheritable(3, True)

    def wrap(argv):  # LISTEN_PID must be the daemon's own pid: set it in the shell that execs it
        return ["/bin/sh", "-c", 'LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=api exec "$@"', "sh", *argv]

    early = socket.socket(socket.AF_UNIX)
    d.start(wait=False, wrap=wrap, preexec_fn=put_on_fd3, pass_fds=(3,))
    try:
        early.connect(d.socket)  # queued by the kernel before the daemon is even up
        early.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        early.settimeout(60)
        assert b" 200 " in early.recv(64).split(b"\r\n")[0]
        d.wait_ready()
        assert "passed by systemd" in d.log_text()
    finally:
        assert d.stop() == 0
        listener.close()
    assert Path(d.socket).exists(), "an activated socket belongs to systemd and must stay"
