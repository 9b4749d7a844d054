"""Watched inbox: books dropped into `inbox/` become jobs.

Life of a file: `inbox/book.txt` -> `processing/book.txt` (job queued) -> `done/<job>/` (source,
sidecar and the output files) or `failed/book.txt` + `failed/book.txt.reason.txt`.
Files are never deleted, only moved.

Only complete files are taken: a file must be unchanged (size and mtime) for `quiet_s` seconds, or
for `closed_quiet_s` after a close-after-write or moved-in event. Temp names (`.part`, `.tmp`,
`.crdownload`, dotfiles...) are ignored. The folder is rescanned every tick, so events are only a
hint; `polling=True` uses watchdog's PollingObserver for network mounts. A file whose content
(sha256) was already ingested is not ingested again (unless that earlier job failed).
A sidecar `book.yaml` (same stem) sets voice, language, format, title, author, priority ...
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Optional

import yaml

from jobs.queue import Queue
from jobs.settings import JobSpec, Paths

log = logging.getLogger(__name__)

TEMP_SUFFIXES = (".part", ".partial", ".tmp", ".temp", ".crdownload", ".download", ".swp", "~")
SIDECAR_SUFFIXES = (".yaml", ".yml")


def ignored(path: Path) -> bool:
    """Names that are never taken as books: dotfiles, temp/partial downloads, sidecars, reasons."""
    name = path.name.lower()
    return (name.startswith(".") or name.endswith(TEMP_SUFFIXES) or name.endswith(SIDECAR_SUFFIXES)
            or name.endswith(".reason.txt"))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def move_unique(src: Path, dest_dir: Path) -> Path:
    """Move `src` into `dest_dir`, adding ' (2)', ' (3)' ... when the name is taken."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest, n = dest_dir / src.name, 2
    while dest.exists():
        dest, n = dest_dir / f"{src.stem} ({n}){src.suffix}", n + 1
    shutil.move(str(src), str(dest))
    return dest


def sidecar_for(path: Path) -> Optional[Path]:
    for suffix in SIDECAR_SUFFIXES:
        cand = path.with_suffix(suffix)
        if cand.is_file():
            return cand
    return None


class InboxWatcher:
    """Turns complete files in `paths.inbox` into jobs and files the results. Call `tick()`
    periodically (or `run(stop_event)`, which also starts a watchdog observer)."""

    def __init__(self, paths: Paths, quiet_s: float = 5.0, closed_quiet_s: float = 1.0, polling: bool = False,
                 defaults: Optional[dict] = None, queue: Optional[Queue] = None):
        self.paths = paths.ensure()
        self.quiet_s, self.closed_quiet_s, self.polling = quiet_s, closed_quiet_s, polling
        self.defaults = dict(defaults or {})
        self.queue = queue or Queue(paths.db)
        self.voices = None  # () -> the engine's voices, when one is at hand: unknown voices fail at submit
        self._seen: dict[str, tuple[int, int, float]] = {}  # name -> (size, mtime_ns, stable since)
        self._closed: dict[str, float] = {}  # name -> time of last close-after-write / moved-in event
        self._lock = threading.Lock()

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
            if not p.is_file() or ignored(p):
                continue
            try:
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
        return ready

    def tick(self) -> None:
        """Take complete inbox files, then file away the results of finished jobs."""
        for p in self.ready_files():
            self._seen.pop(p.name, None)
            try:
                self.take(p)
            except Exception:  # one bad file must not stop the inbox
                log.exception("inbox: could not take %s", p)
        self.collect()

    # -- taking a file -------------------------------------------------------------------------
    def take(self, path: Path) -> Optional[str]:
        """Ingest one complete file; returns the job id (None when it went to failed/)."""
        from jobs.submit import submit_file

        digest = sha256_file(path)
        side = sidecar_for(path)
        prev = self.queue._rows("SELECT * FROM inbox_files WHERE sha256 = ?", [digest])
        if prev and prev[0]["state"] != "failed":
            self._to_failed(path, side, f"same content as {prev[0]['name']}, already taken as job "
                                        f"{prev[0]['job_id']} (sha256 {digest[:12]}); not ingested again")
            return None
        moved = move_unique(path, self.paths.processing)
        side = move_unique(side, self.paths.processing) if side else None
        try:
            spec = self._spec(moved, side)
        except (ValueError, TypeError, yaml.YAMLError) as exc:
            self._record(digest, moved, None, "failed", str(exc))
            self._to_failed(moved, side, f"bad sidecar {side.name if side else ''}: {exc}")
            return None
        job_id, error = submit_file(self.queue, self.paths, moved, spec, self.voices() if self.voices else None)
        if error:
            self._record(digest, moved, job_id, "failed", error, side)
            self._to_failed(moved, side, error)
            return None
        self._record(digest, moved, job_id, "processing", None, side)
        log.info("inbox: %s -> job %s", path.name, job_id)
        return job_id

    def _spec(self, path: Path, side: Optional[Path]) -> JobSpec:
        data = dict(self.defaults)
        if side:
            loaded = yaml.safe_load(side.read_text(encoding="utf-8")) or {}
            if not isinstance(loaded, dict):
                raise ValueError("the sidecar must be a YAML mapping such as 'voice: vivian'")
            data.update(loaded)
        return JobSpec.from_dict(data)

    def _record(self, digest, path, job_id, state, reason, side=None) -> None:
        with self.queue.tx() as c:
            c.execute("""INSERT OR REPLACE INTO inbox_files (sha256, name, job_id, state, path, sidecar, reason,
                         taken_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)""",
                      (digest, path.name, job_id, state, str(path), str(side) if side else None, reason, time.time()))

    def _to_failed(self, path: Path, side: Optional[Path], reason: str) -> None:
        dest = move_unique(path, self.paths.failed)
        if side and side.exists():
            move_unique(side, self.paths.failed)
        (self.paths.failed / f"{dest.name}.reason.txt").write_text(reason.rstrip() + "\n", encoding="utf-8")
        log.warning("inbox: %s failed: %s", path.name, reason)

    # -- finished jobs ---------------------------------------------------------------------------
    def collect(self) -> None:
        """Move sources of finished jobs to done/<job>/ (with the outputs) or failed/ (with the reason)."""
        rows = self.queue._rows("""SELECT f.*, j.state AS job_state, j.error AS job_error, j.output_dir AS out
                                   FROM inbox_files f JOIN jobs j ON j.id = f.job_id WHERE f.state = 'processing'
                                   AND j.state IN ('done', 'partial', 'failed', 'cancelled')""")
        for r in rows:
            src, side = Path(r["path"]), Path(r["sidecar"]) if r["sidecar"] else None
            if r["job_state"] in ("done", "partial"):
                dest = self.paths.done / r["job_id"]
                self._copy_outputs(Path(r["out"]), dest)
                if src.exists():
                    move_unique(src, dest)
                if side and side.exists():
                    move_unique(side, dest)
                if r["job_state"] == "partial":
                    (dest / f"{src.name}.reason.txt").write_text(f"{r['job_error']}\n", encoding="utf-8")
                state = "done"
            else:
                reason = r["job_error"] or f"job {r['job_id']} was {r['job_state']}"
                if src.exists():
                    self._to_failed(src, side, f"job {r['job_id']} {r['job_state']}: {reason}")
                state = "failed"
            with self.queue.tx() as c:
                c.execute("UPDATE inbox_files SET state = ?, finished_at = ? WHERE sha256 = ?",
                          (state, time.time(), r["sha256"]))
            log.info("inbox: job %s (%s) filed as %s", r["job_id"], r["name"], state)

    @staticmethod
    def _copy_outputs(out: Path, dest: Path) -> None:
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

        observer = PollingObserver(timeout=max(tick_s, 1.0)) if self.polling else Observer()
        observer.schedule(Handler(), str(self.paths.inbox), recursive=False)
        observer.start()
        try:
            while not stop_event.is_set():
                self.tick()
                stop_event.wait(tick_s)
        finally:
            observer.stop()
            observer.join(5)
