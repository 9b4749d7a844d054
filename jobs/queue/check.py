"""Whether this process can use its queue, found out within seconds and without changing anything:
`tts-appliance daemon --check` (which `systemctl reload` runs first) asks it, so a wrong password, a
server that does not answer, a missing database or `jobs.queue_file`, or a SQLite file that cannot be
opened or made fails the check, not the daemon later.

    check_queue(paths.db) -> "postgresql://tts:***@db/tts: reachable"   (QueueError: why not)
"""
from __future__ import annotations

import os
from pathlib import Path

from jobs.queue.core import Queue
from jobs.queue.location import is_url, redact
from jobs.queue.records import QueueError
from jobs.queue.schema import LATEST, SchemaTooNew, pending
from jobs.queue.store import QueueUnavailable

CHECK_TIMEOUT_S = 5.0  # a PostgreSQL connection, or a SQLite lock, waits no longer (a reload must not hang)


def check_queue(location: str | Path, timeout_s: float = CHECK_TIMEOUT_S) -> str:
    """Open the queue at `location` (as `jobs.settings.Paths.db` gives it) read only, within `timeout_s`:
    what was found, in one line (the password masked); QueueError naming what fails. A SQLite file that is
    not there yet passes when its folder can be made and written, as the daemon will."""
    if not is_url(location):
        _check_sqlite(Path(location))
    try:
        with Queue.reading(location, timeout_s) as queue:
            if queue is None:
                return f"{redact(str(location))}: reachable, no queue yet (the first daemon or job command makes it)"
            steps = pending(queue.store, queue.where)
    except QueueError:
        raise
    except (QueueUnavailable, SchemaTooNew) as exc:
        raise QueueError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - the driver's word (e.g. permission denied): one line, not a traceback
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise QueueError(redact(f"cannot read the queue database {location}: {why}")) from None
    kind = "" if is_url(location) else " (SQLite)"
    todo = f"; the next start adds schema steps up to {LATEST}" if steps else ""
    return f"{redact(str(location))}{kind}: reachable{todo}"


def _check_sqlite(path: Path) -> None:
    """A SQLite queue file must be a readable, writable file in a writable folder (its -wal and -shm files
    live beside it); one that is not there yet needs a folder that can be made and written."""
    if path.exists():
        if not path.is_file():
            raise QueueError(f"cannot open the queue database {path}: it is no file")
        for what, where, mode in (("file", path, os.R_OK | os.W_OK), ("folder", path.parent, os.W_OK | os.X_OK)):
            if not os.access(where, mode):
                raise QueueError(f"cannot use the queue database {path}: its {what} is not writable by this user "
                                 f"(uid {os.geteuid()}); SQLite writes the file and its -wal/-shm files beside it")
        return
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise QueueError(f"cannot make the queue database {path}: {folder} is "
                         f"{'no folder' if not folder.is_dir() else f'not writable by this user (uid {os.geteuid()})'}")
