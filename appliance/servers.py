"""Listening sockets of the daemon: HTTP (Unix socket, optional loopback TCP) and Wyoming.

Unix sockets are created with the configured mode (default 0660) and group, so only members of
that group (and root) can connect. Sockets passed by systemd socket activation (fd names "api"
and "wyoming", or matched by path) are used as they are: systemd sets their mode and group.
"""
from __future__ import annotations

import asyncio
import grp
import logging
import os
from pathlib import Path
from typing import Optional

from aiohttp import web

from appliance.http_common import is_loopback
from appliance.sdnotify import listen_fds, pick_activated

log = logging.getLogger(__name__)


def bind_unix_path(path: Path, mode: int, group: Optional[str]) -> None:
    """Apply mode and group to a freshly bound socket file."""
    os.chmod(path, mode)
    if group:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise OSError(f"http.group {group!r}: no such group") from None
        if os.stat(path).st_gid != gid:  # no chown when it is already ours (systemd's filter forbids chown)
            os.chown(path, -1, gid)


class Servers:
    def __init__(self, daemon):
        self.d = daemon
        self.cfg = daemon.cfg
        self.runner: Optional[web.AppRunner] = None
        self.wyoming: Optional[asyncio.AbstractServer] = None
        self.http_path: Optional[str] = None
        self.wyoming_path: Optional[str] = None
        self.tcp_url: Optional[str] = None
        self.wyoming_tcp: Optional[str] = None
        self._owned: list[Path] = []  # socket files we created (removed on stop)

    def _prepare_path(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_socket() or path.exists():
            path.unlink()  # a stale socket of an earlier run

    async def start(self) -> None:
        from appliance.http_api import make_app

        fds = listen_fds()
        h = self.cfg.http
        mode = int(h.mode, 8)
        self.runner = web.AppRunner(make_app(self.d), handler_cancellation=True, shutdown_timeout=3.0,
                                    access_log=None, keepalive_timeout=max(h.read_timeout_s, 5.0))
        await self.runner.setup()
        path = self.cfg.http_socket()
        sock = pick_activated(fds, "api", path)
        if sock is not None:
            await web.SockSite(self.runner, sock).start()
            self.http_path = sock.getsockname() if isinstance(sock.getsockname(), str) else None
            log.info("HTTP API on the socket passed by systemd (%s)", self.http_path or sock.getsockname())
        elif path is not None:
            self._prepare_path(path)
            old = os.umask(0o777 & ~mode)  # no window with looser permissions
            try:
                await web.UnixSite(self.runner, str(path)).start()
            finally:
                os.umask(old)
            bind_unix_path(path, mode, h.group)
            self._owned.append(path)
            self.http_path = str(path)
        if h.tcp:
            site = web.TCPSite(self.runner, h.tcp_host, h.tcp_port)
            await site.start()
            port = site._server.sockets[0].getsockname()[1] if site._server else h.tcp_port
            self.tcp_url = f"http://{h.tcp_host}:{port}"
            if not h.api_key and not is_loopback(h.tcp_host):
                log.warning("HTTP API on %s without an API key: anyone who reaches it may use it, and the page for "
                            "browsers is not served there; set http.api_key", self.tcp_url)
        await self._start_wyoming(fds, mode)
        for name, s in fds.items():
            log.warning("ignoring an activated socket we have no use for: %s", name)
            s.close()

    async def _start_wyoming(self, fds, mode: int) -> None:
        from appliance.wyoming_server import client_connected

        w = self.cfg.wyoming
        if not w.enabled:
            return

        async def cb(reader, writer):
            await client_connected(self.d, reader, writer)

        path = self.cfg.wyoming_socket()
        sock = pick_activated(fds, "wyoming", path)
        if sock is not None:
            self.wyoming = await asyncio.start_unix_server(cb, sock=sock)
            self.wyoming_path = sock.getsockname()
        elif path is not None:
            self._prepare_path(path)
            old = os.umask(0o777 & ~mode)
            try:
                self.wyoming = await asyncio.start_unix_server(cb, path=str(path))
            finally:
                os.umask(old)
            bind_unix_path(path, mode, self.cfg.http.group)
            self._owned.append(path)
            self.wyoming_path = str(path)
        if w.tcp_port is not None:
            self.wyoming_tcp_server = await asyncio.start_server(cb, w.tcp_host, w.tcp_port)
            port = self.wyoming_tcp_server.sockets[0].getsockname()[1]
            self.wyoming_tcp = f"tcp://{w.tcp_host}:{port}"
            if not is_loopback(w.tcp_host):  # (Home Assistant on another machine needs this; the protocol has no key)
                log.warning("Wyoming on %s: the protocol has no authentication, anyone who reaches it may use it; "
                            "keep it to a trusted network (a firewall) or use wyoming.tcp_host 127.0.0.1",
                            self.wyoming_tcp)

    def describe(self) -> list[str]:
        out = [f"http unix:{self.http_path}"] if self.http_path else []
        out += [f"http {self.tcp_url}"] if self.tcp_url else []
        out += [f"wyoming unix:{self.wyoming_path}"] if self.wyoming_path else []
        out += [f"wyoming {self.wyoming_tcp}"] if self.wyoming_tcp else []
        return out

    async def stop(self) -> None:
        for srv in (self.wyoming, getattr(self, "wyoming_tcp_server", None)):
            if srv is not None:
                srv.close()
        if self.runner is not None:
            await self.runner.cleanup()
        for p in self._owned:
            try:
                p.unlink()
            except FileNotFoundError:
                pass
