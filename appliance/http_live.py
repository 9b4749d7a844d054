"""GET /v1/audio/speech/live: speech from text that is still arriving (e.g. from a language model), over
a WebSocket.

Client -> server, JSON text frames:
    {"type": "session.update", "voice", "language", "instructions", "seed", "max_frames"}  (optional, before text)
    {"type": "input_text.append", "text": "..."}
    {"type": "input_text.end"}
Server -> client:
    {"type": "audio.start", "sample_rate": 24000, "format": "pcm_s16le"}
    binary frames: 16-bit little-endian mono PCM, as the engine makes it
    {"type": "sentence.done", "text": ...} after each sentence's audio
    {"type": "done", "audio_seconds": x}, then the server closes
    {"type": "error", "message": ..., "code": ...}, then the server closes

A sentence is spoken once it is complete (`jobs.segment_split.split_streamed`, as the Wyoming server
does), through the same streaming engine path as POST /v1/audio/speech (priority 0), one after the
other in order; the rest when input_text.end comes. Text is never spoken half-finished because it
arrives slowly. Buffered, unspoken text is capped at http.max_text_chars; a client that sends nothing
for http.read_timeout_s while nothing is being spoken is dropped.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Optional

from aiohttp import WSMsgType, web

from engines.model.errors import TTSError
from engines.runtime.runner import EngineBusy
from jobs.encode import pcm16
from jobs.normalize import language_code
from jobs.segment_split import split_streamed
from jobs.submit import check_voice

from appliance.http_common import CTX, ApiError, field

log = logging.getLogger(__name__)
END, GONE = object(), object()  # speaker queue sentinel; reader result when the client left


class LiveSession:
    """One WebSocket connection: a reader task turns messages into sentences, a speaker task speaks them."""

    def __init__(self, ctx, ws: web.WebSocketResponse):
        self.ctx, self.ws = ctx, ws
        self.opts = {"voice": None, "language": "auto", "instructions": None, "seed": None, "max_frames": None}
        self.rest = ""  # text after the last complete sentence
        self.text_started = False
        self.queue: asyncio.Queue = asyncio.Queue()
        self.queued_chars = 0  # complete sentences not yet spoken
        self.speaking = False
        self.audio_started = False
        self.samples = 0
        self.sample_rate = ctx.host.engine.sample_rate

    async def run(self) -> None:
        reader = asyncio.create_task(self._read())
        speaker = asyncio.create_task(self._speak())
        try:
            done, _ = await asyncio.wait({reader, speaker}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done and reader.result() is GONE:
                log.info("live client went away; its speech is cancelled")
                return
            await speaker  # raises the speaker's error; ends after END
            await self._start_audio()
            await self._send({"type": "done", "audio_seconds": round(self.samples / self.sample_rate, 3)})
        except ApiError as exc:
            await self._fail(exc.message, exc.type)
        except TTSError as exc:
            self.ctx.metrics.error(type(exc).__name__)
            await self._fail(str(exc), type(exc).__name__)
        except EngineBusy as exc:
            self.ctx.metrics.error("busy")
            await self._fail(f"{exc}; try again in {self.ctx.cfg.runtime.retry_after_s} s", "busy")
        except (ConnectionResetError, asyncio.TimeoutError):
            log.info("live client stopped reading; its speech is cancelled")
        finally:
            for task in (reader, speaker):
                task.cancel()
            await asyncio.gather(reader, speaker, return_exceptions=True)

    # -- client messages -------------------------------------------------------------------------
    async def _read(self):
        """Read messages until input_text.end (-> END queued) or the client leaves (-> GONE)."""
        idle = self.ctx.cfg.http.read_timeout_s
        while True:
            try:
                msg = await self.ws.receive(timeout=idle)
            except asyncio.TimeoutError:
                if self.speaking or not self.queue.empty():
                    continue  # waiting for audio is not idling
                raise ApiError(408, f"no message for {idle:g} s; send input_text.append or input_text.end",
                               "timeout") from None
            if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                return GONE
            if msg.type == WSMsgType.ERROR:
                raise ApiError(400, f"bad WebSocket message: {self.ws.exception() or msg.data}; messages may "
                                    f"be at most {self.ctx.cfg.http.max_body_bytes} bytes")
            if msg.type != WSMsgType.TEXT:
                raise ApiError(400, "send JSON text frames, not binary ones")
            if self._handle(_parse(msg.data)):
                self.queue.put_nowait(END)
                return END

    def _handle(self, data: dict) -> bool:
        """Apply one message; True at input_text.end."""
        kind = data.get("type")
        if kind == "session.update":
            if self.text_started:
                raise ApiError(400, "session.update must come before any input_text.append")
            for key, typ in (("voice", str), ("language", str), ("instructions", str), ("seed", int),
                             ("max_frames", int)):
                if key in data:
                    self.opts[key] = field(data, key, typ, self.opts[key] if key == "language" else None)
            check_voice(self.ctx.host.engine, self.opts["voice"])  # VoiceNotFound, as the speech route says
            return False
        if kind == "input_text.append":
            self.text_started = True
            self._add(field(data, "text", str, required=True))
            return False
        if kind == "input_text.end":
            rest, self.rest = self.rest.strip(), ""
            if rest:
                self._queue(rest)
            return True
        raise ApiError(400, f"unknown message type {kind!r}; send session.update, input_text.append "
                            "or input_text.end")

    def _add(self, text: str) -> None:
        limit = self.ctx.cfg.http.max_text_chars
        buffered = self.queued_chars + len(self.rest) + len(text)
        if buffered > limit:
            raise ApiError(413, f"{buffered} characters of text wait to be spoken; the limit is {limit} "
                                "(send text no faster than it is spoken, with sentence ends)", "too_large")
        lang = language_code(self.opts["language"]) or "en"
        sentences, self.rest = split_streamed(self.rest + text, lang)
        for s in sentences:
            self._queue(s)

    def _queue(self, sentence: str) -> None:
        self.queued_chars += len(sentence)
        self.queue.put_nowait(sentence)

    # -- audio -----------------------------------------------------------------------------------
    async def _speak(self) -> None:
        while True:
            sentence = await self.queue.get()
            if sentence is END:
                return
            self.speaking = True
            try:
                await self._speak_one(sentence)
            finally:
                self.speaking = False
                self.queued_chars -= len(sentence)
            await self._send({"type": "sentence.done", "text": sentence})

    async def _speak_one(self, sentence: str) -> None:
        ctx, o = self.ctx, self.opts
        req = ctx.host.request(sentence, voice=o["voice"] or ctx.host.default_voice(), language=o["language"], instruct=o["instructions"],
                               seed=o["seed"], max_frames=o["max_frames"])
        if req is None:
            raise ApiError(400, "this Base checkpoint clones voices: name a saved voice in session.update "
                                "(POST /v1/voices adds one)")
        if not ctx.accepting:
            raise ApiError(503, "the daemon is shutting down", "busy")
        handle = ctx.host.submit_stream(req)  # EngineBusy: the session ends with an error event
        started, outcome = time.monotonic(), "cancelled"
        ctx.active_handles.add(handle)
        try:
            async for chunk in ctx.host.aiter_chunks(handle):
                self.sample_rate = handle.sample_rate
                await self._start_audio()
                await asyncio.wait_for(self.ws.send_bytes(pcm16(chunk)), ctx.cfg.http.write_timeout_s)
                self.samples += len(chunk)
            outcome = "ok"
        except TTSError:
            outcome = "bad_request"
            raise
        except asyncio.TimeoutError:
            outcome = "slow_client"
            raise
        finally:
            handle.cancel()  # no-op when finished
            ctx.active_handles.discard(handle)
            ctx.metrics.request("live", outcome)
            ctx.host.stream_finished(handle, None if outcome in ("ok", "cancelled") else outcome, started)

    async def _start_audio(self) -> None:
        if not self.audio_started:
            self.audio_started = True
            await self._send({"type": "audio.start", "sample_rate": self.sample_rate, "format": "pcm_s16le"})

    async def _send(self, event: dict) -> None:
        await asyncio.wait_for(self.ws.send_json(event), self.ctx.cfg.http.write_timeout_s)

    async def _fail(self, message: str, code: str) -> None:
        log.info("live speech: %s", message)
        try:
            await self._send({"type": "error", "message": message, "code": code})
        except (ConnectionResetError, asyncio.TimeoutError):
            pass


def _parse(raw: str) -> dict:
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"message is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, 'each message must be a JSON object with a "type"')
    return data


async def live(request: web.Request) -> web.WebSocketResponse:
    """GET /v1/audio/speech/live: upgrade to a WebSocket and speak text as it arrives (module docstring)."""
    ctx = request.app[CTX]
    if not ctx.accepting:
        raise ApiError(503, "the daemon is shutting down", "busy", {"Retry-After": str(ctx.cfg.runtime.retry_after_s)})
    ws = web.WebSocketResponse(max_msg_size=ctx.cfg.http.max_body_bytes)
    await ws.prepare(request)
    try:
        await LiveSession(ctx, ws).run()
    finally:
        await ws.close()
    return ws


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/audio/speech/live", live)
