"""The daemon's long-lived parts, watched: a part that dies is restarted or takes the daemon down.

    sup = Supervisor()
    sup.thread("inbox", make)          # make() -> the function the thread runs; called again to restart it
    sup.add(Part("engine cuda:0", alive=runner_is_running))   # no restart: its death stops the daemon
    sup.add(Part("engine cpu", alive=..., restart=proc.restart_async, starting=lambda: proc.starting))
    fatal = sup.check()                # every second, from the daemon's event loop
    sup.health()                       # {name: {"ok", "restarts", "error"?, ...}} for /health

A thread part that dies (an exception, or returning while the daemon runs) is logged with its
traceback and started again after a pause that doubles while it keeps dying soon after a start
(RESTART_DELAYS_S); an engine process is started again the same way, once per death however long its
start-up takes (`Part.starting`); a part that cannot be restarted (an engine's loop: its device state is not to be
trusted) is returned by `check` so that the daemon stops with a non-zero status and systemd starts
it again. While a part is down, `health()` says so and why (/health answers 503).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

log = logging.getLogger(__name__)
RESTART_DELAYS_S = (1.0, 60.0)  # first pause before a restart, longest pause
STABLE_S = 60.0  # a part that ran this long before dying is restarted after the first pause again


class Part:
    """One watched part: `alive()`, and `restart()` (None: it cannot be restarted). `detail()` adds
    figures to its /health entry. `starting()`: a restart of it is under way (an engine process loading its
    model for a minute): it is not down again meanwhile, and not restarted or counted again."""

    def __init__(self, name: str, alive: Callable[[], bool], restart: Optional[Callable[[], None]] = None,
                 detail: Optional[Callable[[], dict]] = None, starting: Optional[Callable[[], bool]] = None):
        self.name, self.alive, self.restart, self.detail = name, alive, restart, detail
        self.starting = starting or (lambda: False)
        self.error: Optional[str] = None  # why it stopped, last time
        self.restarts = 0
        self.started = time.monotonic()
        self.down_since: Optional[float] = None
        self.delay = 0.0  # pause before the next restart
        self.next_try = 0.0


class ThreadPart(Part):
    """A part that is a thread running `make()()`; restarted by a new `make()` on a new thread."""

    def __init__(self, name: str, make: Callable[[], Callable[[], None]], detail: Optional[Callable[[], dict]] = None):
        super().__init__(name, self._alive, self.start, detail)
        self.make = make
        self.thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self.started = time.monotonic()
        run = self.make()
        self.error = None
        self.thread = threading.Thread(target=self._run, args=(run,), name=self.name, daemon=True)
        self.thread.start()

    def _run(self, run: Callable[[], None]) -> None:
        try:
            run()
        except BaseException as exc:  # noqa: BLE001 - the part died: the supervisor restarts it
            self.error = f"{type(exc).__name__}: {exc}"
            log.error("%s died: %s", self.name, self.error, exc_info=True)

    def _alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


class Supervisor:
    """The daemon's watched parts; `stopping` set at shutdown (parts that end then are not down)."""

    def __init__(self):
        self.parts: dict[str, Part] = {}
        self.stopping = False

    def add(self, part: Part) -> Part:
        self.parts[part.name] = part
        return part

    def thread(self, name: str, make: Callable[[], Callable[[], None]],
               detail: Optional[Callable[[], dict]] = None) -> ThreadPart:
        """Start `make()` on a watched thread `name`; a `make` that fails counts as a death (retried)."""
        part = self.add(ThreadPart(name, make, detail))
        try:
            part.start()
        except Exception as exc:  # noqa: BLE001 - e.g. a folder it needs cannot be made: retried by check()
            part.error = f"{type(exc).__name__}: {exc}"
            log.error("%s could not start: %s", name, part.error, exc_info=True)
        return part

    def threads(self) -> list[threading.Thread]:
        return [p.thread for p in self.parts.values() if isinstance(p, ThreadPart) and p.thread is not None]

    def check(self, now: Optional[float] = None) -> list[Part]:
        """Restart the dead parts whose pause is over; returns the dead parts that cannot be restarted."""
        if self.stopping:
            return []
        now = time.monotonic() if now is None else now
        fatal = []
        for part in list(self.parts.values()):
            if part.alive() or part.starting():  # (one restart at a time: its start-up is not a second death)
                continue
            why = part.error or "it ended"
            if part.restart is None:
                log.error("%s is down (%s); the daemon stops so that it is started again (systemd: Restart=on-failure)",
                          part.name, why)
                fatal.append(part)
                continue
            if part.down_since is None:
                part.down_since = now
                quick = now - part.started < STABLE_S
                part.delay = min(RESTART_DELAYS_S[1], max(RESTART_DELAYS_S[0], part.delay * 2 if quick else 0.0))
                part.next_try = now + part.delay
                log.warning("%s is down (%s); restarting it in %.0f s", part.name, why, part.delay)
            if now >= part.next_try:
                part.restarts += 1
                log.warning("restarting %s (restart %d)", part.name, part.restarts)
                part.down_since, part.started = None, now  # seen down again if this start fails or it dies
                try:
                    part.restart()
                except Exception as exc:  # noqa: BLE001 - retried after a longer pause
                    part.error = f"{type(exc).__name__}: {exc}"
                    log.error("%s could not be restarted: %s", part.name, part.error, exc_info=True)
        return fatal

    def health(self) -> dict:
        """{name: {"ok": bool, "restarts": n, "error": why it is down (while down), ...detail}}."""
        out = {}
        for part in list(self.parts.values()):
            ok = part.alive() or self.stopping
            entry = {"ok": ok, "restarts": part.restarts}
            if not ok:
                entry["error"] = part.error or "it ended"
                if part.restart is not None and part.down_since is not None:
                    entry["restart_in_s"] = round(max(0.0, part.next_try - time.monotonic()), 1)
            if part.detail is not None:
                entry.update(part.detail())
            out[part.name] = entry
        return out
