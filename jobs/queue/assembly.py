"""Assembly attempts of a job (a mixin of `jobs.queue.Queue`).

Every assembly of a job counts an attempt in `jobs.assembly_attempts`; one that ends the job done or
partial sets it back to 0. A job whose assembly failed is tried once more when a worker starts
(`retry_failed_assemblies`: the restart may have fixed the cause), and one whose assembly was cut
short (the process died while writing the book, e.g. out of memory) is taken again by the next
worker; past ASSEMBLY_TRIES attempts the job fails instead (`jobs.book.assemble_job`). `retry` and
`redo` start the count again.
"""
from __future__ import annotations

import time

ASSEMBLY_TRIES = 2


class Assemblies:
    """Needs `tx()` and `_event()` of the Queue."""

    def assembly_attempt(self, job_id: str) -> int:
        """Count an assembly attempt of `job_id`; returns the attempts so far, this one included."""
        with self.tx() as c:
            c.execute("UPDATE jobs SET assembly_attempts = assembly_attempts + 1 WHERE id = ?", (job_id,))
            row = c.execute("SELECT assembly_attempts FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return int(row[0]) if row else 0

    def assembly_paused(self, job_id: str, worker_id: str) -> None:
        """The assembly of `job_id` stopped for want of room on the disk (jobs.disk): the attempt does not
        count, and its assembly lease goes, so the job is assembled again once there is room."""
        with self.tx() as c:
            c.execute("""UPDATE jobs SET assembly_attempts = CASE WHEN assembly_attempts > 0 THEN assembly_attempts - 1
                         ELSE 0 END, assembly_worker = NULL, assembly_expires = NULL
                         WHERE id = ? AND assembly_worker = ?""", (job_id, worker_id))

    def assembly_finished(self, job_id: str) -> None:
        """The job's assembly ended with its files written: a later one (after a redo) starts the count again."""
        with self.tx() as c:
            c.execute("UPDATE jobs SET assembly_attempts = 0 WHERE id = ?", (job_id,))

    def retry_failed_assemblies(self) -> list[str]:
        """Put the jobs whose assembly failed fewer than ASSEMBLY_TRIES times back to assembly (at a
        worker's start); returns their ids."""
        now = time.time()
        with self.tx() as c:
            ids = [r[0] for r in c.execute(
                """SELECT j.id FROM jobs j WHERE j.state = 'failed' AND j.assembly_attempts BETWEEN 1 AND ?
                   AND j.work_removed_at IS NULL
                   AND NOT EXISTS (SELECT 1 FROM segments s WHERE s.job_id = j.id AND s.state IN ('queued', 'leased'))""",
                (ASSEMBLY_TRIES - 1,)).fetchall()]
            for job_id in ids:
                c.execute("""UPDATE jobs SET state = 'running', error = NULL, finished_at = NULL, assembly_worker = NULL,
                             assembly_expires = NULL, updated_at = ? WHERE id = ? AND state = 'failed'""", (now, job_id))
                self._event(c, job_id, "assembly failed before: trying it once more after a restart", level="warning")
        return ids
