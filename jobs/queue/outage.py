"""Whether this process reaches its queue: one warning when the queue goes away, one line when it is back.

Several parts of a process use the queue, each on a connection of its own (every worker thread, the
daemon's status probe) and each retrying on its own schedule. They report what their calls find to
the process's one `OUTAGE`: `failed(source, error)` after a call that could not reach the queue,
`ok(source)` after one that did. The first failure logs a warning; the first success of a source
that had failed logs that the queue is back and ends the outage for every source. However many
threads retry meanwhile, an outage is two lines in the log.
"""
from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


class Outage:
    """The queue's reachability as this process sees it (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._failing: set[str] = set()  # sources whose last call failed, since the outage began

    def failed(self, source: str, error, exc_info: bool = False) -> None:
        """`source` could not reach the queue (`error`: why; `exc_info`: also log the traceback)."""
        with self._lock:
            began = not self._failing
            self._failing.add(source)
        if began:
            log.warning("queue unreachable: %s; jobs wait until it is back", " ".join(str(error).split()),
                        exc_info=exc_info)

    def ok(self, source: str) -> None:
        """`source` reached the queue: if it had failed, the outage is over."""
        with self._lock:
            if source not in self._failing:
                return
            self._failing.clear()
        log.info("queue reachable again")

    def forget(self, source: str) -> None:
        """`source` stops using the queue (a worker that ends): it no longer counts, and nothing is logged."""
        with self._lock:
            self._failing.discard(source)


OUTAGE = Outage()  # the one of this process
