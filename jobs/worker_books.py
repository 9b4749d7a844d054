"""The books one queue worker writes (a part of jobs.worker.Worker).

A job's book is followed while its segments are synthesized (`advance`: jobs.book.JobBook writes each
chapter once its segments have all ended); when none is left the worker takes the job's assembly lease
and a `BookAssembler` thread finishes it while the worker goes on (jobs.assembler). A followed book whose
job ends without this worker (cancelled, or assembled by another worker) is let go: its partial book file
is removed, and what the job left in this home's folder for it (jobs.leftovers); a job deleted meanwhile
(jobs.deletion) leaves nothing of it. A book is begun only while the disk has room for it (jobs.disk). At
start the whole spool is looked over for what killed writers left (on a thread of its own: claims do not
wait for it).
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from jobs.assemble import JoinSettings
from jobs.assembler import BookAssembler, book_needs, gone
from jobs.book import JobBook
from jobs.disk import SPACE
from jobs.leftovers import tidy_home, tidy_job
from jobs.queue import Queue
from jobs.settings import Paths


class WorkerBooks:
    """Used on the worker's thread with its queue connection (the assembler's threads have their own)."""

    def __init__(self, queue: Queue, paths: Paths, join: JoinSettings, worker_id: str, lease_s: float,
                 min_free_bytes: int = 0):
        self.queue, self.paths, self.join, self.worker_id, self.lease_s = queue, paths, join, worker_id, lease_s
        self.min_free_bytes = min_free_bytes
        self._books: dict[str, JobBook] = {}  # job id -> its book, written as its chapters complete
        self._advanced: dict[str, float] = {}  # job id -> when its book was last advanced
        self._looked = 0.0  # when every followed book was last looked at (`look`)
        self.assembler = BookAssembler(queue.path, paths, join, after=lambda q, job_id: tidy_job(q, paths, job_id),
                                       worker_id=worker_id)
        threading.Thread(target=tidy_home, args=(queue.path, paths), name="tidy-spool", daemon=True).start()

    def advance(self, job_ids, every_s: float = 0.5) -> None:
        """Write the chapters of these jobs whose segments have all ended (at most every `every_s` per job);
        let go of the books of jobs that ended."""
        now = time.monotonic()
        for job_id in job_ids:
            if now - self._advanced.get(job_id, 0.0) < every_s:
                continue
            self._advanced[job_id] = now
            state = self.queue.job_states([job_id]).get(job_id)
            if state not in ("queued", "running"):
                book = self._books.pop(job_id, None)
                if book is not None:  # ended without this worker (cancelled; assembled elsewhere; deleted)
                    book.abort()
                    if state is None:
                        gone(self.paths, job_id)
                    else:
                        tidy_job(self.queue, self.paths, job_id)
                continue
            book = self._books.get(job_id)
            if book is None:
                book = self._books[job_id] = JobBook.of(self.queue, self.paths, job_id, self.join)
            book.follow(self.queue)

    def look(self, every_s: float = 5.0) -> None:
        """Every `every_s`, `advance` every followed book: one whose job ended without this worker is only
        noticed so, as none of its segments ends here any more."""
        now = time.monotonic()
        if self._books and now - self._looked >= every_s:
            self._looked = now
            self.advance(list(self._books), every_s=0)

    def assemble_ready(self) -> int:
        """Start finishing the jobs whose segments have all ended, up to the assembler's room; returns how
        many were started."""
        n, busy = 0, set(self.assembler.running())
        for job_id in self.queue.ready_jobs(self.worker_id):
            if job_id in busy:
                continue
            if not self.assembler.room() or not self._disk_room(job_id):
                break
            if self.queue.begin_assembly(job_id, self.worker_id, self.lease_s):
                self.assembler.start(job_id, self._books.pop(job_id, None))
                self._advanced.pop(job_id, None)
                n += 1
        return n

    def _disk_room(self, job_id: str) -> bool:
        """Whether the output folder has room for job `job_id`'s book (`book_needs`) and the reserve."""
        return SPACE.need(self.paths.output, book_needs(self.queue, job_id), f"the book of job {job_id}",
                          self.min_free_bytes)

    def progress(self) -> dict:
        """{job id: JobBook.progress()} of the books followed and those being finished (/health)."""
        return {**{job_id: book.progress() for job_id, book in list(self._books.items())}, **self.assembler.books()}

    def finish_assemblies(self, then: Optional[Callable[[], None]] = None) -> None:
        """Wait for the books being finished; with `then`, not here: a thread waits and calls it after."""
        if then is None:
            self.assembler.wait()
            return

        def wait_then():
            self.assembler.wait()
            then()

        threading.Thread(target=wait_then, name="books-finishing", daemon=True).start()

    def close(self) -> None:
        """Stop following books (their partial book files are removed)."""
        for book in self._books.values():
            book.abort()
        self._books.clear()
