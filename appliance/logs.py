"""The daemon's log set-up, shared by its engine processes (engines.process runs it there first) and the
command line: every line passes the queue's password mask (`jobs.queue.location.redact`), tracebacks too.

Under systemd, stdout and stderr go to the journal, which reads a `<N>` syslog priority at the start of
each line (SyslogLevelPrefix=, on by default) and files a line without one at the unit's default, info.
So every line leaves with its priority: each line of a multi-line record (a traceback) carries the
record's, an uncaught exception in any thread is logged as an error, and `error_line` writes the
command-line errors (a config error of `daemon --check`, which `systemctl reload` runs) the same way:
`journalctl -p err` shows them all.
"""
from __future__ import annotations

import logging
import os
import sys
import threading

from jobs.queue.location import redact

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3}  # syslog's numbers


def to_journal(stream) -> bool:
    """Whether `stream` is the journal's: $JOURNAL_STREAM names its device and inode (systemd.exec(5))."""
    dev_ino = os.environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in dev_ino.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def with_priority(text: str, priority: int) -> str:
    """`text` with `<priority>` at the start of each of its lines."""
    return "\n".join(f"<{priority}>{line}" for line in text.split("\n"))


def error_line(message: str, file=None) -> None:
    """Write an error message for a person (password masked): plain on a terminal, at priority err in the
    journal."""
    file = file or sys.stderr
    message = redact(message)
    print(with_priority(message, 3) if to_journal(file) else message, file=file, flush=True)


class Masked(logging.Formatter):
    """A formatter whose output never shows the queue database's password; `journald`: `<N>` priority
    prefixes on every line instead of timestamps."""

    def __init__(self, journald: bool = False):
        super().__init__("%(name)s: %(message)s" if journald else FORMAT)
        self.journald = journald

    def format(self, record):
        text = redact(super().format(record))
        return with_priority(text, PRIORITY.get(record.levelno, 2)) if self.journald else text


def _log_uncaught(exc_type, exc, tb, thread=None) -> None:
    if issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
        return
    where = f" in thread {thread.name}" if thread is not None else ""
    logging.getLogger("tts_appliance").critical("uncaught exception%s", where, exc_info=(exc_type, exc, tb))


def setup_logging(level: str) -> None:
    """Log to stdout; under journald with `<N>` priority prefixes on every line instead of timestamps; uncaught
    exceptions (main thread or any other) go through the log, so they carry a priority too."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(Masked(journald=to_journal(sys.stdout)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("watchdog").setLevel(max(root.level, logging.INFO))  # inotify chatter
    sys.excepthook = _log_uncaught
    threading.excepthook = lambda a: _log_uncaught(a.exc_type, a.exc_value, a.exc_traceback, a.thread)
