"""Removing files of the spool folder, counting the space that comes back (used by jobs.retention and
jobs.deletion).

Only files inside the spool folder (`jobs.home`) are removed: a path outside it (a user's own file that
a job read, another host's spool folder) is left where it is and counted apart. The bytes counted
are those of files whose last link went (a hard link elsewhere, e.g. the inbox's `done/` copy of a
book, keeps its space in use).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterable

log = logging.getLogger(__name__)


class Remover:
    """Removes files under `home`: `remover(paths)` (what jobs.queue.removal hands over), `tree(folder)`."""

    def __init__(self, home: str | Path):
        self.home = Path(os.path.realpath(home))
        self.freed = 0    # bytes that came back
        self.files = 0    # files removed
        self.outside: list[str] = []  # paths not removed: not in the spool folder

    def inside(self, path: str | Path) -> bool:
        return self.home in Path(os.path.realpath(path)).parents

    def __call__(self, paths: Iterable[str | Path]) -> None:
        for p in paths:
            self.file(p)

    def file(self, path: str | Path) -> bool:
        """Remove one file (True when it was there and went)."""
        path = Path(path)
        if not self.inside(path):
            self.outside.append(str(path))
            return False
        try:
            st = os.lstat(path)
            path.unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.warning("cannot remove %s: %s", path, exc)
            return False
        self.files += 1
        if st.st_nlink <= 1:
            self.freed += st.st_size
        return True

    def tree(self, folder: str | Path, keep=lambda path: False) -> None:
        """Remove the files under `folder` (links not followed) but those `keep(path)` holds, then the folders
        left empty, `folder` too."""
        folder = Path(folder)
        if not folder.is_dir() or folder.is_symlink() or not self.inside(folder):
            return
        for root, dirs, files in os.walk(folder, topdown=False):
            for name in files:
                p = Path(root) / name
                if not keep(p):
                    self.file(p)
            for name in dirs:
                d = Path(root) / name
                if d.is_symlink():
                    self.file(d)
                else:
                    _rmdir(d)
        _rmdir(folder)

    def empty_parent(self, path: str | Path) -> None:
        """Remove the folder of `path` when it is left empty (an upload's own folder)."""
        parent = Path(path).parent
        if self.inside(parent):
            _rmdir(parent)


def _rmdir(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass  # not empty, or gone
