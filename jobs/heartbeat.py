"""A worker's heartbeat: the leases of the segments it holds, renewed on a connection of its own."""
from __future__ import annotations

import logging
import threading
from pathlib import Path

from jobs.queue import Queue, QueueError, QueueUnavailable

log = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    """Renews this worker's leases every `interval_s` on its own connection."""

    def __init__(self, db_path: Path, worker_id: str, lease_s: float, interval_s: float):
        super().__init__(name=f"heartbeat-{worker_id}", daemon=True)
        self.db_path, self.worker_id, self.lease_s, self.interval_s = db_path, worker_id, lease_s, interval_s
        self._held: set[int] = set()
        self._lock = threading.Lock()
        self._halt = threading.Event()

    def hold(self, ids) -> None:
        with self._lock:
            self._held.update(ids)

    def drop(self, ids) -> None:
        with self._lock:
            self._held.difference_update(ids)

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        q = None
        try:
            while not self._halt.wait(self.interval_s):
                with self._lock:
                    ids = sorted(self._held)
                try:
                    q = q or Queue(self.db_path)
                    q.renew(self.worker_id, ids, self.lease_s)
                except (QueueError, QueueUnavailable) as exc:  # database away: keep trying (the worker says so)
                    log.debug("heartbeat: cannot renew leases (%s); will retry", exc)
                except Exception:  # a busy database must not kill the heartbeat
                    log.exception("heartbeat: renewing leases failed; will retry")
        finally:
            if q is not None:
                q.close()
