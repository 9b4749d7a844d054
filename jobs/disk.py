"""The spool folder's disk: free space, what the next work needs, and a full disk told once.

    SPACE.need(paths.audio, segments_bytes(8), "the next 8 segments", reserve)  # False: wait (said once)
    no_space(exc, folder)                                                    # an error that is a full disk?

A full disk is not an error of the work: a segment already synthesized is kept in memory (its lease
renewed) until it can be written, a book is assembled again once there is room, and nothing is leased
while the space the next batch needs (estimated: `segments_bytes`, `book_bytes`) plus `jobs.min_free_mb`
is not free. `SPACE` (one per process, like jobs.queue.outage.OUTAGE) says it in one error line per
filesystem when the waiting begins, naming the folder and the space needed, and in one line when there
is room again; `/health` reads `SPACE.waiting()`. Everything here is plain file-system arithmetic: no
queue, no audio code.
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Optional

log = logging.getLogger(__name__)

MB = 1 << 20
SEGMENT_RATE = 24000 * 3       # bytes per second of a segment's audio: 24 kHz, 24-bit (FLAC stays below it)
SEGMENT_S = 15.0               # a segment's audio, at most about (300 characters at ~20 characters per second)
BOOK_RATES = {"wav": 48000, "flac": 40000, "mp3": 16000, "opus": 12000, "m4b": 16000, "epub": 16000}
SPOOL_RATE = 24000 * 4         # a chapter on its way into the book file: float32 (jobs.assemble.BookWriter)
WRITE_MARGIN = MB              # what a write leaves free at least (a file's metadata, the queue's journal)
_WORDS = ("no space left", "disk quota", "database or disk is full", "file too large")


class DiskFull(OSError):
    """There is no room in `folder` for what is being written (`needed` bytes, when known)."""

    def __init__(self, folder: str | Path, needed: int = 0, what: str = "", cause: Optional[BaseException] = None):
        self.folder, self.needed, self.what = Path(folder), int(needed), what
        why = f": {cause}" if cause is not None and str(cause) else ""
        super().__init__(errno.ENOSPC, f"no room in {folder} for {what or 'a write'}{why}")


def free_bytes(folder: str | Path) -> int:
    """Free bytes (for this user) on the filesystem of `folder` (its nearest existing parent)."""
    return shutil.disk_usage(_existing(folder)).free


def _existing(folder: str | Path) -> Path:
    p = Path(folder)
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def no_space(exc: BaseException, folder: str | Path | None = None) -> bool:
    """Whether `exc` (or what caused it) is a full disk: ENOSPC/EDQUOT, a message that says so (ffmpeg,
    SQLite), or, for a library that hides errno (libsndfile's "System error."), an error while writing
    into `folder` whose filesystem has less than WRITE_MARGIN free now."""
    seen, e = set(), exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, DiskFull) or (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)):
            return True
        if any(w in str(e).lower() for w in _WORDS):
            return True
        e = e.__cause__ or e.__context__
    if folder is not None and not isinstance(exc, (MemoryError, KeyboardInterrupt)):
        try:
            return free_bytes(folder) < WRITE_MARGIN
        except OSError:
            return False
    return False


def segments_bytes(n: int, seconds: Optional[float] = None) -> int:
    """Room `n` segments' audio takes (`seconds` of audio in all when known, else SEGMENT_S each)."""
    return int((seconds if seconds is not None else n * SEGMENT_S) * SEGMENT_RATE)


def book_bytes(seconds: float, fmt: str, longest_chapter_s: float = 0.0) -> int:
    """Room a book of `seconds` in format `fmt` takes while it is written: its chapter files and its book
    file (each about `seconds` at the format's rate) and the float32 spool of its longest chapter."""
    return int(2 * seconds * BOOK_RATES.get(fmt, 48000) + longest_chapter_s * SPOOL_RATE)


def mb(n: float) -> str:
    return f"{n / MB:.1f} MB"


class Space:
    """Whether this process waits for room, per filesystem (thread-safe). `need` before work that writes,
    `full` after a write that found no room; one error line when a filesystem begins to lack room, one
    line when it has room again."""

    def __init__(self):
        self._lock = threading.Lock()
        self._waiting: dict[int, dict] = {}  # st_dev -> {"folder", "needed", "free", "what", "since"}

    def need(self, folder: str | Path, needed: int, what: str, reserve: int = 0) -> bool:
        """Whether `folder` has `needed` + `reserve` bytes free; if not, the wait begins (said once)."""
        try:
            free = free_bytes(folder)
        except OSError as exc:  # the folder cannot be looked at: its writes will say why
            log.debug("free space of %s unknown: %s", folder, exc)
            return True
        if free >= needed + reserve:
            self.room(folder, free)
            return True
        self._wait(folder, needed + reserve, free, what, reserve)
        return False

    def full(self, folder: str | Path, needed: int, what: str) -> None:
        """A write into `folder` found no room: the wait begins (said once)."""
        try:
            free = free_bytes(folder)
        except OSError:
            free = 0
        self._wait(folder, max(needed, free + WRITE_MARGIN), free, what, 0)

    def room(self, folder: str | Path, free: Optional[int] = None) -> None:
        """`folder` has room: if it was waited for, the wait is over (said once)."""
        dev = _dev(folder)
        with self._lock:
            was = self._waiting.pop(dev, None)
        if was is not None:
            free = free_bytes(folder) if free is None else free
            log.info("the spool folder has room again (%s: %s free): jobs go on", was["folder"], mb(free))

    def _wait(self, folder, needed: int, free: int, what: str, reserve: int) -> None:
        dev = _dev(folder)
        entry = {"folder": str(folder), "needed_bytes": int(needed), "free_bytes": int(free), "what": what}
        with self._lock:
            began = dev not in self._waiting
            entry["since"] = time.time() if began else self._waiting[dev]["since"]
            self._waiting[dev] = entry
        if began:
            kept = f", {mb(reserve)} of it jobs.min_free_mb" if reserve else ""
            log.error("disk full: %s has %s free; %s needs about %s%s. Jobs wait, nothing is lost or done again, "
                      "and go on by themselves once there is room: free space there, or remove finished jobs "
                      "(`tts-appliance delete JOB`; `tts-appliance prune` applies jobs.keep_work_days now)",
                      folder, mb(free), what, mb(needed), kept)

    def waiting(self) -> list[dict]:
        """The filesystems waited for: folder, needed_bytes, free_bytes, what, since (/health)."""
        with self._lock:
            return [dict(v) for v in self._waiting.values()]

    def clear(self) -> None:
        """Forget every wait (tests; a process that stops working on the spool)."""
        with self._lock:
            self._waiting.clear()


def _dev(folder) -> int:
    try:
        return os.stat(_existing(folder)).st_dev
    except OSError:
        return hash(str(folder))


SPACE = Space()  # the one of this process


def tree_bytes(folder: str | Path) -> tuple[int, int]:
    """(bytes, files) under `folder` (links not followed; 0, 0 where it is absent)."""
    total = count = 0
    stack = [Path(folder)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(Path(entry.path))
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                            count += 1
                    except OSError:
                        continue
        except OSError:
            continue
    return total, count


def disk_state(home: str | Path, reserve: int) -> dict:
    """The spool folder's disk as /health shows it (cheap: one statvfs): `ok` false while work waits for
    room (`SPACE`) or less than `reserve` (jobs.min_free_mb) is free, with the reason in `error`."""
    usage = shutil.disk_usage(_existing(home))
    waiting = SPACE.waiting()
    out = {"ok": not waiting and usage.free >= reserve, "path": str(home), "free_bytes": usage.free,
           "total_bytes": usage.total, "min_free_bytes": int(reserve)}
    if waiting:
        w = waiting[0]
        out["waiting"] = waiting
        out["error"] = (f"disk full: {w['folder']} has {mb(w['free_bytes'])} free, {w['what']} needs about "
                        f"{mb(w['needed_bytes'])}: jobs wait")
    elif usage.free < reserve:
        out["error"] = f"{home} has {mb(usage.free)} free, less than jobs.min_free_mb ({mb(reserve)}): jobs wait"
    return out


SPOOL_PARTS = ("audio", "output", "uploads", "narration", "covers", "inbox", "processing", "done", "failed")


def usage(home: str | Path, reserve: int = 0) -> dict:
    """What the spool folder holds, folder by folder ({"bytes", "files"}), with its disk's free and total
    bytes (`tts-appliance info`; walks every folder: not for /health)."""
    home = Path(home)
    out = {"path": str(home), **({k: v for k, v in disk_state(home, reserve).items() if k != "path"}
                                 if home.exists() else {"ok": None})}
    folders = {}
    for name in SPOOL_PARTS:
        size, files = tree_bytes(home / name)
        folders[name] = {"bytes": size, "files": files}
    db = sum(p.stat().st_size for p in home.glob("queue.db*") if p.is_file()) if home.is_dir() else 0
    folders["queue.db"] = {"bytes": db, "files": len(list(home.glob("queue.db*"))) if home.is_dir() else 0}
    out["folders"] = folders
    return out
