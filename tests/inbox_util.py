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
