"""Which inbox entries are books, and moving them safely (used by jobs.watch).

An entry is taken only when it is a regular file under its own name in the inbox: symbolic links
are never followed (a link to /etc/passwd must not become a job), nor is anything that resolves
outside the inbox. Office lock files (`~$name.docx`, `.~lock.name#`), temp and partial downloads
(`.part`, `.tmp`, `.crdownload`, `.swp`, a `~` suffix ...) and hidden files are ignored and left
where they are. Sidecars (`book.yaml`) and reason files are not books either, but they are expected.
A file the service may not read (`Unreadable`) stays where it is, reported once while it stays as it is.
"""
from __future__ import annotations

import errno
import hashlib
import logging
import os
import pwd
import shutil
import stat
from pathlib import Path
from typing import Optional

from jobs.settings import JobSpec

log = logging.getLogger(__name__)

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


class SidecarError(ValueError):
    """A sidecar that cannot be used; the message is one line saying where and what to fix."""


SIDECAR_FIX = ("fix it (YAML: one `key: value` per line, e.g. `voice: vivian`; quote a value that holds ': ' or "
               "' #'), then drop the book with its sidecar into the inbox again")


def sidecar_spec(side: Optional[Path], defaults: dict) -> tuple[JobSpec, Optional[str]]:
    """The job settings of a book: `defaults`, then the keys of its sidecar `side` (when it has one), and a line
    naming the sidecar's keys that are no job setting (None: none; they are ignored, the book is still taken: a
    warning is logged, for the job's log too); SidecarError when the sidecar cannot be used."""
    import yaml

    data, note = dict(defaults), None
    if side is not None:
        bad = f"bad sidecar {side.name}"
        if not regular_file(side):
            raise SidecarError(f"{bad}: it is not a plain file (links are never followed); put a file in its place")
        try:
            loaded = yaml.safe_load(side.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise SidecarError(f"{bad}: {yaml_problem(exc)}; {SIDECAR_FIX}") from None
        except UnicodeDecodeError:
            raise SidecarError(f"{bad}: it is not UTF-8 text; save it as UTF-8, then drop the book with its "
                               "sidecar into the inbox again") from None
        if not isinstance(loaded, dict):
            raise SidecarError(f"{bad}: it must be a YAML mapping such as 'voice: vivian'; {SIDECAR_FIX}")
        data.update(loaded)
        unknown = JobSpec.unknown(loaded)
        if unknown:
            note = f"sidecar {side.name}: {unknown}"
            log.warning("inbox: %s", note)
    try:
        return JobSpec.from_dict(data), note
    except (ValueError, TypeError) as exc:
        raise SidecarError(f"bad sidecar {side.name if side else ''}: {exc}") from None


def yaml_problem(exc) -> str:
    """PyYAML's message (several lines, with a snippet and a caret) as one: where (line, column) and what."""
    mark, problem, context = (getattr(exc, k, None) for k in ("problem_mark", "problem", "context"))
    if not problem:
        return " ".join(str(exc).split())
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + problem + (f" ({context})" if context else "")


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


class Unreadable:
    """Inbox files this process cannot open, each remembered with how it was when it failed (inode, size,
    mtime, ctime: a chmod or chown changes the ctime), so it is reported once while it stays that way and
    taken again once it changes."""

    def __init__(self):
        self._seen: dict[str, tuple] = {}  # name -> signature when it could not be read

    def first(self, path: Path) -> bool:
        """Note `path` as unreadable; False when it was already, unchanged since."""
        sig = _signature(path)
        if self._seen.get(path.name) == sig:
            return False
        self._seen[path.name] = sig
        return True

    def report(self, queue, path: Path, exc: OSError) -> None:
        """`path` (or its sidecar: `exc.filename`) cannot be read: it stays where it is (never moved or
        deleted); one error line and a failed job with the reason (`tts-appliance list` shows it) on `queue`,
        again only once the file has changed. A failed job made for it since its last change (by this
        process before a restart) is not made twice."""
        if not self.first(path):
            return
        reason = unreadable_reason(Path(exc.filename) if exc.filename else path, exc)
        log.error("inbox: %s", reason)
        source = str(path.resolve())
        made = queue.job_from_source(source, os.lstat(path).st_ctime)
        if made is None or made["state"] != "failed" or made["error"] != reason:
            queue.add_failed_job(JobSpec(title=path.name), [source], reason)

    def forget(self, name: str) -> None:
        self._seen.pop(name, None)

    def keep_only(self, names: set) -> None:
        """Forget names that left the folder (one that comes back is reported again)."""
        for name in set(self._seen) - names:
            del self._seen[name]

    def names(self) -> list[str]:
        return sorted(self._seen)


def _signature(path: Path) -> Optional[tuple]:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def check_readable(path: Path) -> None:
    """Open `path` for reading and close it (OSError, e.g. PermissionError, when this process may not)."""
    with open(path, "rb"):
        pass


def unreadable_reason(path: Path, exc: OSError) -> str:
    """Why `path` cannot be read and what to do, naming its owner and mode and the user the service runs as."""
    why = exc.strerror or errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    try:
        st = os.lstat(path)
        whose = f"; it belongs to {_user(st.st_uid)} with mode {stat.S_IMODE(st.st_mode):04o}"
    except OSError:
        whose = ""
    return (f"cannot read {path.name}: {why}{whose}, and the service runs as {_user(os.geteuid())}; make it "
            f"readable by that user (chmod o+r {path.name}, or chown it); it stays in the inbox and is taken "
            "once it changes")


def _user(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name}"
    except KeyError:
        return f"uid {uid}"
