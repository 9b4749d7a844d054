"""Where the watched inbox's files end up (used by jobs.watch and jobs.deletion): a finished job's source
goes to `done/<job>/` with links to its output files, a failed (or partial, or deleted) one to `failed/` with
a `.reason.txt` beside it. Files are only moved, never deleted."""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Optional

from jobs.queue import Queue
from jobs.settings import Paths
from jobs.watch_files import move_unique

log = logging.getLogger(__name__)


def to_failed(paths: Paths, path: Path, side: Optional[Path], reason: str) -> Path:
    """Move `path` (and its sidecar `side`) to failed/ with `<name>.reason.txt` saying `reason`; returns
    where it went."""
    dest = move_unique(path, paths.failed)
    if side and side.exists():
        move_unique(side, paths.failed)
    (paths.failed / f"{dest.name}.reason.txt").write_text(reason.rstrip() + "\n", encoding="utf-8")
    log.error("inbox: %s failed: %s", path.name, reason)  # a failed job: at priority err in the journal
    return dest


def collect(queue: Queue, paths: Paths) -> None:
    """Move sources of finished jobs to done/<job>/ (with the outputs) or failed/ (with the reason)."""
    for r in queue.inbox_files_of_ended_jobs():
        src, side = Path(r["path"]), Path(r["sidecar"]) if r["sidecar"] else None
        if r["job_state"] == "done":
            dest = paths.done / r["job_id"]
            copy_outputs(Path(r["out"]), dest)
            if src.exists():
                move_unique(src, dest)
            if side and side.exists():
                move_unique(side, dest)
            state = "done"
        else:  # partial (some segments failed) is no finished book: it goes where failures go
            reason = r["job_error"] or f"job {r['job_id']} was {r['job_state']}"
            if r["job_state"] == "partial":
                reason += partial_detail(queue, r["job_id"], r["out"])
            if src.exists():
                to_failed(paths, src, side, f"job {r['job_id']} {r['job_state']}: {reason}")
            state = "failed"
        queue.inbox_file_filed(r["sha256"], state)
        log.info("inbox: job %s (%s) filed as %s", r["job_id"], r["name"], state)


def file_deleted(queue: Queue, paths: Paths, job_id: str) -> None:
    """The inbox file of job `job_id`, deleted before it ended, out of processing/ into failed/ (a restart
    would otherwise take it again as a new file)."""
    for r in queue.inbox_files():
        src = Path(r["path"])
        if r["job_id"] == job_id and r["state"] in ("processing", "ingesting") and src.exists():
            side = Path(r["sidecar"]) if r["sidecar"] else None
            to_failed(paths, src, side, f"job {job_id} was deleted (tts-appliance delete) before it finished")


def partial_detail(queue: Queue, job_id: str, out: Optional[str]) -> str:
    """What a partial job's reason adds: why its first segment failed and where the audio made is."""
    failed = [g for g in queue.segments(job_id) if g["state"] == "failed"]
    first = f"\nsegment {failed[0]['idx']}: {failed[0]['last_error']}" if failed else ""
    return f"{first}\nthe audio made so far: {out}" if out else first


def copy_outputs(out: Path, dest: Path) -> None:
    """Hard-link (or copy) the job's output files into `dest`, keeping sub-folders."""
    for f in out.rglob("*") if out.is_dir() else []:
        if f.is_file() and not f.name.startswith("."):
            target = dest / f.relative_to(out)
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                continue
            try:
                os.link(f, target)
            except OSError:
                shutil.copy2(f, target)
