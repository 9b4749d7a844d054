"""Books finished off the queue worker's thread.

When a job's last segment has ended its book still has to be finished: the last chapters joined and
encoded, the book file closed (an m4b is only encoded by ffmpeg then), subtitles and the manifest
written; minutes for a long book. The worker (jobs.worker) takes the job's assembly lease
(`Queue.begin_assembly`) and hands the rest to a `BookAssembler`, which runs each assembly
(`jobs.book.assemble_job`) on a thread of its own with a queue connection of its own, at most `parallel`
at once: meanwhile the worker goes on leasing and synthesizing other jobs' segments. The job stays
`running` until its book is written; the worker's heartbeat renews the assembly lease while it is
written. An assembly cut short by the process dying is taken again at the next start
(jobs.queue.assembly); one that stopped on an error the job could not record (the queue went away) is
taken again by the same worker; one that found no room on the disk lets its lease go without counting an
attempt and is taken again once there is room (jobs.disk). A job deleted while its book was written
(jobs.deletion) leaves no output folder behind.
"""
from __future__ import annotations

import json
import logging
import shutil
import threading
from typing import Callable, Optional

from jobs.assemble import JoinSettings
from jobs.book import JobBook, assemble_job
from jobs.disk import SPACE, DiskFull, book_bytes
from jobs.queue import Queue
from jobs.settings import JobSpec, Paths, audio_format

log = logging.getLogger(__name__)

PARALLEL = 2  # books finished at once by one worker (each mostly encodes: one core each)


class BookAssembler:
    """Runs `assemble_job` for the jobs handed to `start`, each on a thread of its own. `after(queue,
    job_id)` runs on that thread once the job has ended (jobs.leftovers: its folder tidied)."""

    def __init__(self, location, paths: Paths, join: JoinSettings = JoinSettings(), parallel: int = PARALLEL,
                 after: Optional[Callable[[Queue, str], None]] = None, worker_id: Optional[str] = None):
        self.location, self.paths, self.join, self.parallel, self.after = location, paths, join, int(parallel), after
        self.worker_id = worker_id  # whose assembly leases (a full disk gives them back)
        self._running: dict[str, tuple[threading.Thread, Optional[JobBook]]] = {}
        self._lock = threading.Lock()

    def running(self) -> list[str]:
        """The jobs whose books are being finished now."""
        with self._lock:
            return list(self._running)

    def room(self) -> bool:
        with self._lock:
            return len(self._running) < self.parallel

    def start(self, job_id: str, book: Optional[JobBook] = None) -> None:
        """Finish job `job_id` (its assembly lease taken) on a thread of its own, with the `book` that
        followed its synthesis (None: from scratch)."""
        t = threading.Thread(target=self._run, args=(job_id, book), name=f"assemble-{job_id}", daemon=True)
        with self._lock:
            self._running[job_id] = (t, book)
        t.start()

    def _run(self, job_id: str, book: Optional[JobBook]) -> None:
        queue = None
        try:
            queue = Queue(self.location)
            assemble_job(queue, self.paths, job_id, self.join, book=book)
            if not queue.job_states([job_id]):  # deleted while it was written
                gone(self.paths, job_id)
            elif self.after is not None:
                self.after(queue, job_id)
        except DiskFull as exc:  # said once (jobs.disk); the job waits for room, its attempt not counted
            try:
                SPACE.full(exc.folder, book_needs(queue, job_id), f"the book of job {job_id}")
                queue.assembly_paused(job_id, self.worker_id)
            except Exception as again:  # noqa: BLE001 - the queue away too: its assembly lease expires
                log.info("job %s: its assembly waits for room; its lease was not given back (%s)", job_id, again)
        except Exception as exc:  # noqa: BLE001 - e.g. the queue went away: this worker takes the job again
            if book is not None:
                book.abort()
            if _deleted(queue, job_id):
                gone(self.paths, job_id)
                log.info("job %s was deleted while its book was written; what was written of it is removed", job_id)
            else:
                log.warning("job %s: its assembly stopped (%s: %s); it is tried again", job_id, type(exc).__name__,
                            exc)
        finally:
            if queue is not None:
                queue.close()
            with self._lock:
                self._running.pop(job_id, None)

    def books(self) -> dict:
        """{job id: its book's progress, "assembling": true} of the books being finished (/health)."""
        with self._lock:
            running = list(self._running.items())
        return {job_id: {**(book.progress() if book is not None else {}), "assembling": True}
                for job_id, (_, book) in running}

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait for the books being finished (True when none is left)."""
        with self._lock:
            threads = [t for t, _ in self._running.values()]
        if threads:
            log.info("waiting for %d book(s) being finished", len(threads))
        for t in threads:
            t.join(timeout)
        return not self.running()


def book_needs(queue: Queue, job_id: str) -> int:
    """The room job `job_id`'s book takes while it is written (jobs.disk.book_bytes, from its audio so far)."""
    job = queue.job(job_id)
    seconds, longest = queue.job_audio(job_id)
    return book_bytes(seconds, audio_format(JobSpec.from_dict(json.loads(job["spec"])).format), longest)


def gone(paths: Paths, job_id: str) -> None:
    """What was written for job `job_id` after it was deleted: its output folder."""
    shutil.rmtree(paths.output / job_id, ignore_errors=True)


def _deleted(queue: Optional[Queue], job_id: str) -> bool:
    """Whether the queue (reachable) no longer has job `job_id`."""
    try:
        return queue is not None and not queue.job_states([job_id])
    except Exception:  # noqa: BLE001 - the queue is away: not known to be deleted
        return False
