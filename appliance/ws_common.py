"""What the WebSocket routes share (the live route, Nari's and vllm-omni's): opening the socket, reading the
client's messages with an idle clock that pings do not restart, parsing a message, and the close.

Pings are control frames, not messages: a client library's keepalive (the `websockets` package pings every
20 s by default, aiohttp's client on `heartbeat`) is answered here, but only data frames count as the
client's activity. A socket opened with aiohttp's autoping would answer them inside `receive()`, and every
answered ping would restart its timeout: a session whose client only pings would never end.
"""
from __future__ import annotations

import asyncio
import json

from aiohttp import WSMsgType, web
from aiohttp.http import WS_CLOSED_MESSAGE

from appliance.http_common import CTX, ApiError

# WebSocket close codes (RFC 6455 7.4): done, bad input or a client breaking the rules, server error, busy
CLOSE_OK, CLOSE_POLICY, CLOSE_ERROR, CLOSE_AGAIN = 1000, 1008, 1011, 1013


async def open_socket(request: web.Request, protocols=()) -> web.WebSocketResponse:
    """Upgrade to a WebSocket (offering the subprotocols `protocols`), without autoping (`Messages` answers
    pings); 503 while the daemon stops."""
    ctx = request.app[CTX]
    if not ctx.accepting:
        raise ApiError(503, "the daemon is shutting down", "busy", {"Retry-After": str(ctx.cfg.runtime.retry_after_s)})
    ws = web.WebSocketResponse(max_msg_size=ctx.cfg.http.max_body_bytes, autoping=False, protocols=protocols)
    await ws.prepare(request)
    return ws


class Messages:
    """A socket's messages (data frames, and the close or error that ends them), with an idle clock: `next()`
    raises asyncio.TimeoutError after `idle_s` without a data frame (the clock then starts again), however
    many pings came meanwhile (each is answered)."""

    def __init__(self, ws: web.WebSocketResponse, idle_s: float):
        self.ws, self.idle_s = ws, idle_s
        self.clock = asyncio.get_running_loop().time
        self.deadline = self.clock() + idle_s

    async def next(self):
        """The next message that is not a ping or pong (a CLOSED message when the client went away while a
        ping was answered)."""
        while True:
            left = self.deadline - self.clock()
            try:
                if left <= 0:
                    raise asyncio.TimeoutError
                msg = await self.ws.receive(timeout=left)
            except asyncio.TimeoutError:
                self.deadline = self.clock() + self.idle_s
                raise
            if msg.type == WSMsgType.PING:
                try:
                    await self.ws.pong(msg.data)
                except ConnectionResetError:
                    return WS_CLOSED_MESSAGE
                continue
            if msg.type != WSMsgType.PONG:
                self.deadline = self.clock() + self.idle_s
                return msg


def parse_message(raw: str) -> dict:
    """A client's message: a JSON object (400 otherwise)."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"message is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, 'each message must be a JSON object with a "type"')
    return data


def close_reason(text: str) -> bytes:
    """A close frame's reason: at most 123 bytes of UTF-8 (RFC 6455 5.5), cut at a character boundary."""
    return text.encode("utf-8")[:123].decode("utf-8", "ignore").encode("utf-8")
