"""Which inbox entries are books, and moving them safely (used by jobs.watch).

An entry is taken only when it is a regular file under its own name in the inbox: symbolic links
are never followed (a link to /etc/passwd must not become a job), nor is anything that resolves
outside the inbox. Office lock files (`~$name.docx`, `.~lock.name#`), temp and partial downloads
(`.part`, `.tmp`, `.crdownload`, `.swp`, a `~` suffix ...) and hidden files are ignored and left
where they are. Sidecars (`book.yaml`) and reason files are not books either, but they are expected.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path
from typing import Optional

TEMP_SUFFIXES = (".part", ".partial", ".tmp", ".temp", ".crdownload", ".download", ".swp", ".swo", ".swx", "~")
SIDECAR_SUFFIXES = (".yaml", ".yml")


def companion(path: Path) -> bool:
    """Sidecars and reason files: read with their book, never taken themselves (and not worth a log line)."""
    name = path.name.lower()
    return name.endswith(SIDECAR_SUFFIXES) or name.endswith(".reason.txt")


def ignore_reason(path: Path) -> Optional[str]:
    """Why a name in the inbox is never taken as a book (None: it may be one)."""
    name = path.name.lower()
    if name.startswith("~$") or name.startswith(".~lock."):
        return "an office lock file"
    if name.startswith("."):
        return "a hidden file"
    if name.endswith(TEMP_SUFFIXES) or (name.startswith("#") and name.endswith("#")):
        return "a temporary or partly downloaded file; rename it when it is complete"
    return None


def ignored(path: Path) -> bool:
    """Names that are never taken as books: lock, hidden and temp files, sidecars, reasons."""
    return companion(path) or ignore_reason(path) is not None


def entry_problem(path: Path, folder: Path) -> Optional[str]:
    """Why the inbox entry `path` must not be read (None: a regular file of the folder itself).
    Never follows a link; raises FileNotFoundError when it vanished."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link (links are never followed; copy the file itself into the inbox)"
    if stat.S_ISDIR(st.st_mode):
        return "a folder (only files directly in the inbox are read)"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if path.resolve().parent != folder.resolve():
        return "a path that resolves outside the inbox"
    return None


def regular_file(path: Path) -> bool:
    """True for a regular file that is not a link (the check for sidecars)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def sidecar_for(path: Path) -> Optional[Path]:
    """`book.yaml` (or .yml) next to `book.txt`, when it is a plain file."""
    for suffix in SIDECAR_SUFFIXES:
        cand = path.with_suffix(suffix)
        if regular_file(cand):
            return cand
    return None


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
