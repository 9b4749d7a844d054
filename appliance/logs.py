"""The daemon's log set-up, shared by its engine processes (engines.process runs it there first) and the
command line: every line passes the queue's password mask (`jobs.queue.location.redact`), tracebacks too."""
from __future__ import annotations

import logging
import os
import sys

from jobs.queue.location import redact

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class Masked(logging.Formatter):
    """A formatter whose output never shows the queue database's password; `journald`: `<N>` priority
    prefixes instead of timestamps."""

    def __init__(self, journald: bool = False):
        super().__init__("%(name)s: %(message)s" if journald else FORMAT)
        self.journald = journald

    def format(self, record):
        text = redact(super().format(record))
        if not self.journald:
            return text
        pri = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3}.get(record.levelno, 2)
        return f"<{pri}>{text}"


def setup_logging(level: str) -> None:
    """Log to stdout; under journald with `<N>` priority prefixes instead of timestamps."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(Masked(journald=bool(os.environ.get("JOURNAL_STREAM"))))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("watchdog").setLevel(max(root.level, logging.INFO))  # inotify chatter
