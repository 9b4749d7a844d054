"""Shared by the inbox tests: a watcher on a fresh home, ticked until what a test waits for has happened
(never for a fixed time: a loaded machine handles a file later, not differently)."""
from __future__ import annotations

import time

from jobs.queue import Queue
from jobs.settings import resolve_home
from jobs.watch import InboxWatcher

LIMIT_S = 300.0  # a failure guard only: the tests wait for events, however slow the machine is


def inbox_env(tmp_path, quiet_s: float, closed_quiet_s: float):
    """(paths, queue, watcher) on HOME = tmp_path/home; close the queue when done."""
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(paths.db)
    return paths, q, InboxWatcher(paths, quiet_s=quiet_s, closed_quiet_s=closed_quiet_s, queue=q)


def ticks_until(w, done, limit: float = LIMIT_S, step: float = 0.1) -> None:
    """Tick `w` until `done()` holds (the files it waits for are handled, however slow the machine), failing
    after `limit` seconds; then wait for the files it is still reading. `done` is asked again after each
    tick's reads have ended, so a condition on their results (a job, a reason file) is met when it can be."""
    end = time.time() + limit
    while True:
        assert w.drain(limit), f"inbox ingests still running after {limit:g} s"
        if done():
            return
        assert time.time() < end, f"the inbox did not get there in {limit:g} s"
        w.tick()
        time.sleep(step)


class FakeClock:
    """The watcher's clock (`jobs.watch.time`), moved by the test: how long a file has been unchanged is
    decided by the test, not by how fast the machine ticks."""

    def __init__(self):
        self.now = time.time()

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
