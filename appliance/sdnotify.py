"""systemd integration without extra dependencies: sd_notify and socket activation.

Notification protocol (sd_notify(3)): one datagram per message, sent to the AF_UNIX socket named
by $NOTIFY_SOCKET (a leading "@" means the abstract namespace). Messages used by the daemon:

    READY=1            start-up finished (engine loaded and warmed up)
    RELOADING=1        SIGHUP received, configuration being re-read (followed by READY=1)
    STOPPING=1         SIGTERM received, shutting down; with EXTEND_TIMEOUT_USEC=<us>: the stop may take
                       that long (service.stop_timeout_s, whatever the unit's TimeoutStopSec)
    STATUS=<text>      one line shown by `systemctl status`
    WATCHDOG=1         keep-alive; sent only while the engine loop makes progress
    MAINPID=<pid>      (unused: the daemon is the main process)

Outside systemd (no $NOTIFY_SOCKET) every call is a no-op, so the daemon runs the same by hand.

Socket activation (sd_listen_fds(3)): systemd passes listening sockets as fds 3.. with
$LISTEN_FDS=<n>, $LISTEN_PID=<our pid> and optionally $LISTEN_FDNAMES=name:name.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from typing import Optional

log = logging.getLogger(__name__)

SD_LISTEN_FDS_START = 3


class Notifier:
    """Sends sd_notify messages; a no-op when $NOTIFY_SOCKET is unset."""

    def __init__(self, environ=None):
        environ = os.environ if environ is None else environ
        addr = environ.get("NOTIFY_SOCKET") or ""
        if addr.startswith("@"):
            addr = "\0" + addr[1:]
        self.address = addr or None
        self._sock: Optional[socket.socket] = None
        usec = environ.get("WATCHDOG_USEC")
        pid = environ.get("WATCHDOG_PID")
        ok = usec and usec.isdigit() and (not pid or pid == str(os.getpid()))
        self.watchdog_s: Optional[float] = int(usec) / 1e6 if ok else None
        self._last_status = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *lines: str) -> bool:
        """Send one message made of `lines` (KEY=value). Returns False when not sent."""
        if not self.address:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(lines).encode("utf-8"), self.address)
            return True
        except OSError as exc:
            log.debug("sd_notify %s failed: %s", lines, exc)
            return False

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        """STATUS=<text> (only sent when it changed)."""
        text = text.replace("\n", " ")
        if text == self._last_status:
            return False
        self._last_status = text
        return self.send(f"STATUS={text}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def reloading(self) -> bool:
        # systemd >= 253 wants MONOTONIC_USEC with RELOADING=1 (Type=notify-reload); harmless before
        return self.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def stopping(self, takes_s: Optional[float] = None) -> bool:
        """STOPPING=1; `takes_s`: how long the stop may take, told to systemd so that TimeoutStopSec does not cut
        it short (EXTEND_TIMEOUT_USEC, systemd >= 236; the config's stop timeout is the one that counts)."""
        extend = [f"EXTEND_TIMEOUT_USEC={int(takes_s * 1e6)}"] if takes_s else []
        return self.send("STOPPING=1", *extend)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def listen_fds(environ=None, unset: bool = True) -> dict[str, socket.socket]:
    """Sockets passed by systemd socket activation, keyed by name (`LISTEN_FDNAMES`, else `fd<N>`).

    Honoured only when $LISTEN_PID is our pid. With `unset`, the variables are removed so child
    processes do not take the sockets for theirs.
    """
    environ = os.environ if environ is None else environ
    pid, n = environ.get("LISTEN_PID"), environ.get("LISTEN_FDS")
    if not n or not n.isdigit() or (pid and pid != str(os.getpid())):
        return {}
    names = (environ.get("LISTEN_FDNAMES") or "").split(":")
    out = {}
    for i in range(int(n)):
        fd = SD_LISTEN_FDS_START + i
        os.set_inheritable(fd, False)
        sock = socket.socket(fileno=fd)
        name = names[i] if i < len(names) and names[i] else f"fd{fd}"
        out[name if name not in out else f"{name}#{fd}"] = sock  # one FileDescriptorName for several
    if unset:
        for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            environ.pop(key, None)
    return out


def pick_activated(fds: dict[str, socket.socket], name: str, path) -> Optional[socket.socket]:
    """The activated socket for `name` ("api", "wyoming"): by its bound path, else by fd name,
    else (for "api" only) the single unnamed one."""
    for key, sock in list(fds.items()):
        try:
            bound = sock.getsockname()
        except OSError:
            continue
        if path is not None and isinstance(bound, str) and bound == str(path):
            return fds.pop(key)
    if name in fds:
        return fds.pop(name)
    unnamed = [k for k in fds if k.startswith("fd")]
    if name == "api" and len(unnamed) == 1:
        return fds.pop(unnamed[0])
    return None
