"""The composition root's builder: the engines, queue workers and inbox watcher, made from one
`appliance.settings.Settings` for the daemon and the job commands (`work`, `watch`, `submit --wait`,
`retry --wait`, `redo`) alike.

    host = start_engines(s, metrics)           # the daemon: engine processes (runtime.engine_process), warm-up
    with engines_here(s) as host:              # a job command: the engines in this process, stopped after
        worker = make_worker(s, host)          # jobs.worker.Worker feeding every engine
    watcher = make_watcher(s, host)            # jobs.watch.InboxWatcher (host: voices checked at submit)
    retention = make_retention(s)              # jobs.retention.Retention (jobs.keep_work_days)
    with retention_here(s):                    # a job command: that retention on a thread while the block runs

Nothing here decides a setting: every value comes from `s` (the daemon's supervision of what is built
here is appliance.supervise's).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Optional

from appliance.engine_host import EngineHost
from appliance.settings import Settings


def start_engines(s: Settings, metrics=None, in_process: bool = False) -> EngineHost:
    """The engines of `s`, started (EngineHost.load; `in_process`: in this process, no warm-up)."""
    host = EngineHost(s, metrics)
    host.load(in_process=in_process)
    return host


@contextmanager
def engines_here(s: Settings):
    """The engines of `s` in this process for a job command, stopped when the block ends."""
    host = start_engines(s, in_process=True)
    try:
        yield host
    finally:
        host.stop()


def make_worker(s: Settings, host: EngineHost, queue=None):
    """A queue worker on every engine of `host` with the worker settings of `s`: `batch_size` segments
    in flight (0: the engines' slots in all), the lease, the guard; it
    claims jobs pinned to the checkpoint it runs and unpinned ones, and nothing new while streams wait
    on every engine; it leases only while the spool folder has `jobs.min_free_mb` free beyond what a batch needs.
    `queue`: an open jobs Queue (default: a new connection to the settings' queue)."""
    from jobs.guard import GuardSettings
    from jobs.queue import Queue
    from jobs.worker import Worker

    w = s.worker
    slots = sum(r.max_slots for r in host.runners)
    return Worker(queue if queue is not None else Queue(s.paths.db), host.pool, s.paths,
                  batch_size=w.batch_for(slots), lease_s=w.lease_s, guard=GuardSettings(enabled=w.guard),
                  model=w.model, should_yield=host.streams_waiting, min_free_bytes=w.min_free_mb << 20)


def make_retention(s: Settings):
    """The retention of `s` (jobs.keep_work_days) on the settings' queue: jobs.retention.Retention."""
    from jobs.retention import Retention

    return Retention(s.paths.db, s.paths, s.config.jobs.keep_work_days)


@contextmanager
def retention_here(s: Settings):
    """The retention of `s` while a job command (`work`, `watch`) runs, as the daemon runs it: on a thread of its
    own, a round at the start and every hour. A block that ends waits for the first round (a command done at once
    still applies it); the thread is stopped after it (a later round stops between jobs)."""
    retention = make_retention(s)
    stop = threading.Event()
    thread = threading.Thread(target=retention.run, args=(stop,), name="retention", daemon=True)
    thread.start()
    try:
        yield retention
        retention.ran.wait()
    finally:
        stop.set()
        thread.join()


def make_watcher(s: Settings, host: Optional[EngineHost] = None):
    """The inbox watcher of `s` (quiet time, polling, ingest limits, job defaults); with `host`, a job
    naming a voice its engines do not have fails at submit."""
    from jobs.watch import InboxWatcher

    watcher = InboxWatcher(s.paths, quiet_s=s.inbox.quiet_s, polling=s.inbox.polling, defaults=s.job_defaults,
                           limits=s.ingest)
    if host is not None:
        watcher.voices = lambda: host.engine.voices
    return watcher
