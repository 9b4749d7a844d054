"""Results, job completion, user commands and the job log (a mixin of `jobs.queue.Queue`)."""
from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Optional, Sequence

TERMINAL = ("done", "failed", "cancelled", "partial")
ACTIVE = ("queued", "running")


class QueueError(Exception):
    """A queue operation the user asked for cannot be done (message says why)."""


class NoQueue(QueueError):
    """A report found no queue where it looked: none was made there yet (`Queue.reading`)."""


def _now() -> float:
    return time.time()


def _work_kept(job: dict, what: str) -> None:
    """QueueError when the job's working files (its segments' audio) were removed (jobs.retention): a retry
    or a redo assembles the book again from every segment's audio."""
    if job.get("work_removed_at"):
        when = time.strftime("%Y-%m-%d", time.localtime(job["work_removed_at"]))
        raise QueueError(f"job {job['id']} cannot be {what}: its segments' audio was removed on {when}, "
                         "jobs.keep_work_days after it ended (its outputs stay); submit the document again "
                         "for a new take, and raise jobs.keep_work_days to keep the audio longer")


class Records:
    """Needs `tx()`, `_rows()`, `job()`, `store` and `max_attempts` of the Queue."""

    max_attempts: int

    # -- results ---------------------------------------------------------------------------
    def cached(self, key: str) -> Optional[dict]:
        rows = self._rows("SELECT * FROM audio_cache WHERE key = ?", [key])
        return rows[0] if rows and Path(rows[0]["path"]).is_file() else None

    def complete(self, seg_id: int, key: str, path: str, sample_rate: int, samples: int, seed_used: int,
                 log_id: Optional[int] = None) -> bool:
        """Record finished audio (already durable on disk) and mark the segment done; the audio becomes the
        cache entry of `key` only then; with `log_id`, its synthesis log entry ends in the same transaction
        (only when this call recorded the audio).

        Returns False when the segment is no longer waiting for audio (cancelled, deleted, or done by
        another): then nothing names `path` (the caller may remove it).
        """
        now = _now()
        with self.tx() as c:
            cur = c.execute("""UPDATE segments SET state = 'done', key = ?, audio_path = ?, duration_s = ?,
                               seed_used = ?, worker_id = NULL, lease_expires = NULL, last_error = NULL,
                               updated_at = ? WHERE id = ? AND state IN ('leased', 'queued')""",
                            (key, str(path), samples / float(sample_rate), seed_used, now, seg_id))
            recorded = cur.rowcount == 1
            if recorded:
                c.execute("""INSERT INTO audio_cache (key, path, sample_rate, samples, seed_used, created_at)
                             VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET path = excluded.path,
                             sample_rate = excluded.sample_rate, samples = excluded.samples,
                             seed_used = excluded.seed_used, created_at = excluded.created_at""",
                          (key, str(path), sample_rate, samples, seed_used, now))
            if recorded and log_id is not None:
                c.execute("UPDATE synth_log SET finished_at = ? WHERE id = ?", (now, log_id))
        return recorded

    def complete_cached(self, seg_id: int, key: str) -> Optional[bool]:
        """Record the cached audio of `key` for segment `seg_id` -> True; None when there is no cache entry
        whose file is there (synthesize it), False when the segment no longer waits for audio. The entry is
        locked while it is recorded, so removing it (jobs.queue.removal) either waits for this or is seen."""
        if self.cached(key) is None:  # a miss costs no write transaction
            return None
        with self.tx() as c:
            row = c.execute("SELECT path, sample_rate, samples, seed_used FROM audio_cache WHERE key = ?"
                            + self.store.for_update, (key,)).fetchone()
            if row is None or not Path(row[0]).is_file():
                return None
            path, sample_rate, samples, seed_used = row
            cur = c.execute("""UPDATE segments SET state = 'done', key = ?, audio_path = ?, duration_s = ?,
                               seed_used = ?, worker_id = NULL, lease_expires = NULL, last_error = NULL,
                               updated_at = ? WHERE id = ? AND state IN ('leased', 'queued')""",
                            (key, path, samples / float(sample_rate), seed_used, _now(), seg_id))
        return cur.rowcount == 1

    def fail(self, seg_id: int, error: str, retry: bool = True, guard: bool = False) -> str:
        """Record a failed attempt: back to the queue, or `failed` when out of attempts / not retryable.

        `guard=True` counts a runaway/silence guard failure (the next attempt uses another seed).
        Returns the new state.
        """
        with self.tx() as c:
            row = c.execute("SELECT attempts, state FROM segments WHERE id = ?" + self.store.for_update,
                            (seg_id,)).fetchone()
            if row is None or row[1] not in ("leased", "queued"):
                return row[1] if row else "missing"
            final = (not retry) or row[0] >= self.max_attempts
            state = "failed" if final else "queued"
            msg = f"{error} (gave up after {row[0]} attempts)" if final and retry else error
            c.execute("""UPDATE segments SET state = ?, last_error = ?, worker_id = NULL, lease_expires = NULL,
                         guard_failures = guard_failures + ?, updated_at = ? WHERE id = ?""",
                      (state, msg, 1 if guard else 0, _now(), seg_id))
        return state

    def fail_job(self, job_id: str, error: str) -> None:
        """A job-level error (e.g. unknown voice): the job fails, its unfinished segments too."""
        now = _now()
        with self.tx() as c:
            c.execute("""UPDATE segments SET state = 'failed', last_error = ?, worker_id = NULL, lease_expires = NULL,
                         updated_at = ? WHERE job_id = ? AND state IN ('queued', 'leased')""", (error, now, job_id))
            c.execute("""UPDATE jobs SET state = 'failed', error = ?, updated_at = ?, finished_at = ?,
                         assembly_worker = NULL WHERE id = ?""", (error, now, now, job_id))
            self._event(c, job_id, f"failed: {error}", level="error")

    def synth_started(self, worker_id: str, items: Sequence[tuple[str, int]]) -> list[int]:
        """Log that syntheses of (key, segment id) begin; returns log ids for `synth_finished`."""
        now = _now()
        with self.tx() as c:
            return [c.execute("""INSERT INTO synth_log (key, segment_id, worker_id, started_at) VALUES (?, ?, ?, ?)
                                 RETURNING id""", (k, sid, worker_id, now)).fetchone()[0] for k, sid in items]

    def synth_finished(self, log_ids: Sequence[int]) -> None:
        if log_ids:
            with self.tx() as c:
                c.execute(f"UPDATE synth_log SET finished_at = ? WHERE id IN ({','.join('?' * len(log_ids))})",
                          [_now()] + list(log_ids))

    def recent_syntheses(self, limit: int) -> list[dict]:
        """The `limit` last syntheses that ended and whose audio is recorded: `started_at`, `finished_at`
        and the seconds of audio they made (`audio_s`), newest first."""
        rows = self._rows("""SELECT l.started_at, l.finished_at, c.samples, c.sample_rate FROM synth_log l
                             JOIN audio_cache c ON c.key = l.key WHERE l.finished_at IS NOT NULL
                             ORDER BY l.id DESC LIMIT ?""", [limit])
        return [{"started_at": r["started_at"], "finished_at": r["finished_at"],
                 "audio_s": r["samples"] / r["sample_rate"]} for r in rows]

    # -- job completion --------------------------------------------------------------------
    def ready_jobs(self, worker_id: Optional[str] = None) -> list[str]:
        """Running jobs with nothing queued or leased and no live assembly lease (but `worker_id`'s own: an
        assembly of that worker that stopped without ending its job)."""
        return [r["id"] for r in self._rows(
            """SELECT j.id FROM jobs j WHERE j.state IN ('queued', 'running')
               AND NOT EXISTS (SELECT 1 FROM segments s WHERE s.job_id = j.id AND s.state IN ('queued', 'leased'))
               AND (j.assembly_worker IS NULL OR j.assembly_expires < ? OR j.assembly_worker = ?)
               ORDER BY j.priority DESC, j.created_at""", [_now(), worker_id])]

    def finish_job(self, job_id: str, state: str, output_dir: Optional[str] = None, error: Optional[str] = None,
                   at: Optional[float] = None):
        """End a job in `state` (its finished_at: `at`, e.g. the time its manifest says; default now)."""
        assert state in TERMINAL, state
        now = _now() if at is None else at
        with self.tx() as c:
            c.execute("""UPDATE jobs SET state = ?, output_dir = COALESCE(?, output_dir), error = ?,
                         assembly_worker = NULL, assembly_expires = NULL, updated_at = ?, finished_at = ?
                         WHERE id = ? AND state IN ('queued', 'running')""", (state, output_dir, error, now, now, job_id))
            self._event(c, job_id, f"{state}" + (f": {error}" if error else ""),
                        level="info" if state == "done" else "warning")

    # -- user commands ---------------------------------------------------------------------
    def cancel(self, job_id: str) -> None:
        job = self.job(job_id)
        if job["state"] in TERMINAL:
            raise QueueError(f"job {job_id} is already {job['state']}; nothing to cancel")
        now = _now()
        with self.tx() as c:
            c.execute("""UPDATE segments SET state = 'cancelled', worker_id = NULL, lease_expires = NULL, updated_at = ?
                         WHERE job_id = ? AND state IN ('queued', 'leased')""", (now, job_id))
            c.execute("""UPDATE jobs SET state = 'cancelled', assembly_worker = NULL, updated_at = ?, finished_at = ?
                         WHERE id = ?""", (now, now, job_id))
            self._event(c, job_id, "cancelled by user", level="warning")

    def retry(self, job_id: str) -> int:
        """Requeue a job's failed and cancelled segments with fresh attempts; returns how many."""
        job = self.job(job_id)
        if job["state"] in ACTIVE:
            raise QueueError(f"job {job_id} is still {job['state']}; retry applies to failed/partial/cancelled jobs")
        _work_kept(job, "retried")
        with self.tx() as c:
            n = c.execute("""UPDATE segments SET state = 'queued', attempts = 0, guard_failures = 0, lost = 0,
                             updated_at = ? WHERE job_id = ? AND state IN ('failed', 'cancelled')""",
                          (_now(), job_id)).rowcount
            c.execute("""UPDATE jobs SET state = 'queued', error = NULL, finished_at = NULL, assembly_attempts = 0
                         WHERE id = ?""", (job_id,))
            self._event(c, job_id, f"retry: {n} segments requeued")
        return n

    def redo(self, job_id: str, index: int, seed: Optional[int] = None) -> int:
        """Re-render segment `index` (0-based, as in the manifest) with `seed` (random if None)."""
        _work_kept(self.job(job_id), "redone")
        seed = random.randrange(1, 2**31 - 1) if seed is None else int(seed)
        with self.tx() as c:
            n = c.execute("""UPDATE segments SET state = 'queued', seed = ?, seed_used = NULL, attempts = 0,
                             guard_failures = 0, lost = 0, key = NULL, audio_path = NULL, last_error = NULL,
                             worker_id = NULL, lease_expires = NULL, updated_at = ?
                             WHERE job_id = ? AND idx = ?""", (seed, _now(), job_id, index)).rowcount
            if n == 0:
                raise QueueError(f"job {job_id} has no segment {index}: see its manifest.json for segment indexes")
            c.execute("""UPDATE jobs SET state = 'queued', error = NULL, finished_at = NULL, assembly_worker = NULL,
                         assembly_attempts = 0 WHERE id = ?""", (job_id,))
            self._event(c, job_id, f"redo segment {index} with seed {seed}", segment_idx=index)
        return seed

    # -- log -------------------------------------------------------------------------------
    @staticmethod
    def _event(c, job_id, message, level="info", segment_idx=None):
        c.execute("INSERT INTO events (job_id, segment_idx, ts, level, message) VALUES (?, ?, ?, ?, ?)",
                  (job_id, segment_idx, _now(), level, message))

    def event(self, job_id: Optional[str], message: str, level: str = "info", segment_idx: Optional[int] = None):
        with self.tx() as c:
            self._event(c, job_id, message, level, segment_idx)

    def events(self, job_id: str, limit: int = 1000) -> list[dict]:
        return self._rows("SELECT * FROM events WHERE job_id = ? ORDER BY id DESC LIMIT ?", [job_id, limit])[::-1]
