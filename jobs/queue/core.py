"""Durable job queue: SQLite (WAL, `BEGIN IMMEDIATE` claims) or PostgreSQL (`SKIP LOCKED` claims).

    q = Queue(paths.db)                      # a SQLite file (the default), or
    q = Queue("postgresql://tts@db/tts")     # one database several hosts share (jobs.queue)
    with Queue.reading(paths.db) as q: ...   # a report: read only, nothing created (None: no queue yet)

Both hold the same tables (`schema`) with the same semantics: leases that expire, attempts and
retries, a `dead` end state (`failed`) with the last error, each segment's audio recorded exactly
once. Several processes may share one queue: each opens its own `Queue`. Only this package touches
the tables: claims and leases are in `leases.Leases`, results and the job log in `records.Records`,
assembly attempts in `assembly.Assemblies`, the inbox's files in `inbox.InboxFiles`, idempotent
submits in `submissions.Submissions`, the daemons sharing the queue in `daemons.Daemons`, what goes
when a job's working files are removed or the job is deleted in `removal.Removal`, what a job's
progress and length are read from in `progress.Progress`, where the listener stopped in each book in
`positions.Positions`.
"""
from __future__ import annotations

import json
import logging
import sqlite3
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Optional, Protocol, Sequence

from jobs.queue.assembly import Assemblies
from jobs.queue.daemons import Daemons
from jobs.queue.inbox import InboxFiles
from jobs.queue.leases import Leases
from jobs.queue.positions import Positions
from jobs.queue.progress import Progress
from jobs.queue.records import ACTIVE, TERMINAL, NoQueue, QueueError, Records
from jobs.queue.removal import Removal
from jobs.queue.schema import SchemaTooNew, migrate, pending
from jobs.queue.location import is_url, parse_location, redact
from jobs.queue.store import QueueUnavailable, open_store
from jobs.queue.submissions import Submissions

log = logging.getLogger(__name__)

JOB_STATES = ("queued", "running", "done", "failed", "cancelled", "partial")
INSERT_ROWS = 500  # segment rows per write transaction of add_job (other writers wait milliseconds, not seconds)


def _now() -> float:
    return time.time()


class JobSettings(Protocol):
    """What the queue keeps of a job's settings (`jobs.settings.JobSpec`, which stands above the queue)."""

    priority: int
    title: Optional[str]
    author: Optional[str]
    model: Optional[str]
    seed: int

    def to_json(self) -> str: ...


class Queue(Leases, Records, Assemblies, InboxFiles, Submissions, Daemons, Removal, Progress, Positions):
    """One connection to the queue database. Not thread-safe: one per thread/process.

    `location` is a SQLite file path or a `postgresql://` URL, parsed strictly (`location.parse_location`:
    a string that is neither is refused). Start-up problems (unreachable
    server, wrong credentials, a SQLite file that cannot be opened, a schema from a newer version)
    raise `QueueError` in one line. `read_only` (reports; see `reading`): the database is neither
    created nor migrated and refuses writes; NoQueue where no queue was made yet."""

    def __init__(self, location: str | Path, max_attempts: int = 3, busy_timeout_s: float = 30.0,
                 max_lost: int = 25, read_only: bool = False):
        try:
            location = parse_location(location)
        except ValueError as exc:
            raise QueueError(str(exc)) from None
        self.path = location
        self.where = redact(str(location))
        self.max_attempts, self.max_lost = int(max_attempts), int(max_lost)
        if read_only and not is_url(location) and not Path(location).exists():
            raise NoQueue(f"no queue in {self.where} yet")
        if read_only and not is_url(location) and not Path(location).is_file():
            raise QueueError(f"cannot open the queue database {self.where}: not a file")
        try:
            self.store = open_store(location, busy_timeout_s, read_only=read_only)
            if read_only:
                made = self.store.has_table("migrations")
                if made:
                    pending(self.store, self.where)  # SchemaTooNew: a newer tts-appliance's tables are not read
            else:
                migrate(self.store, self.where)
        except (QueueUnavailable, SchemaTooNew, sqlite3.Error) as exc:
            if getattr(self, "store", None) is not None:
                self.store.close()
            if isinstance(exc, sqlite3.Error):  # not a database, not readable, locked past the busy timeout
                raise QueueError(f"cannot open the queue database {self.where}: {exc}") from None
            raise QueueError(str(exc)) from None
        if read_only and not made:
            self.store.close()
            raise NoQueue(f"no queue in {self.where} yet (a database without the queue's tables)")

    @classmethod
    @contextmanager
    def reading(cls, location: str | Path, timeout_s: float = 2.0) -> Iterator[Optional["Queue"]]:
        """The queue at `location` for a report (`tts-appliance info`, preview's measured rate), read
        only: nothing is created or migrated. Yields None where no queue was made yet; QueueError when it
        cannot be opened, QueueUnavailable when it goes away while read (both in one line); `timeout_s`
        bounds the wait for a SQLite lock or a PostgreSQL connection."""
        try:
            queue = cls(location, busy_timeout_s=timeout_s, read_only=True)
        except NoQueue:
            queue = None
        try:
            yield queue
        finally:
            if queue is not None:
                queue.close()

    @property
    def conn(self):
        """The raw database connection (sqlite3 or psycopg)."""
        return self.store.conn

    def close(self) -> None:
        self.store.close()

    # -- plumbing --------------------------------------------------------------------------
    @contextmanager
    def tx(self):
        """A write transaction; yields the store (`execute(sql, args)` with `?` placeholders)."""
        with self.store.tx() as c:
            yield c

    def _rows(self, sql: str, params: Sequence | dict = ()) -> list[dict]:
        return self.store.rows(sql, params)

    def migrations(self) -> list[dict]:
        return self._rows("SELECT * FROM migrations ORDER BY id")

    # -- jobs ------------------------------------------------------------------------------
    def add_job(self, spec: JobSettings, chapters: Sequence[tuple[str, Sequence]], sources: Iterable[str] = (),
                meta: Optional[dict] = None, job_id: Optional[str] = None) -> str:
        """Queue a job: `chapters` is [(title, [SegmentText, ...]), ...]. Returns the job id (`job_id`:
        one reserved earlier, `claim_submission`).

        A book of many thousand segments must not hold the (SQLite: only) write lock for seconds while
        workers record audio: the rows are built first, written `INSERT_ROWS` at a time in short
        transactions, and the job row comes last, so no worker sees (claims, assembles) half a job."""
        if not any(segs for _, segs in chapters):
            raise QueueError("the document has no text to speak (no segments)")
        job_id = job_id or uuid.uuid4().hex[:12]
        now = _now()
        segments = [(job_id, idx, ci, s.text, s.original, int(s.pause_after_ms or 0),
                     json.dumps(getattr(s, "metadata", None) or {}, default=str), spec.seed, now)
                    for idx, (ci, s) in enumerate((ci, s) for ci, (_, segs) in enumerate(chapters) for s in segs)]
        try:
            with self.tx() as c:
                self._drop_unqueued(c, job_id)
                c.executemany("INSERT INTO chapters (job_id, idx, title) VALUES (?, ?, ?)",
                              [(job_id, ci, title) for ci, (title, _) in enumerate(chapters)])
            for start in range(0, len(segments), INSERT_ROWS):
                with self.tx() as c:
                    c.executemany("""INSERT INTO segments (job_id, idx, chapter_idx, text, original, pause_after_ms,
                                     metadata, seed, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                                  segments[start:start + INSERT_ROWS])
            with self.tx() as c:
                c.execute("""INSERT INTO jobs (id, state, priority, spec, title, author, sources, meta, model,
                             created_at, updated_at) VALUES (?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                          (job_id, spec.priority, spec.to_json(), spec.title, spec.author, json.dumps(list(sources)),
                           json.dumps(meta or {}), spec.model, now, now))
                self._event(c, job_id, f"submitted: {len(segments)} segments in {len(chapters)} chapters")
        except BaseException:
            try:
                with self.tx() as c:
                    self._drop_unqueued(c, job_id)
            except Exception as exc:  # noqa: BLE001 - the first error is the one to report; a retry cleans up
                log.warning("job %s: could not remove its half-written rows (%s); the next add of it does", job_id, exc)
            raise
        return job_id

    @staticmethod
    def _drop_unqueued(c, job_id: str) -> None:
        """Remove chapter and segment rows of `job_id` that no job row owns (an add_job that failed half-way)."""
        for table in ("segments", "chapters"):
            c.execute(f"DELETE FROM {table} WHERE job_id = ? AND NOT EXISTS (SELECT 1 FROM jobs WHERE id = ?)",
                      (job_id, job_id))

    def add_failed_job(self, spec: JobSettings, sources: Iterable[str], error: str, job_id: Optional[str] = None) -> str:
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

    def job_from_source(self, source: str, since: float) -> Optional[dict]:
        """A job made from the file `source` (its resolved path, as in the job's `sources`) since `since`."""
        for job in self._rows("SELECT * FROM jobs WHERE created_at >= ? ORDER BY created_at", [since]):
            if source in json.loads(job["sources"] or "[]"):
                return job
        return None

    def chapters(self, job_id: str) -> list[dict]:
        return self._rows("SELECT * FROM chapters WHERE job_id = ? ORDER BY idx", [job_id])

    def segments(self, job_id: str, chapter_idx: Optional[int] = None, state: Optional[str] = None,
                 limit: Optional[int] = None) -> list[dict]:
        """A job's segment rows in order; only those of one chapter and/or in one state, at most `limit`."""
        where, args = ["job_id = ?"], [job_id]
        for col, value in (("chapter_idx", chapter_idx), ("state", state)):
            if value is not None:
                where.append(f"{col} = ?")
                args.append(value)
        tail = f" LIMIT {int(limit)}" if limit else ""
        return self._rows(f"SELECT * FROM segments WHERE {' AND '.join(where)} ORDER BY idx{tail}", args)

    def pending_chapters(self, job_id: str) -> dict[int, int]:
        """{chapter index: segments not ended (queued or leased)} of a job, chapters with none left out: what
        a book following its chapters asks (reads only the pending rows, not the whole job)."""
        rows = self.store.execute("""SELECT chapter_idx, COUNT(*) FROM segments WHERE state IN ('queued', 'leased')
                                     AND job_id = ? GROUP BY chapter_idx""", [job_id]).fetchall()
        return {int(c): int(n) for c, n in rows}

    def counts(self, job_id: Optional[str] = None) -> dict:
        """Segment counts by state, for one job (its rows removed with its working files included:
        `removed_totals`) or of the rows there are."""
        where, args = ("WHERE job_id = ?", [job_id]) if job_id else ("", [])
        rows = self.store.execute(f"SELECT state, COUNT(*) FROM segments {where} GROUP BY state", args)
        out = {"queued": 0, "leased": 0, "done": 0, "failed": 0, "cancelled": 0}
        out.update(dict(rows.fetchall()))
        for state, gone in (self.removed_totals(job_id) if job_id else {}).items():
            out[state] = out.get(state, 0) + gone["segments"]
        return out

    def job_audio(self, job_id: str) -> tuple[float, float]:
        """(seconds of audio the job's segments have, those of its longest chapter): what its book holds."""
        rows = self.store.execute("""SELECT SUM(duration_s) FROM segments WHERE job_id = ? AND state = 'done'
                                     GROUP BY chapter_idx""", [job_id]).fetchall()
        seconds = [float(r[0] or 0.0) for r in rows]
        return sum(seconds), max(seconds, default=0.0)

    def job_counts(self) -> dict:
        """Job counts by state (states without jobs are left out)."""
        return dict(self.store.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())
