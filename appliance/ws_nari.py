"""GET /v1/audio/speech/ws: the Nari Qwen3-TTS server's WebSocket protocol (`nari.speech.v1`), so that
clients written for it (tts-bench's WebSocket transport among them) speak to this daemon unmodified. It is
the live route's session (appliance.http_live: words go to the model as they come, the model's
streaming-text mode) with Nari's messages around it; one request per connection.

    server -> {"type": "session.created", "protocol": "nari.speech.v1",
               "audio": {"encoding": "pcm_s16le", "sample_rate": 24000, "channels": 1}}      on connecting
    client -> {"type": "request.start", "model", "voice", "language", "response_format": "pcm", ...}
              (model is not checked: one model is loaded; response_format must be pcm; also taken:
               instructions, seed, max_frames or max_new_tokens, speed, lexicon; other keys are ignored)
    server -> {"type": "request.configured", "request_id"}
    client -> {"type": "input_text.append", "sequence": 0, "text": "Hello "}    (sequence: increasing integers)
    server -> {"type": "input_text.ack", "event": "input_text.append", "sequence": 0}   at once, for each
    client -> {"type": "input_text.end", "sequence": N}                (N: at least the last append's sequence)
    server -> {"type": "input_text.ack", "event": "input_text.end", "sequence": N}
    server -> {"type": "response.started", "request_id", "audio": {...as above}}  before the first audio
              binary frames: 16-bit little-endian mono PCM, as the engine makes it (also before input ends)
              {"type": "response.done", "request_id", "stop_reason": "stop", "audio_chunks": <binary frames
               sent>, "audio_seconds"}, then the server closes with 1000
    client -> {"type": "response.cancel"}   (any time) stop: speech not yet sent is dropped, close 1000
Errors end the session: {"type": "error", "error": {"message", "code"}}, then a close with the message as
its reason and 1008 (bad input, a silent client), 1013 (busy: try again later) or 1011 (server error).
The subprotocol is chosen when the client offers it; a client that offers none is served all the same.
"""
from __future__ import annotations

import uuid

from aiohttp import web

from appliance.http_common import ApiError, field
from appliance.http_live import END, LiveSession, serve_session

PROTOCOL = "nari.speech.v1"
START_KEYS = ("voice", "language", "instructions", "seed", "max_frames", "speed", "lexicon")


class NariSession(LiveSession):
    """One `nari.speech.v1` connection: request.start configures the live session, appends are acknowledged
    by sequence, and the live session's events become Nari's."""

    def __init__(self, ctx, ws: web.WebSocketResponse):
        super().__init__(ctx, ws)
        self.request_id = f"speech-{uuid.uuid4().hex}"
        self.started = False  # request.start came
        self.sequence = -1  # the last sequence acknowledged

    def _audio(self) -> dict:
        return {"encoding": "pcm_s16le", "sample_rate": self.sample_rate, "channels": 1}

    async def run(self) -> None:
        try:
            await self._send({"type": "session.created", "protocol": PROTOCOL, "audio": self._audio()})
        except (ConnectionResetError, TimeoutError):
            self.close_reason = "the client went away"
            return
        await super().run()

    STOP = "response.cancel"

    async def _apply(self, kind: str, data: dict):
        if kind == "request.start":
            if self.started:
                raise ApiError(400, "one request.start per connection; open another connection for the next")
            self._start(data)
            await self._send({"type": "request.configured", "request_id": self.request_id})
            return None
        if kind not in ("input_text.append", "input_text.end"):
            raise ApiError(400, f"unknown message type {kind!r}; send request.start, input_text.append, "
                                "input_text.end or response.cancel")
        if not self.started:
            raise ApiError(400, f"{kind} before request.start; send request.start first")
        sequence = field(data, "sequence", int, required=True)
        end = kind == "input_text.end"
        if sequence < self.sequence or sequence == self.sequence and not end:
            raise ApiError(400, f"{kind} sequence {sequence} after {self.sequence}: sequences must increase")
        if end:
            self._end()
        else:
            self._append(field(data, "text", str, required=True))
        self.sequence = sequence
        await self._send({"type": "input_text.ack", "event": kind, "sequence": sequence})
        return END if end else None

    def _start(self, data: dict) -> None:
        fmt = field(data, "response_format", str) or "pcm"
        if fmt.lower() != "pcm":
            raise ApiError(400, f"response_format {fmt!r}: this protocol carries pcm only (16-bit, 24 kHz, mono)")
        settings = {k: data[k] for k in START_KEYS if k in data}
        caps = [field(data, k, int) for k in ("max_frames", "max_new_tokens")]
        if any(c is not None for c in caps):
            settings["max_frames"] = min(c for c in caps if c is not None)
        self._configure(settings)
        self.started = True

    def _start_event(self) -> dict:
        return {"type": "response.started", "request_id": self.request_id, "audio": self._audio()}

    async def _text_done(self, text: str) -> None:
        """Nari's protocol has no event per utterance."""

    def _done_event(self) -> dict:
        return {"type": "response.done", "request_id": self.request_id, "stop_reason": "stop",
                "audio_chunks": self.frames_sent, "audio_seconds": round(self.samples / self.sample_rate, 3)}

    def _error_event(self, message: str, code: str) -> dict:
        return {"type": "error", "request_id": self.request_id, "error": {"message": message, "code": code}}


async def nari_ws(request: web.Request) -> web.WebSocketResponse:
    """GET /v1/audio/speech/ws: one `nari.speech.v1` session (module docstring)."""
    return await serve_session(request, NariSession, protocols=(PROTOCOL,))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/audio/speech/ws", nari_ws)
