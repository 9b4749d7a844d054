"""`tts-appliance delete JOB` / `DELETE /v1/jobs/{id}`: a job and every file of it, gone.

    delete_job(queue, paths, job_id)   # -> {"id": job_id, "deleted": True, "freed_bytes": N}

A job still queued or running is cancelled first (the workers stop its segments: jobs.worker). Then go:
its queue rows (segments, chapters, log, submit key, inbox row: a later submit of the same file makes
a new job), its segments' audio that no other job uses (jobs.queue.removal), its output folder
(HOME/output/JOB) and the links to its outputs in the inbox's `done/JOB/`, and its working files no
other job names: the uploaded document (HOME/uploads), the narrated EPUB's copy of the book, the cover.
A file you gave is never removed: a document submitted by path, or one dropped into the inbox (it stays
in `done/JOB/`, or goes from `processing/` to `failed/` with a reason when the job had not ended).
`freed_bytes`: the bytes of the files removed whose last link went.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from jobs.inbox_filing import file_deleted
from jobs.queue import ACTIVE, Queue, QueueError
from jobs.retention import remove_job_files
from jobs.settings import Paths
from jobs.spool_files import Remover

log = logging.getLogger(__name__)


def delete_job(queue: Queue, paths: Paths, job_id: str) -> dict:
    """Delete job `job_id` and its files (module docstring); QueueError when there is no such job."""
    job = queue.job(job_id)
    if job["state"] in ACTIVE:
        try:
            queue.cancel(job_id)
        except QueueError:  # it ended meanwhile
            pass
    file_deleted(queue, paths, job_id)
    users = queue.working_files()
    remover = Remover(paths.home)
    queue.delete_job(job_id, remover, str(paths.home))
    remove_job_files(remover, paths, job_id, users)
    remove_outputs(remover, paths, job_id, job.get("output_dir"))
    if remover.outside:
        log.warning("job %s: %d of its files are outside the spool folder %s and stay (e.g. %s)", job_id,
                    len(remover.outside), paths.home, remover.outside[0])
    log.info("job %s deleted: %d file(s), %.1f MB freed", job_id, remover.files, remover.freed / (1 << 20))
    return {"id": job_id, "deleted": True, "freed_bytes": remover.freed}


def remove_outputs(remover: Remover, paths: Paths, job_id: str, output_dir=None) -> None:
    """The output folder of job `job_id` (and the one its row names, inside the spool folder), with the
    inbox's `done/JOB/` links to them (the source and sidecar there stay)."""
    folders = {paths.output / job_id}
    if output_dir:
        folders.add(Path(output_dir))
    for folder in folders:
        done = paths.done / job_id
        if folder.is_dir() and done.is_dir():
            remover.tree(done, keep=lambda p, folder=folder: not _same(p, folder / p.relative_to(done)))
        remover.tree(folder)


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
