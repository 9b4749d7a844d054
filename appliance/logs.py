"""The daemon's log set-up, shared by its engine processes (engines.process runs it there first)."""
from __future__ import annotations

import logging
import os
import sys


def setup_logging(level: str) -> None:
    """Log to stdout; under journald with `<N>` priority prefixes instead of timestamps."""
    journald = bool(os.environ.get("JOURNAL_STREAM"))

    class Prefix(logging.Formatter):
        def format(self, record):
            pri = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3}.get(record.levelno, 2)
            return f"<{pri}>" + super().format(record) if journald else super().format(record)

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(Prefix("%(name)s: %(message)s" if journald
                                else "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("watchdog").setLevel(max(root.level, logging.INFO))  # inotify chatter
