"""How long a finished job's working files stay: `jobs.keep_work_days` (default 7) after it ended.

A job's working files are what its book is made from: each segment's audio (HOME/audio, FLAC; a `redo`
re-synthesizes one segment and assembles the book again from all the others, a `retry` the failed ones),
a document uploaded to the daemon (HOME/uploads) and the narrated EPUB's copy of the book (HOME/narration).
`prune` removes them for every job that ended (done, partial, failed,
cancelled) more than `keep_work_days` ago, with its segment rows (the counts stay: jobs.queue.removal)
but the failed ones; what stays is its outputs (HOME/output/JOB: book, chapters, subtitles, manifest),
its cover (HOME/covers: the library shows it) and its row and log in the queue (list, status, logs and the
page show it); `delete` removes those too. Retry and redo are refused
after it. Files shared with a job that still keeps its working files stay.

It also removes what nothing uses any more, once a day old: segment audio no segment or cache entry
names (a kill between a write and its record, a redo's earlier take after `keep_work_days`), upload and
preview folders and narration books and covers no kept job names. The daemon runs `prune` at start and
every hour (`Retention`); `tts-appliance prune` runs it now. `keep_work_days: null` keeps working files.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Iterable, Optional

from jobs.queue import Queue, QueueError, QueueUnavailable
from jobs.settings import Paths
from jobs.spool_files import Remover
from jobs.tempnames import is_temp

log = logging.getLogger(__name__)

DAY_S = 86400.0
ORPHAN_AGE_S = DAY_S  # a file nothing names this old is left over (a write is recorded within seconds)
EVERY_S = 3600.0      # the daemon prunes this often


def prune(queue: Queue, paths: Paths, keep_work_days: Optional[float], now: Optional[float] = None,
          stop: Optional[threading.Event] = None) -> dict:
    """Apply the retention once (module docstring) -> {"jobs": [ids whose working files went],
    "freed_bytes", "files"}. `stop` set: ends between jobs."""
    now = time.time() if now is None else now
    remover, home, pruned = Remover(paths.home), str(paths.home), []
    users = queue.working_files()
    if keep_work_days is not None:
        cutoff = now - float(keep_work_days) * DAY_S
        for job_id in queue.ended_before(cutoff):
            if stop is not None and stop.is_set():
                break
            if queue.remove_work(job_id, remover, home):
                remove_job_files(remover, paths, job_id, users, keep_cover=True)
                pruned.append(job_id)
        queue.unused_cache(cutoff, remover, home)
    if stop is None or not stop.is_set():
        _orphans(queue, paths, remover, queue.working_files(), now - ORPHAN_AGE_S)
    if pruned or remover.files:
        log.info("retention: working files of %d job(s) removed (jobs.keep_work_days %s), %d file(s), %.1f MB freed",
                 len(pruned), keep_work_days, remover.files, remover.freed / (1 << 20))
    return {"jobs": pruned, "freed_bytes": remover.freed, "files": remover.files}


def remove_job_files(remover: Remover, paths: Paths, job_id: str, users: dict[str, list[str]],
                     keep_cover: bool = False) -> None:
    """Job `job_id`'s working files besides segment audio (`users[job_id]`: its sources, cover, narration
    book) that no other job in `users` names: uploads only of its sources (a user's own file stays); the
    cover too unless `keep_cover` (retention keeps it for the library; a deleted job's goes)."""
    mine = users.pop(job_id, [])
    named = {f for fs in users.values() for f in fs}
    uploads = paths.home / "uploads"
    ours = (paths.home / "narration",) if keep_cover else (paths.home / "narration", paths.home / "covers")
    for f in mine:
        p = Path(f)
        if f in named or not (uploads in p.parents or p.parent in ours):
            continue
        if remover.file(p) and uploads in p.parents:
            remover.empty_parent(p)


def _orphans(queue: Queue, paths: Paths, remover: Remover, users: dict[str, list[str]], before: float) -> None:
    """What nothing uses, older than `before` (module docstring)."""
    named = {os.path.realpath(f) for fs in users.values() for f in fs}
    audio = [p for p in _files(paths.audio, before) if not is_temp(p.name)]
    for start in range(0, len(audio), 400):
        part = [str(p) for p in audio[start:start + 400]]
        used = queue.audio_in_use(part)
        remover([p for p in part if p not in used])
    for folder in _dirs(paths.home / "uploads"):
        inside = list(_files(folder, None))
        if all(os.path.realpath(f) not in named for f in inside) and _older(folder, inside, before):
            remover.tree(folder)
    for kind in ("narration", "covers"):
        remover([f for f in _files(paths.home / kind, before) if os.path.realpath(f) not in named])


def _older(folder: Path, files: Iterable[Path], before: float) -> bool:
    try:
        return all(p.stat().st_mtime < before for p in [folder, *files])
    except OSError:
        return False


def _files(folder: Path, before: Optional[float]) -> list[Path]:
    """Regular files under `folder` (links not followed), those changed before `before` when given."""
    out = []
    for root, _, names in os.walk(folder):
        for name in names:
            p = Path(root) / name
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if p.is_file() and not p.is_symlink() and (before is None or st.st_mtime < before):
                out.append(p)
    return out


def _dirs(folder: Path) -> list[Path]:
    try:
        return [d for d in folder.iterdir() if d.is_dir() and not d.is_symlink()]
    except OSError:
        return []


class Retention:
    """The retention of the daemon and the job commands: `prune` at start and every `every_s` on a queue
    connection of its own, until `stop` is set. An outage of the queue waits for the next round."""

    def __init__(self, location, paths: Paths, keep_work_days: Optional[float], every_s: float = EVERY_S):
        self.location, self.paths, self.keep_work_days, self.every_s = location, paths, keep_work_days, every_s
        self.last: Optional[dict] = None  # the last round's result, with "at"
        self.ran = threading.Event()  # set once a round has ended (applied, or not: the queue was away)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.once(stop)
            except (QueueError, QueueUnavailable) as exc:  # the outage itself is told once (jobs.queue.outage)
                log.info("retention: not applied this round (%s); the next round tries again", exc)
            finally:
                self.ran.set()
            stop.wait(self.every_s)

    def once(self, stop: Optional[threading.Event] = None) -> dict:
        queue = Queue(self.location)
        try:
            result = prune(queue, self.paths, self.keep_work_days, stop=stop)
        finally:
            queue.close()
        self.last = {**result, "at": time.time()}
        return result
