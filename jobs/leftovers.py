"""What writers leave behind in the spool, removed: temp files of killed writers, and the partial book of
a job that was assembled elsewhere.

A process killed while it writes a book leaves the book's temp file (hidden, named after its writer:
jobs.tempnames) in the job's output folder, as large as the book so far; one killed while it writes a
segment's audio leaves a small one in `audio/`. `tidy_job` (when a job ends, and for every job folder at a
worker's start: `tidy_home`, on a thread of its own) removes:

- temp files whose writer was a process of this host that is gone, whatever the job's state;
- once the job has ended, every temp file of its folder but a live local writer's (another host's, or
  one from before writers were named: nothing writes a book whose job has ended);
- the chapter files this home holds of a job that ended with its book written in another folder (a
  second daemon with a home of its own followed the book, another assembled it), unless this folder
  holds a finished book (a manifest or a book file): a finished output is never removed.

In `audio/`, temp files of dead local writers go, and unnamed ones an hour old (a segment is written
in milliseconds). Nothing else is touched: no user input lives in these folders, and every name
removed is one of our temp names or a chapter file of a book that was never finished here.
"""
from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Optional

from jobs.queue import TERMINAL, Queue, QueueError, QueueUnavailable
from jobs.settings import Paths
from jobs.tempnames import writer_state

log = logging.getLogger(__name__)

CHAPTER_FILE = re.compile(r"^\d+ - .+\.[A-Za-z0-9]+$")  # jobs.assemble.BookWriter.chapter's names (and subtitles)
UNNAMED_AGE_S = 3600.0  # an audio temp file of an unknown writer this old is left over


def tidy_job(queue: Queue, paths: Paths, job_id: str) -> int:
    """Remove what is left over in job `job_id`'s output folder (module docstring); returns how many files."""
    folder = paths.output / job_id
    if not folder.is_dir():
        return 0
    try:
        job: Optional[dict] = queue.job(job_id)
    except QueueError:
        job = None  # a folder of a job this queue does not know: only dead local writers' files go
    ended = job is not None and job["state"] in TERMINAL
    n = sum(_remove_temp(f, ended) for d in (folder, folder / "chapters") for f in _files(d))
    if ended and _elsewhere(job, folder) and not _finished(folder):
        n += _remove_partial(folder)
    if n:
        log.info("job %s: removed %d file(s) left over in %s", job_id, n, folder)
    return n


def tidy_home(location, paths: Paths) -> int:
    """`tidy_job` for every job folder, then the audio folders' temp files (at a worker's start; on its own
    connection to the queue at `location`). Returns how many files were removed; never raises."""
    n, queue = 0, None
    try:
        queue = Queue(location)
        for folder in sorted(_dirs(paths.output)):
            n += tidy_job(queue, paths, folder.name)
        now = time.time()
        for folder in _dirs(paths.audio):
            n += sum(_remove_temp(f, False, now - UNNAMED_AGE_S) for f in _files(folder))
    except (QueueError, QueueUnavailable) as exc:  # the outage itself is told once (jobs.queue.outage)
        log.info("leftover files of killed writers are not removed this time (the queue is away: %s); the next "
                 "start tries again", exc)
    except OSError as exc:
        log.warning("leftover files of killed writers are not removed this time (%s); the next start tries again",
                    exc)
    finally:
        if queue is not None:
            queue.close()
    return n


def _remove_temp(path: Path, ended: bool, unnamed_before: Optional[float] = None) -> int:
    """Remove `path` if it is a temp file left over (1), else keep it (0). `unnamed_before`: an unknown
    writer's file older than this (a time) is left over too."""
    state = writer_state(path.name)
    if state is None or state == "live":
        return 0
    if state == "unknown" and not ended:
        try:
            if unnamed_before is None or path.stat().st_mtime >= unnamed_before:
                return 0
        except OSError:
            return 0
    return _unlink(path)


def _elsewhere(job: dict, folder: Path) -> bool:
    """Whether the job's book was written to another folder than `folder`."""
    out = job.get("output_dir")
    return bool(out) and os.path.realpath(out) != os.path.realpath(folder)


def _finished(folder: Path) -> bool:
    """Whether `folder` holds a finished book (a manifest or a book file: any visible file at its top)."""
    return any(not f.name.startswith(".") for f in _files(folder))


def _remove_partial(folder: Path) -> int:
    """The chapter files (and their subtitles) of a book never finished in `folder`; empty folders go too."""
    chapters = folder / "chapters"
    n = sum(_unlink(f) for f in _files(chapters) if CHAPTER_FILE.match(f.name))
    for d in (chapters, folder):
        try:
            d.rmdir()
        except OSError:
            pass  # not empty (or gone): what is left stays
    return n


def _unlink(path: Path) -> int:
    try:
        path.unlink()
    except FileNotFoundError:
        return 0
    except OSError as exc:
        log.warning("cannot remove the leftover file %s: %s", path, exc)
        return 0
    return 1


def _files(folder: Path) -> list[Path]:
    try:
        return [f for f in folder.iterdir() if f.is_file() and not f.is_symlink()]
    except OSError:
        return []


def _dirs(folder: Path) -> list[Path]:
    try:
        return [d for d in folder.iterdir() if d.is_dir() and not d.is_symlink()]
    except OSError:
        return []
