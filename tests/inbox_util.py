"""Shared by the inbox tests: a watcher on a fresh home, and ticking it for a while."""
from __future__ import annotations

import time

from jobs.queue import Queue
from jobs.settings import resolve_home
from jobs.watch import InboxWatcher


def inbox_env(tmp_path, quiet_s: float, closed_quiet_s: float):
    """(paths, queue, watcher) on HOME = tmp_path/home; close the queue when done."""
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(paths.db)
    return paths, q, InboxWatcher(paths, quiet_s=quiet_s, closed_quiet_s=closed_quiet_s, queue=q)


def ticks(w, seconds: float, step: float = 0.1) -> None:
    """Tick `w` for `seconds`, then wait for the files it is still reading (pool threads)."""
    end = time.time() + seconds
    while time.time() < end:
        w.tick()
        time.sleep(step)
    assert w.drain(120), "inbox ingests still running after 120 s"


def ticks_until(w, done, limit: float = 300.0, step: float = 0.1) -> None:
    """Tick `w` until `done()` holds (the files it waits for are handled, however slow the machine), failing
    after `limit` seconds; then wait for the files it is still reading."""
    end = time.time() + limit
    while not done():
        assert time.time() < end, f"the inbox did not get there in {limit:g} s"
        w.tick()
        time.sleep(step)
    assert w.drain(120), "inbox ingests still running after 120 s"
