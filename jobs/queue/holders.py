"""Who holds a lease: this process's identity, and whether a holder on this host still runs.

A lease records the worker's host key (host name plus PID namespace, so containers sharing a
host name do not judge each other's PIDs) and its process id and start token (boot id plus the
process start time), so a recycled PID never passes for the dead worker that once had it.
"""
from __future__ import annotations

import functools
import logging
import os
import socket
from typing import Optional

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def host_key() -> str:
    """This host as seen by lease holders: `hostname` plus the PID namespace where Linux shows it."""
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = ""
    return f"{socket.gethostname()}/{ns}" if ns else socket.gethostname()


@functools.lru_cache(maxsize=1)
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _stat(pid: int) -> Optional[list[str]]:
    """Fields of /proc/PID/stat after the command name (state first), None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            raw = f.read()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()


def start_token(pid: int) -> Optional[str]:
    """`boot id:start time in clock ticks` of a process, None where /proc does not tell."""
    fields = _stat(pid)
    if not fields or len(fields) < 20:
        return None
    return f"{_boot_id()}:{fields[19]}"


def alive(pid: int, token: Optional[str]) -> bool:
    """Whether process `pid` of this host still runs and is the one that recorded `token`.

    A zombie (killed, not yet reaped by its parent) counts as gone. Where /proc does not show the
    process it may still run, hidden (`hidepid=invisible`, systemd's ProtectProc=invisible: another
    user's process, e.g. a `tts-appliance work` beside the service): the kernel is asked then (a signal
    0), and a process it knows counts as alive, its token unchecked: a live worker's leases are never
    taken (a recycled PID only makes them wait for their lease to expire)."""
    fields = _stat(pid)
    if fields is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if fields[0] in ("Z", "X"):
        return False
    return token is None or start_token(pid) == token


def me() -> tuple[str, int, Optional[str]]:
    """(host key, pid, start token) of this process."""
    pid = os.getpid()
    return host_key(), pid, start_token(pid)
