"""The segments a worker has in the engine (pipelined feeding, jobs.worker), and stopping those of jobs
that ended meanwhile.

A job cancelled (or deleted, or failed) while its segments are synthesized must not keep the engine:
its requests are cancelled there (`StreamHandle.cancel` frees their slots at the engine's next step)
and they leave the worker's count at once, so the worker fills the room with other jobs' segments (a
priority-10 job does not wait for a cancelled book's batch) and a shutdown does not wait for them.
A worker learns that a job ended from the daemon at once (`note_ended`: the cancel and delete routes)
and from the queue (`job_states`, asked at most every CHECK_S while segments are in flight: a cancel
by another process or host).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Iterator

from jobs.queue import ACTIVE

log = logging.getLogger(__name__)

CHECK_S = 1.0  # how often the queue is asked whether the jobs in flight still run


class InFlight:
    """handle -> (audio key, segment rows, synthesis log id); used on the worker's thread, but `note_ended`
    (any thread)."""

    def __init__(self):
        self._items: dict[Any, tuple[str, list[dict], int]] = {}
        self._noted: set[str] = set()
        self._lock = threading.Lock()
        self._checked = 0.0

    def __bool__(self) -> bool:
        return bool(self._items)

    def add(self, handle, key: str, rows: list[dict], log_id: int) -> None:
        self._items[handle] = (key, rows, log_id)

    def rows(self) -> int:
        """Segment rows in flight (what counts against the worker's batch size)."""
        return sum(len(v[1]) for v in self._items.values())

    def ended(self) -> Iterator[tuple[Any, str, list[dict], int]]:
        """Take out the requests that ended: (handle, key, rows, log id)."""
        for handle in [h for h in self._items if h.done]:
            key, rows, log_id = self._items.pop(handle)
            yield handle, key, rows, log_id

    def note_ended(self, job_id: str) -> None:
        """Job `job_id` was cancelled or deleted (any thread): `stop_ended` stops its segments."""
        with self._lock:
            self._noted.add(job_id)

    def stop_ended(self, queue) -> list[int]:
        """Cancel in the engine the requests whose every segment belongs to a job that ended (those shared
        with a running job by audio key keep going, for it); returns the segment ids let go."""
        with self._lock:
            ended, self._noted = self._noted, set()
        jobs = {r["job_id"] for _, rows, _ in self._items.values() for r in rows}
        now = time.monotonic()
        if jobs and now - self._checked >= CHECK_S:
            self._checked = now
            states = queue.job_states(jobs)
            ended |= {j for j in jobs if states.get(j) not in ACTIVE}
        ended &= jobs
        if not ended:
            return []
        dropped, stopped = [], {}
        for handle, (key, rows, log_id) in list(self._items.items()):
            keep = [r for r in rows if r["job_id"] not in ended]
            gone = [r for r in rows if r["job_id"] in ended]
            if not gone:
                continue
            dropped += [r["id"] for r in gone]
            for r in gone:
                stopped[r["job_id"]] = stopped.get(r["job_id"], 0) + 1
            if keep:  # the request was made from its first row: the rows left keep what it said (its seed)
                keep[0] = {**keep[0], "_seed": rows[0].get("_seed")}
                self._items[handle] = (key, keep, log_id)
            else:
                del self._items[handle]
                handle.cancel()
        for job_id, n in sorted(stopped.items()):
            log.info("job %s ended (cancelled or deleted): %d of its segment(s) stopped in the engine", job_id, n)
        return dropped
