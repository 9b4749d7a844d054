"""One lifecycle for every streamed request, whatever route it came by (speech API, live route, Wyoming).

    async with serve_stream(daemon, "speech", request) as stream:
        async for chunk in stream.chunks():
            ...                                   # encode and send it
        stream.outcome = "ok"

Admission (refused while the daemon stops, `ShuttingDown`; `EngineBusy` when every engine's queue is
full, also when the engine refuses it before its first audio), the request tracked while it runs (the
daemon cancels what is left at shutdown), cancelled when the route leaves early (client gone, error), and
counted once in the metrics under its route with its outcome: ok, busy, bad_request, slow_client,
cancelled, error.
"""
from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

from engines.model.errors import EngineBusy, TTSError

OUTCOMES_OK = ("ok", "cancelled")


class ShuttingDown(EngineBusy):
    """The daemon is stopping: it takes no new streams."""


class Stream:
    """A streamed request being served: its engine handle, and the outcome the route reports."""

    def __init__(self, daemon, handle):
        self.daemon, self.handle = daemon, handle
        self.outcome = "cancelled"  # until the route says otherwise

    @property
    def sample_rate(self) -> int:
        return self.handle.sample_rate

    def chunks(self):
        """The request's PCM chunks (float32), from asyncio; raises its error at the end."""
        return self.daemon.host.aiter_chunks(self.handle)


@asynccontextmanager
async def serve_stream(daemon, api: str, request) -> AsyncIterator[Stream]:
    """Admit `request` at stream priority on the least-loaded engine and serve it (see the module doc)."""
    if not daemon.accepting:
        daemon.metrics.request(api, "busy")
        raise ShuttingDown("the daemon is shutting down")
    try:
        handle = daemon.host.submit_stream(request)
    except EngineBusy:
        daemon.metrics.request(api, "busy")
        raise
    stream = Stream(daemon, handle)
    started = time.monotonic()
    daemon.active_handles.add(handle)
    try:
        yield stream
    except EngineBusy:
        stream.outcome = "busy"
        raise
    except TTSError:
        stream.outcome = "bad_request"
        raise
    except asyncio.TimeoutError:
        stream.outcome = "slow_client"
        raise
    except (ConnectionError, asyncio.CancelledError):
        stream.outcome = "cancelled"
        raise
    except Exception:
        stream.outcome = "error"
        raise
    finally:
        handle.cancel()  # no-op when it finished; frees its slot at once otherwise
        daemon.active_handles.discard(handle)
        daemon.metrics.request(api, stream.outcome)
        daemon.host.stream_finished(handle, None if stream.outcome in OUTCOMES_OK else stream.outcome, started)
