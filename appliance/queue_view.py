"""The daemon's view of its queue: the counts the status line, /health and /metrics show (or why the queue
cannot be read now), and this daemon's row among the daemons sharing the queue (`jobs.queue.daemons.Peers`:
renewed on the way, with a warning for each daemon whose spool folder is another)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from jobs.queue.daemons import Peers
from jobs.settings import Paths

log = logging.getLogger("tts_appliance.daemon")
QUEUE_PROBE_TIMEOUT_S = 5.0  # how long the status line, /health and /metrics wait for a locked SQLite queue


@dataclass
class QueueState:
    """The queue as the status line, /health and /metrics see it: counts by state, or why it cannot be read."""

    segments: dict = field(default_factory=dict)
    jobs: dict = field(default_factory=dict)
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.error is None


class QueueView:
    """The queue of the spool folder `paths`, as one daemon (`instance`: tts-appliance@N's N) sees it."""

    def __init__(self, paths: Paths, instance: Optional[str] = None):
        self.paths = paths
        self.peers = Peers(Path(paths.home), instance)  # this daemon in the queue's `daemons` table

    def counts(self, busy_timeout_s: float = 30.0) -> tuple[dict, dict]:
        """(segment counts, job counts) by state, on a connection of their own (raises QueueError and the
        like); on the way this daemon's row is renewed (`Peers.beat`)."""
        from jobs.queue import Queue

        q = Queue(self.paths.db, busy_timeout_s=busy_timeout_s)
        try:
            try:
                self.peers.beat(q)
            except Exception as exc:  # noqa: BLE001 - renewed next time; the counts say if the queue is away
                log.debug("queue: could not record this daemon: %s", exc)
            return q.counts(), q.job_counts()
        finally:
            q.close()

    def state(self) -> QueueState:
        """The queue's counts, or why it cannot be read now (database down, file unreadable, locked past
        QUEUE_PROBE_TIMEOUT_S), the password masked: never raises. An outage is logged once when it begins
        and once when it ends (for the whole process: the queue workers report to the same `OUTAGE`)."""
        from jobs.queue import QueueError, QueueUnavailable
        from jobs.queue.location import redact
        from jobs.queue.outage import OUTAGE

        known = True
        try:
            state = QueueState(*self.counts(QUEUE_PROBE_TIMEOUT_S))
        except (QueueError, QueueUnavailable) as exc:
            state = QueueState(error=redact(" ".join(str(exc).split()) or type(exc).__name__))
        except Exception as exc:  # noqa: BLE001 - a driver error (sqlite3, psycopg): the queue is as good as down
            known = False
            state = QueueState(error=redact(f"{type(exc).__name__}: {' '.join(str(exc).split())}"))
        if state.ok:
            OUTAGE.ok("status")
        else:  # said once per process, with what the queue workers find (jobs.queue.outage)
            OUTAGE.failed("status", state.error, exc_info=not known)
        return state

    def leave(self) -> None:
        """This daemon's row out of the queue (a stop); one left behind is dropped when it ages."""
        from jobs.queue import Queue

        try:
            q = Queue(self.paths.db, busy_timeout_s=QUEUE_PROBE_TIMEOUT_S)
            try:
                self.peers.leave(q)
            finally:
                q.close()
        except Exception as exc:  # noqa: BLE001 - it ages out
            log.debug("queue: could not remove this daemon's row: %s", exc)
