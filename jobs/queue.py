"""Durable job queue in SQLite (WAL, `BEGIN IMMEDIATE` claims, leases).

Tables: `jobs`, `chapters`, `segments`, `audio_cache` (content key -> audio file), `events`
(the job log), `synth_log` (one row per synthesis of a key, for audits), `inbox_files`
(watched folder) and `submissions` (idempotency keys of submits: jobs.submissions). Schema steps are numbered and recorded in `migrations`.

A worker *claims* segments: they get its id and a lease expiry; a heartbeat renews the lease.
A lease that expires (worker killed, hung) returns the segment to the queue; every claim counts
as an attempt and a segment that reaches `max_attempts` ends `failed` with its last error.
Several processes may share one database file: each opens its own `Queue`.
"""
from __future__ import annotations

import json
import logging
import random
import sqlite3
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Optional, Sequence

import sqlite_utils

from jobs.settings import JobSpec

log = logging.getLogger(__name__)

JOB_STATES = ("queued", "running", "done", "failed", "cancelled", "partial")
TERMINAL = ("done", "failed", "cancelled", "partial")
ACTIVE = ("queued", "running")

MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (1, "jobs, chapters, segments, audio cache, events", [
        """CREATE TABLE jobs (id TEXT PRIMARY KEY, state TEXT NOT NULL, priority INTEGER NOT NULL DEFAULT 0,
            spec TEXT NOT NULL, title TEXT, author TEXT, sources TEXT, meta TEXT, model TEXT, error TEXT,
            output_dir TEXT, assembly_worker TEXT, assembly_expires REAL,
            created_at REAL, updated_at REAL, finished_at REAL)""",
        "CREATE TABLE chapters (job_id TEXT NOT NULL, idx INTEGER NOT NULL, title TEXT, PRIMARY KEY (job_id, idx))",
        """CREATE TABLE segments (id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, idx INTEGER NOT NULL,
            chapter_idx INTEGER NOT NULL, text TEXT NOT NULL, original TEXT, pause_after_ms INTEGER NOT NULL DEFAULT 0,
            metadata TEXT, seed INTEGER NOT NULL, seed_used INTEGER, state TEXT NOT NULL DEFAULT 'queued',
            attempts INTEGER NOT NULL DEFAULT 0, guard_failures INTEGER NOT NULL DEFAULT 0, last_error TEXT,
            worker_id TEXT, lease_expires REAL, key TEXT, audio_path TEXT, duration_s REAL, updated_at REAL,
            UNIQUE (job_id, idx))""",
        "CREATE INDEX segments_state ON segments (state, job_id, idx)",
        "CREATE INDEX segments_key ON segments (key)",
        "CREATE INDEX jobs_state ON jobs (state, priority, created_at)",
        """CREATE TABLE audio_cache (key TEXT PRIMARY KEY, path TEXT NOT NULL, sample_rate INTEGER NOT NULL,
            samples INTEGER NOT NULL, seed_used INTEGER, created_at REAL)""",
        """CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT, segment_idx INTEGER,
            ts REAL NOT NULL, level TEXT NOT NULL, message TEXT NOT NULL)""",
        "CREATE INDEX events_job ON events (job_id, id)",
        """CREATE TABLE synth_log (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, segment_id INTEGER,
            worker_id TEXT, started_at REAL NOT NULL, finished_at REAL)""",
        "CREATE INDEX synth_log_key ON synth_log (key)",
    ]),
    (2, "watched inbox files", [
        """CREATE TABLE inbox_files (sha256 TEXT PRIMARY KEY, name TEXT NOT NULL, job_id TEXT, state TEXT NOT NULL,
            path TEXT, sidecar TEXT, reason TEXT, taken_at REAL, finished_at REAL)""",
    ]),
    (3, "idempotent submits (jobs.submissions)", [
        """CREATE TABLE submissions (key TEXT PRIMARY KEY, job_id TEXT NOT NULL, holder TEXT, claimed_at REAL)""",
    ]),
]


class QueueError(Exception):
    """A queue operation the user asked for cannot be done (message says why)."""


def _now() -> float:
    return time.time()


class Queue:
    """One connection to the queue database. Not thread-safe: one per thread/process."""

    def __init__(self, path: str | Path, max_attempts: int = 3, busy_timeout_s: float = 30.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_attempts = int(max_attempts)
        conn = sqlite3.connect(str(self.path), timeout=busy_timeout_s, isolation_level=None,
                               check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        self.conn = conn
        self.db = sqlite_utils.Database(conn)
        self._migrate()

    def close(self) -> None:
        self.conn.close()

    # -- plumbing --------------------------------------------------------------------------
    @contextmanager
    def tx(self):
        """A write transaction taken with BEGIN IMMEDIATE (waits up to the busy timeout)."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def _rows(self, sql: str, params: Sequence | dict = ()) -> list[dict]:
        return list(self.db.query(sql, params))

    def _migrate(self) -> None:
        with self.tx() as c:
            c.execute("CREATE TABLE IF NOT EXISTS migrations (id INTEGER PRIMARY KEY, name TEXT, applied_at REAL)")
            done = {r[0] for r in c.execute("SELECT id FROM migrations")}
            for number, name, steps in MIGRATIONS:
                if number in done:
                    continue
                for sql in steps:
                    c.execute(sql)
                c.execute("INSERT INTO migrations (id, name, applied_at) VALUES (?, ?, ?)", (number, name, _now()))
                log.info("queue %s: applied migration %d (%s)", self.path, number, name)

    def migrations(self) -> list[dict]:
        return self._rows("SELECT * FROM migrations ORDER BY id")

    # -- jobs ------------------------------------------------------------------------------
    def add_job(self, spec: JobSpec, chapters: Sequence[tuple[str, Sequence]], sources: Iterable[str] = (),
                meta: Optional[dict] = None, job_id: Optional[str] = None) -> str:
        """Queue a job: `chapters` is [(title, [SegmentText, ...]), ...]. Returns the job id (`job_id`:
        one reserved earlier, jobs.submissions)."""
        if not any(segs for _, segs in chapters):
            raise QueueError("the document has no text to speak (no segments)")
        job_id = job_id or uuid.uuid4().hex[:12]
        now = _now()
        with self.tx() as c:
            c.execute("""INSERT INTO jobs (id, state, priority, spec, title, author, sources, meta, model,
                         created_at, updated_at) VALUES (?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                      (job_id, spec.priority, spec.to_json(), spec.title, spec.author, json.dumps(list(sources)),
                       json.dumps(meta or {}), spec.model, now, now))
            idx = 0
            for ci, (title, segs) in enumerate(chapters):
                c.execute("INSERT INTO chapters (job_id, idx, title) VALUES (?, ?, ?)", (job_id, ci, title))
                for s in segs:
                    c.execute("""INSERT INTO segments (job_id, idx, chapter_idx, text, original, pause_after_ms,
                                 metadata, seed, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                              (job_id, idx, ci, s.text, s.original, int(s.pause_after_ms or 0),
                               json.dumps(getattr(s, "metadata", None) or {}, default=str), spec.seed, now))
                    idx += 1
            self._event(c, job_id, f"submitted: {idx} segments in {len(chapters)} chapters")
        return job_id

    def add_failed_job(self, spec: JobSpec, sources: Iterable[str], error: str, job_id: Optional[str] = None) -> str:
        """Record a job that failed before it had segments (bad input), so status/logs show why."""
        job_id = job_id or uuid.uuid4().hex[:12]
        now = _now()
        with self.tx() as c:
            c.execute("""INSERT INTO jobs (id, state, priority, spec, title, author, sources, meta, model, error,
                         created_at, updated_at, finished_at) VALUES (?, 'failed', ?, ?, ?, ?, ?, '{}', ?, ?, ?, ?, ?)""",
                      (job_id, spec.priority, spec.to_json(), spec.title, spec.author, json.dumps(list(sources)),
                       spec.model, error, now, now, now))
            self._event(c, job_id, f"failed: {error}", level="error")
        return job_id

    def job(self, job_id: str) -> dict:
        rows = self._rows("SELECT * FROM jobs WHERE id = ?", [job_id])
        if not rows:
            raise QueueError(f"no job {job_id!r}: see `tts-appliance list` for job ids")
        return rows[0]

    def jobs(self, states: Optional[Sequence[str]] = None) -> list[dict]:
        if states:
            marks = ",".join("?" * len(states))
            return self._rows(f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY created_at", list(states))
        return self._rows("SELECT * FROM jobs ORDER BY created_at")

    def chapters(self, job_id: str) -> list[dict]:
        return self._rows("SELECT * FROM chapters WHERE job_id = ? ORDER BY idx", [job_id])

    def segments(self, job_id: str) -> list[dict]:
        return self._rows("SELECT * FROM segments WHERE job_id = ? ORDER BY idx", [job_id])

    def counts(self, job_id: Optional[str] = None) -> dict:
        """Segment counts by state, for one job or all."""
        where, args = ("WHERE job_id = ?", [job_id]) if job_id else ("", [])
        rows = self.conn.execute(f"SELECT state, COUNT(*) FROM segments {where} GROUP BY state", args)
        out = {"queued": 0, "leased": 0, "done": 0, "failed": 0, "cancelled": 0}
        out.update(dict(rows.fetchall()))
        return out

    def job_counts(self) -> dict:
        """Job counts by state (states without jobs are left out)."""
        return dict(self.conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())

    # -- claims and leases -------------------------------------------------------------------
    def _expire(self, c, now: float) -> None:
        """Return expired leases to the queue (or fail them at max attempts)."""
        c.execute("""UPDATE segments SET state = CASE WHEN attempts >= ? THEN 'failed' ELSE 'queued' END,
                     last_error = 'lease of worker ' || COALESCE(worker_id, '?') || ' expired (worker stopped or hung)'
                       || CASE WHEN attempts >= ? THEN '; gave up after ' || attempts || ' attempts' ELSE '' END,
                     worker_id = NULL, lease_expires = NULL, updated_at = ?
                     WHERE state = 'leased' AND lease_expires < ?""", (self.max_attempts, self.max_attempts, now, now))

    def claim(self, worker_id: str, limit: int, lease_s: float, model: Optional[str] = None,
              min_priority: Optional[int] = None) -> list[dict]:
        """Lease up to `limit` queued segments, highest job priority first, oldest job first.

        Only jobs whose model is unset or equals `model` are served. Returns segment rows with
        the job's `spec` (JSON) and `priority` joined in.
        """
        now = _now()
        with self.tx() as c:
            self._expire(c, now)
            sql = """SELECT s.id FROM segments s JOIN jobs j ON j.id = s.job_id
                     WHERE s.state = 'queued' AND j.state IN ('queued', 'running')
                       AND (j.model IS NULL OR j.model = ?)"""
            args: list = [model]
            if min_priority is not None:
                sql += " AND j.priority >= ?"
                args.append(min_priority)
            sql += " ORDER BY j.priority DESC, j.created_at, j.id, s.idx LIMIT ?"
            ids = [r[0] for r in c.execute(sql, args + [int(limit)])]
            if not ids:
                return []
            marks = ",".join("?" * len(ids))
            c.execute(f"""UPDATE segments SET state = 'leased', worker_id = ?, lease_expires = ?,
                          attempts = attempts + 1, updated_at = ? WHERE id IN ({marks})""",
                      [worker_id, now + lease_s, now] + ids)
            c.execute(f"""UPDATE jobs SET state = 'running', updated_at = ? WHERE state = 'queued'
                          AND id IN (SELECT job_id FROM segments WHERE id IN ({marks}))""", [now] + ids)
        return self._rows(f"""SELECT s.*, j.spec AS spec, j.priority AS priority FROM segments s
                              JOIN jobs j ON j.id = s.job_id WHERE s.id IN ({marks}) ORDER BY j.priority DESC,
                              j.created_at, j.id, s.idx""", ids)

    def renew(self, worker_id: str, ids: Sequence[int], lease_s: float) -> int:
        """Extend this worker's leases; returns how many are still held."""
        held = 0
        with self.tx() as c:
            if ids:
                marks = ",".join("?" * len(ids))
                held = c.execute(f"""UPDATE segments SET lease_expires = ? WHERE state = 'leased' AND worker_id = ?
                                     AND id IN ({marks})""", [_now() + lease_s, worker_id] + list(ids)).rowcount
            c.execute("UPDATE jobs SET assembly_expires = ? WHERE assembly_worker = ?", (_now() + lease_s, worker_id))
        return held

    def release(self, worker_id: str, ids: Sequence[int]) -> None:
        """Give leased segments back unworked (clean shutdown): the attempt does not count."""
        if not ids:
            return
        marks = ",".join("?" * len(ids))
        with self.tx() as c:
            c.execute(f"""UPDATE segments SET state = 'queued', worker_id = NULL, lease_expires = NULL,
                          attempts = MAX(attempts - 1, 0) WHERE state = 'leased' AND worker_id = ?
                          AND id IN ({marks})""", [worker_id] + list(ids))

    # -- results ---------------------------------------------------------------------------
    def cached(self, key: str) -> Optional[dict]:
        rows = self._rows("SELECT * FROM audio_cache WHERE key = ?", [key])
        return rows[0] if rows and Path(rows[0]["path"]).is_file() else None

    def complete(self, seg_id: int, key: str, path: str, sample_rate: int, samples: int, seed_used: int) -> bool:
        """Record finished audio (already durable on disk) and mark the segment done.

        Returns False when the segment is no longer waiting for audio (cancelled, or done by another).
        """
        now = _now()
        with self.tx() as c:
            c.execute("""INSERT OR REPLACE INTO audio_cache (key, path, sample_rate, samples, seed_used, created_at)
                         VALUES (?, ?, ?, ?, ?, ?)""", (key, str(path), sample_rate, samples, seed_used, now))
            cur = c.execute("""UPDATE segments SET state = 'done', key = ?, audio_path = ?, duration_s = ?,
                               seed_used = ?, worker_id = NULL, lease_expires = NULL, last_error = NULL,
                               updated_at = ? WHERE id = ? AND state IN ('leased', 'queued')""",
                            (key, str(path), samples / float(sample_rate), seed_used, now, seg_id))
        return cur.rowcount == 1

    def fail(self, seg_id: int, error: str, retry: bool = True, guard: bool = False) -> str:
        """Record a failed attempt: back to the queue, or `failed` when out of attempts / not retryable.

        `guard=True` counts a runaway/silence guard failure (the next attempt uses another seed).
        Returns the new state.
        """
        with self.tx() as c:
            row = c.execute("SELECT attempts, state FROM segments WHERE id = ?", (seg_id,)).fetchone()
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
            return [c.execute("INSERT INTO synth_log (key, segment_id, worker_id, started_at) VALUES (?, ?, ?, ?)",
                              (k, sid, worker_id, now)).lastrowid for k, sid in items]

    def synth_finished(self, log_ids: Sequence[int]) -> None:
        if log_ids:
            with self.tx() as c:
                c.execute(f"UPDATE synth_log SET finished_at = ? WHERE id IN ({','.join('?' * len(log_ids))})",
                          [_now()] + list(log_ids))

    # -- job completion --------------------------------------------------------------------
    def ready_jobs(self) -> list[str]:
        """Running jobs with nothing queued or leased and no live assembly lease."""
        return [r["id"] for r in self._rows(
            """SELECT j.id FROM jobs j WHERE j.state IN ('queued', 'running')
               AND NOT EXISTS (SELECT 1 FROM segments s WHERE s.job_id = j.id AND s.state IN ('queued', 'leased'))
               AND (j.assembly_worker IS NULL OR j.assembly_expires < ?)
               ORDER BY j.priority DESC, j.created_at""", [_now()])]

    def begin_assembly(self, job_id: str, worker_id: str, lease_s: float) -> bool:
        """Take the right to assemble a finished job (one worker wins)."""
        now = _now()
        with self.tx() as c:
            cur = c.execute("""UPDATE jobs SET assembly_worker = ?, assembly_expires = ?, state = 'running'
                               WHERE id = ? AND state IN ('queued', 'running')
                               AND (assembly_worker IS NULL OR assembly_expires < ?)
                               AND NOT EXISTS (SELECT 1 FROM segments s WHERE s.job_id = ?
                                               AND s.state IN ('queued', 'leased'))""",
                            (worker_id, now + lease_s, job_id, now, job_id))
        return cur.rowcount == 1

    def finish_job(self, job_id: str, state: str, output_dir: Optional[str] = None, error: Optional[str] = None):
        assert state in TERMINAL, state
        now = _now()
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
        with self.tx() as c:
            n = c.execute("""UPDATE segments SET state = 'queued', attempts = 0, guard_failures = 0, updated_at = ?
                             WHERE job_id = ? AND state IN ('failed', 'cancelled')""", (_now(), job_id)).rowcount
            c.execute("UPDATE jobs SET state = 'queued', error = NULL, finished_at = NULL WHERE id = ?", (job_id,))
            self._event(c, job_id, f"retry: {n} segments requeued")
        return n

    def redo(self, job_id: str, index: int, seed: Optional[int] = None) -> int:
        """Re-render segment `index` (0-based, as in the manifest) with `seed` (random if None)."""
        self.job(job_id)
        seed = random.randrange(1, 2**31 - 1) if seed is None else int(seed)
        with self.tx() as c:
            n = c.execute("""UPDATE segments SET state = 'queued', seed = ?, seed_used = NULL, attempts = 0,
                             guard_failures = 0, key = NULL, audio_path = NULL, last_error = NULL,
                             worker_id = NULL, lease_expires = NULL, updated_at = ?
                             WHERE job_id = ? AND idx = ?""", (seed, _now(), job_id, index)).rowcount
            if n == 0:
                raise QueueError(f"job {job_id} has no segment {index}: see its manifest.json for segment indexes")
            c.execute("""UPDATE jobs SET state = 'queued', error = NULL, finished_at = NULL, assembly_worker = NULL
                         WHERE id = ?""", (job_id,))
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
