"""Watched inbox: books dropped into `inbox/` become jobs.

Life of a file: `inbox/book.txt` -> `processing/book.txt` (job queued) -> `done/<job>/` (source,
sidecar and the output files) or `failed/book.txt` + `failed/book.txt.reason.txt` (also a job that
ended `partial`, with some segments failed: the reason says why and where its audio is; jobs.inbox_filing).
Files are never deleted, only moved.

Only complete files are taken: a file must be unchanged (size and mtime) for `quiet_s` seconds, or
for `closed_quiet_s` after a close-after-write or moved-in event. Links, lock, temp and hidden files
are ignored (logged once, left in place; see jobs.watch_files). A file (or its sidecar) the service may
not read stays in place too: one error line and one failed job saying why, again only once it changes
(a chmod or chown), when it is tried again. The folder is rescanned every tick,
so events are only a hint; `polling=True` uses watchdog's PollingObserver for network mounts. A file
whose content (sha256) was already ingested is not ingested again (unless that earlier job failed).
A sidecar `book.yaml` (same stem) sets voice, language, format, title, author, priority ...; a key it does not
know is ignored, named in one warning and in the job's log.

Parsing runs in a child process under `limits` (jobs.ingest.isolate), up to `limits.parallel` files at
once (jobs.ingest_parallel), each waited for by a pool thread with its own queue connection: the
watcher thread only takes files (checks, duplicate check, move to processing/) one by one and keeps
scanning while they are read. Every file that enters processing/ ends as a job or in failed/ with a
reason: its row in `inbox_files` says `ingesting` until then, and :meth:`InboxWatcher.recover` (run
at start) takes again what a stop or crash left there, failing a file that was interrupted twice.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Optional

from jobs.inbox_filing import collect, to_failed
from jobs.queue import Queue, QueueUnavailable
from jobs.queue.outage import OUTAGE
from jobs.settings import JobSpec, Paths
from jobs.watch_files import (SidecarError, Unreadable, check_readable, companion, entry_problem, ignore_reason,
                              ignored, move_unique, sha256_file, sidecar_for, sidecar_spec)

log = logging.getLogger(__name__)

__all__ = ["InboxWatcher", "ignored", "move_unique", "sha256_file", "sidecar_for"]
RECOVERED = "recovered after an interrupted ingest"  # reason mark of a row taken again once


class InboxWatcher:
    """Turns complete files in `paths.inbox` into jobs and files the results. Call `tick()`
    periodically (or `run(stop_event)`, which also starts a watchdog observer)."""

    def __init__(self, paths: Paths, quiet_s: float = 5.0, closed_quiet_s: float = 1.0, polling: bool = False,
                 defaults: Optional[dict] = None, queue: Optional[Queue] = None, limits=None):
        self.paths = paths.ensure()
        self.limits = limits  # jobs.ingest.isolate.IngestLimits (None: its defaults)
        self.stop_event: Optional[threading.Event] = None  # set by run(); cancels a running ingest
        self._told: set[str] = set()  # names whose reason for being ignored was logged
        self._unreadable = Unreadable()  # files this process may not read, reported once while unchanged
        self.quiet_s, self.closed_quiet_s, self.polling = quiet_s, closed_quiet_s, polling
        self.defaults = dict(defaults or {})
        self.queue = queue or Queue(paths.db)
        self.voices = None  # () -> the engine's voices, when one is at hand: unknown voices fail at submit
        self._seen: dict[str, tuple[int, int, float]] = {}  # name -> (size, mtime_ns, stable since)
        self._closed: dict[str, float] = {}  # name -> time of last close-after-write / moved-in event
        self._lock = threading.Lock()
        self._pool: Optional[ThreadPoolExecutor] = None  # ingests in flight (made at the first tick)
        self._reading: set[Future] = set()

    # -- events (watchdog thread) ---------------------------------------------------------------
    def note_complete(self, path: str | os.PathLike) -> None:
        """A close-after-write or moved-in event for `path`."""
        p = Path(path)
        if p.parent == self.paths.inbox:
            with self._lock:
                self._closed[p.name] = time.time()

    # -- scanning --------------------------------------------------------------------------------
    def ready_files(self, now: Optional[float] = None) -> list[Path]:
        """Inbox files that are complete by the rules above."""
        now = time.time() if now is None else now
        ready, present = [], set()
        for p in sorted(self.paths.inbox.iterdir()):
            try:
                if companion(p) or self._skip(p):
                    continue
                st = p.stat()
            except FileNotFoundError:
                continue
            present.add(p.name)
            sig = (st.st_size, st.st_mtime_ns)
            prev = self._seen.get(p.name)
            if prev is None or prev[:2] != sig:
                self._seen[p.name] = (*sig, now)
                continue
            stable_for = now - prev[2]
            with self._lock:
                closed_at = self._closed.get(p.name)
            closed = closed_at is not None and closed_at >= st.st_mtime
            side = sidecar_for(p)
            side_quiet = side is None or now - side.stat().st_mtime >= min(self.closed_quiet_s, self.quiet_s)
            if side_quiet and (stable_for >= self.quiet_s or (closed and stable_for >= self.closed_quiet_s)):
                ready.append(p)
        for name in set(self._seen) - present:
            self._seen.pop(name, None)
        names = {p.name for p in self.paths.inbox.iterdir()}
        self._told &= names  # a name that comes back is reported again
        self._unreadable.keep_only(names)
        return ready

    def _skip(self, p: Path) -> bool:
        """True (logged once per name) for entries that are never taken: links, folders, lock/temp/hidden."""
        why = ignore_reason(p) or entry_problem(p, self.paths.inbox)
        if why and p.name not in self._told:
            self._told.add(p.name)
            log.info("inbox: ignoring %s: %s; it stays where it is", p.name, why)
        return why is not None

    def tick(self) -> None:
        """Take complete inbox files while fewer than `limits.parallel` are being read (the rest wait in
        the inbox for a later tick), then file away the results of finished jobs."""
        from jobs.ingest.isolate import IngestLimits

        parallel = (self.limits or IngestLimits()).parallel
        self._reading = {f for f in self._reading if not f.done()}
        for p in self.ready_files():
            if len(self._reading) >= parallel or (self.stop_event is not None and self.stop_event.is_set()):
                break
            self._seen.pop(p.name, None)
            try:
                taken = self._claim(p)
            except Exception:  # one bad file must not stop the inbox
                log.exception("inbox: could not take %s", p)
                continue
            if taken:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(parallel, thread_name_prefix="inbox-ingest")
                self._reading.add(self._pool.submit(self._ingest_in_thread, *taken))
        self.collect()

    def drain(self, timeout: Optional[float] = None) -> bool:
        """Wait until the files being read are jobs or failed (True), or `timeout` passed (False)."""
        _, pending = wait(self._reading, timeout)
        return not pending

    def close(self) -> None:
        """Wait for the ingests in flight (a set stop_event cancels them) and end their threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._reading.clear()

    def _ingest_in_thread(self, digest: str, moved: Path, side: Optional[Path]) -> None:
        """`_ingest` on a pool thread, with a queue connection of its own (a Queue is not thread-safe)."""
        from jobs.ingest.isolate import IngestCancelled

        queue = None
        try:
            queue = Queue(self.queue.path)
            self._ingest(digest, moved, side, queue)
        except IngestCancelled as exc:
            log.info("inbox: %s", exc)
        except Exception:  # one bad file must not stop the inbox; recover() takes it at the next start
            log.exception("inbox: could not ingest %s", moved)
        finally:
            if queue is not None:
                queue.close()

    # -- taking a file -------------------------------------------------------------------------
    def take(self, path: Path) -> Optional[str]:
        """Ingest one complete file in this thread; returns the job id (None when it went to failed/ or
        stayed put)."""
        taken = self._claim(path)
        return self._ingest(*taken) if taken else None

    def _claim(self, path: Path) -> Optional[tuple[str, Path, Optional[Path]]]:
        """The checks before reading (what the path is, same content as an earlier file), then the move to
        processing/: (sha256, moved file, moved sidecar) to ingest, or None (failed/ or left in place)."""
        problem = entry_problem(path, self.paths.inbox)  # it may have been swapped for a link since the scan
        if problem:
            log.warning("inbox: not taking %s: it is now %s", path.name, problem)
            return None
        side = sidecar_for(path)
        try:
            digest = sha256_file(path)
            if side:
                check_readable(side)
        except FileNotFoundError:
            raise
        except OSError as exc:  # e.g. owned by another user, mode 0600: it stays, reported once
            self._unreadable.report(self.queue, path, exc)
            return None
        self._unreadable.forget(path.name)
        prev = self.queue.inbox_file(digest)
        if prev and prev["state"] != "failed":
            job = f"job {prev['job_id']}" if prev["job_id"] else "a job (it is being read now)"
            self._to_failed(path, side, f"same content as {prev['name']}, already taken as {job} "
                                        f"(sha256 {digest[:12]}); not ingested again")
            return None
        moved = move_unique(path, self.paths.processing)
        side = move_unique(side, self.paths.processing) if side else None
        self._record(digest, moved, None, "ingesting", None, side)
        return digest, moved, side

    def problems(self) -> dict:
        """What /health shows of the inbox: the files it cannot read ({} when none)."""
        names = self._unreadable.names()
        return {"unreadable": names} if names else {}

    def _ingest(self, digest: str, moved: Path, side: Optional[Path], queue: Optional[Queue] = None) -> Optional[str]:
        """Turn a file in processing/ into a job, or move it to failed/ with the reason (`queue`: the
        calling thread's connection, default the watcher's). A cancelled ingest (the service stops)
        leaves it in processing/ for :meth:`recover`."""
        from jobs.ingest import IngestOptions
        from jobs.ingest.isolate import IngestCancelled
        from jobs.submit import submit_file

        queue = queue or self.queue
        try:
            spec, note = sidecar_spec(side, self.defaults)
        except SidecarError as exc:
            reason = str(exc)
            job_id = queue.add_failed_job(JobSpec(title=moved.name), [str(moved)], reason)  # `list` shows it
            self._record(digest, moved, job_id, "failed", reason, side, queue)
            self._to_failed(moved, side, reason)
            return None
        options = IngestOptions(allowed_roots=[self.paths.processing])
        try:
            job_id, error = submit_file(queue, self.paths, moved, spec, self.voices() if self.voices else None,
                                        limits=self.limits, cancel=self.stop_event, options=options)
        except IngestCancelled:
            self._record(digest, moved, None, "ingesting", None, side, queue)  # a clean stop: not an attempt
            raise
        if note:
            queue.event(job_id, note, level="warning")  # what the sidecar said that is no job setting
        if error:
            self._record(digest, moved, job_id, "failed", error, side, queue)
            self._to_failed(moved, side, error)
            return None
        self._record(digest, moved, job_id, "processing", None, side, queue)
        log.info("inbox: %s -> job %s", moved.name, job_id)
        return job_id

    def recover(self) -> None:
        """Files left in processing/ by a stop or crash mid-ingest: take them again (once), attach them
        to the job they already became, or file them where their recorded state says."""
        from jobs.ingest.isolate import IngestCancelled

        rows = {r["path"]: r for r in self.queue.inbox_files()}
        for p in sorted(self.paths.processing.iterdir()):
            try:
                if not (companion(p) or ignored(p) or entry_problem(p, self.paths.processing)):
                    self._recover_one(p, rows.get(str(p)))
            except IngestCancelled:
                return
            except Exception:  # one bad file must not stop the inbox
                log.exception("inbox: could not recover %s", p)

    def _recover_one(self, p: Path, row: Optional[dict]) -> None:
        """One file of processing/ with its inbox_files row (None when the move was not recorded)."""
        side = sidecar_for(p)
        if row and row["state"] == "processing" and row["job_id"]:
            return  # a queued job; collect() files it when it ends
        if row and row["state"] == "done":
            move_unique(p, self.paths.done / row["job_id"])
            return
        if row and row["state"] == "failed":
            self._to_failed(p, side, row["reason"] or f"job {row['job_id']} failed")
            return
        digest = row["sha256"] if row else sha256_file(p)
        job = self.queue.job_from_source(str(p.resolve()), row["taken_at"]) if row else None
        if job:
            self._record(digest, p, job["id"], "processing", None, side)
            log.info("inbox: %s already became job %s before the interruption", p.name, job["id"])
        elif row and row["reason"] == RECOVERED:
            reason = (f"reading {p.name} was interrupted twice (the service stopped or crashed during it); "
                      "see the service log, then drop the file into the inbox again")
            self._record(digest, p, None, "failed", reason, side)
            self._to_failed(p, side, reason)
        else:
            log.info("inbox: taking %s again (its ingest was interrupted)", p.name)
            self._record(digest, p, None, "ingesting", RECOVERED, side)
            self._ingest(digest, p, side)

    def _record(self, digest, path, job_id, state, reason, side=None, queue: Optional[Queue] = None) -> None:
        (queue or self.queue).record_inbox_file(digest, path.name, job_id, state, str(path),
                                                str(side) if side else None, reason)

    def _to_failed(self, path: Path, side: Optional[Path], reason: str) -> None:
        to_failed(self.paths, path, side, reason)

    def collect(self) -> None:
        """Move sources of finished jobs to done/<job>/ (with the outputs) or failed/ (with the reason):
        jobs.inbox_filing."""
        collect(self.queue, self.paths)

    # -- loop ------------------------------------------------------------------------------------
    def run(self, stop_event: threading.Event, tick_s: float = 0.5) -> None:
        """Watch until `stop_event` is set (watchdog observer for hints, periodic rescans)."""
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer
        from watchdog.observers.polling import PollingObserver

        watcher = self

        class Handler(FileSystemEventHandler):
            def on_closed(self, event):
                if not event.is_directory:
                    watcher.note_complete(event.src_path)

            def on_moved(self, event):
                if not event.is_directory:
                    watcher.note_complete(event.dest_path)

        self.stop_event = stop_event
        self.recover()
        observer = PollingObserver(timeout=max(tick_s, 1.0)) if self.polling else Observer()
        observer.schedule(Handler(), str(self.paths.inbox), recursive=False)
        observer.start()
        try:
            while not stop_event.is_set():
                try:
                    self.tick()
                except QueueUnavailable as exc:  # the database is away: the next tick tries again
                    OUTAGE.failed("inbox", exc)  # said once per process (jobs.queue.outage)
                else:
                    OUTAGE.ok("inbox")
                stop_event.wait(tick_s)
        finally:
            observer.stop()
            observer.join(5)
            self.close()
