"""One lifecycle for every streamed request, whatever route it came by (speech API, live route, Wyoming).

    async with serve_stream(daemon, "speech", request) as stream:
        async for chunk in stream.chunks():
            ...                                   # encode and send it
        stream.outcome = "ok"

Any text is spoken whole: text longer than one request speaks goes as pieces at sentence ends, one after
the other into the same stream, the next prefilled while the one before plays. Admission (refused while the
daemon stops, `ShuttingDown`; `EngineBusy` when every engine's queue is
full, also when the engine refuses it before its first audio), the request tracked while it runs (the
daemon cancels what is left at shutdown), cancelled when the route leaves early (client gone, error), and
counted once in the metrics under its route with its outcome: ok, busy, bad_request, slow_client,
cancelled, error.
"""
from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator, Optional

from engines.engine import FRAMES_PER_S
from engines.model.errors import EngineBusy, TTSError

OUTCOMES_OK = ("ok", "cancelled")


class ShuttingDown(EngineBusy):
    """The daemon is stopping: it takes no new streams."""


PIECE_CHARS = 400  # the most text one request speaks: longer input goes as pieces, one after the other
NEXT_PIECE_WAIT_S = 30.0  # how long a started stream waits for room for its next piece (busy engines)


def split_request(request) -> list:
    """`request` as the requests that speak it whole: its text in pieces of at most PIECE_CHARS ending at
    sentence ends (text.split.pieces), each within one request's context; a short text or text still
    arriving (a feed) stays one request."""
    from dataclasses import replace

    from text.normalize import language_code
    from text.split import pieces

    if request.text_feed is not None or len(request.text) <= PIECE_CHARS:
        return [request]
    parts = pieces(request.text, language_code(request.language) or "en", PIECE_CHARS)
    return [replace(request, text=p) for p in parts] or [request]


class Stream:
    """A streamed request being served: its pieces' engine handles (the first, then each next one submitted
    while the one before plays, so it is prefilled by the time it is heard), and the outcome the route
    reports."""

    def __init__(self, daemon, requests: list, first, max_frames: Optional[int] = None):
        self.daemon, self.requests, self.handles = daemon, requests, [first]
        self.max_frames = max_frames  # the client's cap on the whole stream, over all pieces
        self.outcome = "cancelled"  # until the route says otherwise

    @property
    def handle(self):
        return self.handles[0]

    @property
    def sample_rate(self) -> int:
        return self.handle.sample_rate

    async def chunks(self):
        """The PCM chunks (float32) of every piece in order, from asyncio, at most `max_frames` frames in all
        (the rest is cancelled when the stream ends); raises a piece's error."""
        left = None if self.max_frames is None else int(self.max_frames * self.sample_rate / FRAMES_PER_S)
        for i in range(len(self.requests)):
            if i == len(self.handles):  # the piece before made no audio at all
                await self._next()
            async for chunk in self.daemon.host.aiter_chunks(self.handles[i]):
                if left is not None:
                    chunk, left = chunk[:left], left - min(left, len(chunk))
                if left != 0 and i + 1 < len(self.requests) and len(self.handles) == i + 1:
                    await self._next()  # seamless: the next piece is prefilled while this one plays
                if len(chunk):
                    yield chunk
                if left == 0:
                    return

    async def _next(self) -> None:
        req = self.requests[len(self.handles)]
        deadline = time.monotonic() + NEXT_PIECE_WAIT_S
        while True:  # the stream has started: wait for room rather than cut it short
            try:
                handle = self.daemon.host.submit_stream(req)
                break
            except EngineBusy:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.02)
        self.handles.append(handle)
        self.daemon.active_handles.add(handle)


@asynccontextmanager
async def serve_stream(daemon, api: str, request, max_frames: Optional[int] = None) -> AsyncIterator[Stream]:
    """Admit `request` at stream priority on the least-loaded engine and serve it (see the module doc);
    text longer than one request speaks goes as pieces (split_request) into the same stream, `max_frames`
    (a client's cap) over all of them."""
    if not daemon.accepting:
        daemon.metrics.request(api, "busy")
        raise ShuttingDown("the daemon is shutting down")
    requests = split_request(request)
    try:
        handle = daemon.host.submit_stream(requests[0])
    except EngineBusy:
        daemon.metrics.request(api, "busy")
        raise
    stream = Stream(daemon, requests, handle, max_frames)
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
        for h in stream.handles:
            h.cancel()  # no-op when it finished; frees its slot at once otherwise
            daemon.active_handles.discard(h)
        daemon.metrics.request(api, stream.outcome)
        daemon.host.stream_finished(handle, None if stream.outcome in OUTCOMES_OK else stream.outcome, started)
        for h in stream.handles[1:]:
            daemon.host.pool.finished(h)
