"""Idempotent submits (a mixin of `jobs.queue.Queue`): the same file content with the same options is one job.

A client that times out and submits again, a script run twice, two users dropping the same book:
each submit first *claims* its idempotency key (`jobs.submit.submit_key`: the file's content and the
normalized options) in the `submissions` table. The first claim reserves a job id and ingests; every
later submit of the same key gets that job id back, also while the first is still reading the
document (it waits for the job to appear, `wait_for_job`).

A key whose job ended `failed` or `cancelled` is claimed anew (a new job), so a submit after fixing
a problem is not answered with the old failure. A claim whose holder died before the job was
queued (same host, process gone; or older than `STALE_S`) is taken over.
"""
from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Optional

from jobs.queue import holders

log = logging.getLogger(__name__)

STALE_S = 3600.0  # a claim without a job after this long is abandoned (holder on another host)
RENEWED = ("failed", "cancelled")  # a key whose job ended so is claimed anew


def holder(pid: Optional[int] = None) -> str:
    """How a claim names its holder: this host's key, the process id and its start token
    (jobs.queue.holders, the identity lease holders use too); `pid`: another process of this host."""
    pid = os.getpid() if pid is None else pid
    return "|".join((holders.host_key(), str(pid), holders.start_token(pid) or ""))


def _abandoned(row: dict, now: float) -> bool:
    """The claim's holder is gone without having queued the job (or has held it for STALE_S)."""
    if now - row["claimed_at"] > STALE_S:
        return True
    host, pid, token = ((row["holder"] or "").split("|") + ["", "", ""])[:3]
    return host == holders.host_key() and pid.isdigit() and not holders.alive(int(pid), token or None)


class Submissions:
    """Needs `tx()` and `_rows()` of the Queue."""

    def claim_submission(self, key: str) -> tuple[str, bool]:
        """(job id, mine): `mine` when this submit must ingest and queue the job under that id; else
        the id is of an earlier submit of the same key (queued, or still being ingested)."""
        now = time.time()
        with self.tx() as c:
            row = c.execute("""SELECT s.job_id, s.holder, s.claimed_at, j.state FROM submissions s
                               LEFT JOIN jobs j ON j.id = s.job_id WHERE s.key = ?""", (key,)).fetchone()
            if row is not None:
                row = dict(zip(("job_id", "holder", "claimed_at", "state"), row))
                if row["state"] is not None and row["state"] not in RENEWED:
                    return row["job_id"], False
                if row["state"] is None and not _abandoned(row, now):
                    return row["job_id"], False
                if row["state"] is None:
                    log.warning("submit %s: the earlier submit (%s) died before queuing job %s; taking it over",
                                key[:12], row["holder"], row["job_id"])
                    c.execute("UPDATE submissions SET holder = ?, claimed_at = ? WHERE key = ?", (holder(), now, key))
                    return row["job_id"], True
            job_id = uuid.uuid4().hex[:12]
            c.execute("""INSERT INTO submissions (key, job_id, holder, claimed_at) VALUES (?, ?, ?, ?)
                         ON CONFLICT (key) DO UPDATE SET job_id = excluded.job_id, holder = excluded.holder,
                         claimed_at = excluded.claimed_at""", (key, job_id, holder(), now))
        return job_id, True

    def release_submission(self, key: str, job_id: str) -> None:
        """Drop a claim that did not become a job (the submit raised): the next submit starts afresh."""
        with self.tx() as c:
            c.execute("""DELETE FROM submissions WHERE key = ? AND job_id = ?
                         AND NOT EXISTS (SELECT 1 FROM jobs WHERE id = ?)""", (key, job_id, job_id))

    def wait_for_job(self, job_id: str, timeout_s: float) -> Optional[dict]:
        """The job row once the submit that claimed it has queued it; None after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self._rows("SELECT * FROM jobs WHERE id = ?", [job_id])
            if rows or time.monotonic() >= deadline:
                return rows[0] if rows else None
            time.sleep(0.1)
