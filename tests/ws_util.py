"""WebSocket helpers of the daemon tests: a `websockets` client that sends a few messages, then only pings."""
from __future__ import annotations

import asyncio
import json


async def only_pings_after(socket_path: str, path: str, messages: list, within: float = 300.0,
                           until_audio: dict | None = None):
    """Connect to `path` over the daemon's Unix socket with the `websockets` client's keepalive pings (every
    0.2 s, more often than the test daemons' http.read_timeout_s), send `messages` as JSON, then nothing more,
    and read what comes until the server closes -> (events (dicts; audio as bytes), close code, close reason,
    ping latency: 0 when no ping was answered). `until_audio`: a message sent every 0.2 s until the first audio
    came (so that the server's idle limit cannot end the session before it spoke, however slow the machine).
    AssertionError when it stays open `within` seconds (a failure guard)."""
    from websockets.asyncio.client import unix_connect
    from websockets.exceptions import ConnectionClosed

    events = []
    async with unix_connect(socket_path, f"ws://localhost{path}", ping_interval=0.2, ping_timeout=within) as ws:
        for m in messages:
            await ws.send(json.dumps(m))

        async def collect():
            try:
                async for msg in ws:
                    events.append(json.loads(msg) if isinstance(msg, str) else msg)
            except ConnectionClosed:  # 1008 is not a normal close: the iterator raises
                pass

        reader = asyncio.create_task(collect())
        while until_audio is not None and not reader.done() and not any(isinstance(e, bytes) for e in events):
            try:
                await ws.send(json.dumps(until_audio))
            except ConnectionClosed:
                break
            await asyncio.sleep(0.2)
        try:
            await asyncio.wait_for(reader, within)
        except asyncio.TimeoutError:
            kinds = [e["type"] if isinstance(e, dict) else "audio" for e in events]
            raise AssertionError(f"a client that only pings was not closed in {within:g} s: {kinds}") from None
        return events, ws.close_code, ws.close_reason, ws.latency
