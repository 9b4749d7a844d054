"""The queue's tables and their numbered schema steps (recorded in `migrations`).

Tables: `jobs`, `chapters`, `segments`, `audio_cache` (content key -> audio file), `events` (the
job log), `synth_log` (one row per synthesis of a key, for audits), `inbox_files` (watched folder)
`workers` (who holds leases: host, pid, process start, for taking back a dead worker's leases
at once), `submissions` (idempotency keys of submits: jobs.queue.submissions) and `daemons` (the daemons
sharing the queue and their spool folders: jobs.queue.daemons). `jobs.assembly_attempts`:
jobs.queue.assembly; `jobs.work_removed_at`, `jobs.removed_counts`: jobs.queue.removal. `positions`: where the
listener stopped in each book (jobs.queue.positions); the index `segments_progress` serves a job's totals and
finishes (jobs.queue.progress) without reading its text. DDL says `{id}` and `{real}` where the two databases
spell a type differently.
"""
from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (1, "jobs, chapters, segments, audio cache, events", [
        """CREATE TABLE jobs (id TEXT PRIMARY KEY, state TEXT NOT NULL, priority INTEGER NOT NULL DEFAULT 0,
            spec TEXT NOT NULL, title TEXT, author TEXT, sources TEXT, meta TEXT, model TEXT, error TEXT,
            output_dir TEXT, assembly_worker TEXT, assembly_expires {real},
            created_at {real}, updated_at {real}, finished_at {real})""",
        "CREATE TABLE chapters (job_id TEXT NOT NULL, idx INTEGER NOT NULL, title TEXT, PRIMARY KEY (job_id, idx))",
        """CREATE TABLE segments (id {id}, job_id TEXT NOT NULL, idx INTEGER NOT NULL,
            chapter_idx INTEGER NOT NULL, text TEXT NOT NULL, original TEXT, pause_after_ms INTEGER NOT NULL DEFAULT 0,
            metadata TEXT, seed BIGINT NOT NULL, seed_used BIGINT, state TEXT NOT NULL DEFAULT 'queued',
            attempts INTEGER NOT NULL DEFAULT 0, guard_failures INTEGER NOT NULL DEFAULT 0, last_error TEXT,
            worker_id TEXT, lease_expires {real}, key TEXT, audio_path TEXT, duration_s {real}, updated_at {real},
            UNIQUE (job_id, idx))""",
        "CREATE INDEX segments_state ON segments (state, job_id, idx)",
        "CREATE INDEX segments_key ON segments (key)",
        "CREATE INDEX jobs_state ON jobs (state, priority, created_at)",
        """CREATE TABLE audio_cache (key TEXT PRIMARY KEY, path TEXT NOT NULL, sample_rate INTEGER NOT NULL,
            samples BIGINT NOT NULL, seed_used BIGINT, created_at {real})""",
        """CREATE TABLE events (id {id}, job_id TEXT, segment_idx INTEGER,
            ts {real} NOT NULL, level TEXT NOT NULL, message TEXT NOT NULL)""",
        "CREATE INDEX events_job ON events (job_id, id)",
        """CREATE TABLE synth_log (id {id}, key TEXT NOT NULL, segment_id BIGINT,
            worker_id TEXT, started_at {real} NOT NULL, finished_at {real})""",
        "CREATE INDEX synth_log_key ON synth_log (key)",
    ]),
    (2, "watched inbox files", [
        """CREATE TABLE inbox_files (sha256 TEXT PRIMARY KEY, name TEXT NOT NULL, job_id TEXT, state TEXT NOT NULL,
            path TEXT, sidecar TEXT, reason TEXT, taken_at {real}, finished_at {real})""",
    ]),
    (3, "lease holders (host, pid, process start) and leases lost to dead workers", [
        """CREATE TABLE workers (id TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, started TEXT,
            seen_at {real})""",
        "CREATE INDEX workers_host ON workers (host)",
        "ALTER TABLE segments ADD COLUMN lost INTEGER NOT NULL DEFAULT 0",
    ]),
    (4, "idempotent submits (jobs.submissions)", [
        "CREATE TABLE submissions (key TEXT PRIMARY KEY, job_id TEXT NOT NULL, holder TEXT, claimed_at {real})",
    ]),
    (5, "assembly attempts per job (jobs.queue.assembly)", [
        "ALTER TABLE jobs ADD COLUMN assembly_attempts INTEGER NOT NULL DEFAULT 0",
    ]),
    (6, "a job's segments by chapter (books follow their chapters, not every segment row)", [
        "CREATE INDEX segments_job ON segments (job_id, chapter_idx, idx)",
    ]),
    (7, "daemons sharing the queue and their spool folders (jobs.queue.daemons)", [
        """CREATE TABLE daemons (id TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, started TEXT,
            home TEXT NOT NULL, spool TEXT, instance TEXT, started_at {real}, seen_at {real})""",
    ]),
    (8, "finished jobs' working files removed (jobs.queue.removal): when, and the segment rows that went", [
        "ALTER TABLE jobs ADD COLUMN work_removed_at {real}",
        "ALTER TABLE jobs ADD COLUMN removed_counts TEXT",
        "CREATE INDEX segments_audio ON segments (audio_path)",
        "CREATE INDEX audio_cache_path ON audio_cache (path)",
    ]),
    (9, "where the listener stopped in each book (jobs.queue.positions); a job's totals and finishes by index", [
        """CREATE TABLE positions (job_id TEXT PRIMARY KEY, position_s {real} NOT NULL, chapter INTEGER,
            updated_at {real} NOT NULL)""",
        "CREATE INDEX segments_progress ON segments (job_id, state, updated_at, duration_s, pause_after_ms)",
    ]),
]

LATEST = MIGRATIONS[-1][0]


class SchemaTooNew(Exception):
    """The database was set up by a newer tts-appliance than this one."""


def migrate(store, where: str) -> None:
    """Apply the schema steps `store` lacks (one writer at a time); refuse a newer schema. A schema that
    is up to date is only read: opening a queue neither waits for nor blocks another writer."""
    if store.has_table("migrations") and not pending(store, where):
        return
    with store.tx(lock=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS migrations (id INTEGER PRIMARY KEY, name TEXT, applied_at "
                  + store.ddl["real"] + ")")
        for number, name, steps in pending(c, where):
            for sql in steps:
                c.execute(sql.format(**store.ddl))
            c.execute("INSERT INTO migrations (id, name, applied_at) VALUES (?, ?, ?)", (number, name, time.time()))
            log.info("queue %s: applied migration %d (%s)", where, number, name)


def pending(store, where: str) -> list[tuple[int, str, list[str]]]:
    """The schema steps the database lacks; SchemaTooNew when it has one this version does not know."""
    done = {r[0] for r in store.execute("SELECT id FROM migrations").fetchall()}
    if done and max(done) > LATEST:
        raise SchemaTooNew(f"the queue database {where} has schema version {max(done)}, newer than this "
                           f"tts-appliance knows ({LATEST}): upgrade tts-appliance on this host, or point "
                           f"jobs.queue at another database")
    return [m for m in MIGRATIONS if m[0] not in done]
