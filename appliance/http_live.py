"""GET /v1/audio/speech/live: speech from text that is still arriving (e.g. from a language model), over
a WebSocket.

Client -> server, JSON text frames:
    {"type": "session.update", "voice", "language" (a name or a BCP-47 tag: en, de-DE), "instructions",
     "seed", "max_frames", "speed", "text_mode", "lexicon" ({"word": "what to say"}, over jobs.lexicon's)}
     (optional, before text)
    {"type": "input_text.append", "text": "..."}
    {"type": "input_text.end"}                   no more text: what was sent is spoken, then `done`
    {"type": "session.close"}                     (any time) stop: speech not yet sent is dropped
Server -> client:
    {"type": "audio.start", "sample_rate": 24000, "format": "pcm_s16le"}
    binary frames: 16-bit little-endian mono PCM, as the engine makes it
    {"type": "text.done", "text": ...} after the audio of each utterance (words mode) or sentence
    {"type": "done", "audio_seconds": x}, then the server closes (1000)
    {"type": "error", "message": ..., "code": ...}, then the server closes with the reason and 1008 (bad
        input, a client too slow or silent), 1013 (busy: try again later) or 1011 (server error)
The server reads the socket until it closes, also while it speaks the last text, so standard keepalive
pings (e.g. the `websockets` package's, every 20 s) are answered however long the speech takes; they are
not messages: only data frames count as the client's activity for http.read_timeout_s.

How the text becomes speech (text_mode "words", the default: each word goes to the model as it comes;
"sentences": each sentence once complete; the lexicon; the cap of http.max_text_chars on text not yet
spoken): appliance.live_text. Everything goes through the same streaming engine path as POST
/v1/audio/speech (priority 0), one request after the other in order. A client that sends nothing for
http.read_timeout_s while the session waits for its text is dropped (appliance.ws_common: pings do not count).
"""
from __future__ import annotations

import asyncio
import logging

from aiohttp import WSMsgType, web

from audio.encode import pcm16
from audio.speed import StreamStretcher, check_speed
from engines.model.errors import EngineBusy, TTSError
from jobs.submit import check_voice
from text.lexicons import lexicon_entries
from text.normalize.lexicon import LexiconError

from appliance.http_common import CTX, ApiError, field
from appliance.languages import model_language
from appliance.live_text import TEXT_MODES, LiveText
from appliance.streams import serve_stream
from appliance.ws_common import (CLOSE_AGAIN, CLOSE_ERROR, CLOSE_OK, CLOSE_POLICY, Messages, close_reason,
                                 open_socket, parse_message)

log = logging.getLogger(__name__)
END, GONE, CLOSE = object(), object(), object()  # speaker queue sentinel; reader results: client left, session.close


class LiveSession:
    """One WebSocket connection: a reader task applies the client's messages (the text goes to `text`, a
    LiveText, as utterances or sentences), a speaker task speaks them in order."""

    def __init__(self, ctx, ws: web.WebSocketResponse):
        self.ctx, self.ws = ctx, ws
        self.opts = {"voice": None, "language": "auto", "instructions": None, "seed": None, "max_frames": None,
                     "speed": 1.0, "text_mode": "words", "lexicon": None}
        self.text = LiveText(ctx, self.opts)
        self.speaking = False
        self.audio_started = False
        self.samples = 0
        self.frames_sent = 0  # binary frames of audio sent
        self.sample_rate = ctx.host.engine.sample_rate
        self.stretcher = None  # a StreamStretcher when speed is not 1
        self.ended = False  # input_text.end came: only session.close may follow
        self.close_code, self.close_reason = CLOSE_OK, ""  # how the server closes the socket

    async def run(self) -> None:
        """Serve the session until it ends; `close_code` and `close_reason` say how to close the socket."""
        reader = asyncio.create_task(self._read())
        speaker = asyncio.create_task(self._speak())
        try:
            done, _ = await asyncio.wait({reader, speaker}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done:  # the client left or closed the session (an error in its messages raises here)
                log.info("live client %s; its speech is cancelled",
                         "went away" if reader.result() is GONE else "closed the session")
                return
            await speaker  # raises the speaker's error; ends after END
            await self._start_audio()
            if self.stretcher is not None:
                await self._send_audio(await self._stretch(self.stretcher.finish))
            await self._send(self._done_event())
        except ApiError as exc:
            code = CLOSE_AGAIN if exc.type == "busy" else CLOSE_POLICY if exc.status < 500 else CLOSE_ERROR
            await self._fail(exc.message, exc.type, code)
        except EngineBusy as exc:  # (before TTSError: it is one)
            self.ctx.metrics.error("busy")
            await self._fail(f"{exc}; try again in {self.ctx.cfg.runtime.retry_after_s} s", "busy", CLOSE_AGAIN)
        except TTSError as exc:
            self.ctx.metrics.error(type(exc).__name__)
            await self._fail(str(exc), type(exc).__name__, CLOSE_POLICY)
        except (ConnectionResetError, asyncio.TimeoutError):
            log.info("live client stopped reading; its speech is cancelled")
            self.close_code, self.close_reason = CLOSE_POLICY, "the client stopped reading"
        except Exception as exc:  # a bug: this session ends with a server error, the daemon goes on
            log.exception("live session failed")
            self.ctx.metrics.error(type(exc).__name__)
            await self._fail(f"internal error: {type(exc).__name__}", "internal_error", CLOSE_ERROR)
        finally:
            if self.text.feed is not None:
                self.text.feed.end()
            for task in (reader, speaker):
                task.cancel()
            await asyncio.gather(reader, speaker, return_exceptions=True)

    # -- client messages -------------------------------------------------------------------------
    async def _read(self):
        """Read messages until the client leaves (-> GONE) or sends session.close (-> CLOSE); input_text.end
        queues END and reading goes on. Only messages restart the idle clock, not pings (ws_common.Messages):
        a client whose library pings every few seconds but sends no text is still dropped after
        http.read_timeout_s while the session waits for its text."""
        idle = self.ctx.cfg.http.read_timeout_s
        messages = Messages(self.ws, idle)
        while True:
            try:
                msg = await messages.next()
            except asyncio.TimeoutError:
                text = self.text
                if self.ended or (self.speaking or not text.queue.empty()) and text.feed is None:
                    continue  # waiting for audio is not idling (an utterance waiting for words is)
                raise ApiError(408, f"no message for {idle:g} s; send input_text.append or input_text.end",
                               "timeout") from None
            if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                return GONE
            if msg.type == WSMsgType.ERROR:
                raise ApiError(400, f"bad WebSocket message: {self.ws.exception() or msg.data}; messages may "
                                    f"be at most {self.ctx.cfg.http.max_body_bytes} bytes")
            if msg.type != WSMsgType.TEXT:
                raise ApiError(400, "send JSON text frames, not binary ones")
            outcome = await self._message(parse_message(msg.data))
            if outcome is CLOSE:
                return CLOSE
            if outcome is END:
                self.ended = True
                self.text.queue.put_nowait(END)

    STOP = "session.close"  # the message that stops the session at once, also after input_text.end

    async def _message(self, data: dict):
        """Apply one client message: CLOSE (stop now: the STOP message), END (no more text) or None."""
        kind = data.get("type")
        if kind == self.STOP:
            return CLOSE
        if self.ended:
            raise ApiError(400, f"{kind!r} after input_text.end; only {self.STOP} may follow")
        return await self._apply(kind, data)

    async def _apply(self, kind: str, data: dict):
        """One message of the text (_message's result). A subclass speaking another protocol overrides this
        with its messages, built on _configure, _append and _end."""
        if kind == "session.update":
            self._configure(data)
        elif kind == "input_text.append":
            self._append(field(data, "text", str, required=True))
        elif kind == "input_text.end":
            self._end()
            return END
        else:
            raise ApiError(400, f"unknown message type {kind!r}; send session.update, input_text.append, "
                                "input_text.end or session.close")
        return None

    def _configure(self, data: dict) -> None:
        """The session's settings from `data` (session.update's fields), checked; only before any text."""
        if self.text.started:
            raise ApiError(400, "the session's settings must come before any text")
        for key, typ in (("voice", str), ("language", str), ("instructions", str), ("seed", int),
                         ("max_frames", int), ("speed", (int, float)), ("text_mode", str)):
            if key in data:
                keep = key in ("language", "speed", "text_mode")
                self.opts[key] = field(data, key, typ, self.opts[key] if keep else None)
        try:
            self.opts["lexicon"] = lexicon_entries(data.get("lexicon", self.opts["lexicon"]), "session.update")
            check_speed(self.opts["speed"])
        except LexiconError as exc:
            raise ApiError(400, str(exc)) from None
        except ValueError as exc:
            raise ApiError(400, f"'speed': {exc}") from None
        if self.opts["text_mode"] not in TEXT_MODES:
            raise ApiError(400, f"'text_mode' must be one of {', '.join(TEXT_MODES)}")
        check_voice(self.ctx.host.engine, self.opts["voice"])  # VoiceNotFound, as the speech route says

    def _append(self, text: str) -> None:
        """More text to speak."""
        self.text.append(text)

    def _end(self) -> None:
        """No more text: what is held is spoken, then the session ends."""
        self.text.end()

    # -- audio -----------------------------------------------------------------------------------
    async def _speak(self) -> None:
        while True:
            item = await self.text.queue.get()
            if item is END:
                return
            while item is not None:
                item = await self._speak_item(item)

    async def _speak_item(self, item):
        """Speak a sentence or an utterance; returns an utterance for the words its request did not take
        (it ended early, e.g. at max_frames), else None."""
        if not await self.text.ready(item):
            return None  # an utterance of whitespace only
        self.speaking = True
        try:
            await self._speak_one(item)
        finally:
            self.speaking = False
        spoken, more = self.text.spoken(item)
        await self._text_done(spoken)
        return more

    async def _speak_one(self, item) -> None:
        ctx, o = self.ctx, self.opts
        feed = None if isinstance(item, str) else item  # an utterance: a TextFeed
        req = ctx.host.request("" if feed else item, voice=o["voice"] or ctx.host.default_voice(),
                               language=model_language(o["language"], ctx.host.engine.languages),
                               instruct=o["instructions"], seed=o["seed"],
                               max_frames=o["max_frames"], text_feed=feed)
        if req is None:
            raise ApiError(400, "this Base checkpoint clones voices: name a saved voice in session.update "
                                "(POST /v1/voices adds one)")
        async with serve_stream(ctx, "live", req) as stream:  # EngineBusy: the session ends with an error event
            if o["speed"] != 1.0 and self.stretcher is None:
                self.stretcher = StreamStretcher(stream.sample_rate, o["speed"])
            async for chunk in stream.chunks():
                self.sample_rate = stream.sample_rate
                await self._start_audio()
                if self.stretcher is not None:
                    chunk = await self._stretch(self.stretcher.push, chunk)
                await self._send_audio(chunk)
            stream.outcome = "ok"

    async def _stretch(self, work, *args):
        """Time-stretching takes ms per chunk: a worker thread keeps the other sessions flowing."""
        return await asyncio.get_running_loop().run_in_executor(None, work, *args)

    async def _send_audio(self, chunk) -> None:
        if len(chunk):
            await asyncio.wait_for(self.ws.send_bytes(pcm16(chunk)), self.ctx.cfg.http.write_timeout_s)
            self.samples += len(chunk)
            self.frames_sent += 1

    async def _start_audio(self) -> None:
        if not self.audio_started:
            self.audio_started = True
            await self._send(self._start_event())

    # -- the server's events (a subclass speaking another protocol overrides them) ------------------
    def _start_event(self) -> dict:
        """Sent once, before the first audio (or before the end when there is none)."""
        return {"type": "audio.start", "sample_rate": self.sample_rate, "format": "pcm_s16le"}

    async def _text_done(self, text: str) -> None:
        """The audio of `text` (an utterance or a sentence) has all been sent."""
        await self._send({"type": "text.done", "text": text})

    def _done_event(self) -> dict:
        """The last event: everything was spoken (the server then closes with 1000)."""
        return {"type": "done", "audio_seconds": round(self.samples / self.sample_rate, 3)}

    def _error_event(self, message: str, code: str) -> dict:
        return {"type": "error", "message": message, "code": code}

    async def _send(self, event: dict) -> None:
        await asyncio.wait_for(self.ws.send_json(event), self.ctx.cfg.http.write_timeout_s)

    async def _fail(self, message: str, code: str, close_code: int) -> None:
        """Send an error event; the socket is then closed with `close_code` and the message as reason."""
        log.info("live speech: %s", message)
        self.close_code, self.close_reason = close_code, message
        try:
            await self._send(self._error_event(message, code))
        except (ConnectionResetError, asyncio.TimeoutError):
            pass


async def live(request: web.Request) -> web.WebSocketResponse:
    """GET /v1/audio/speech/live: upgrade to a WebSocket and speak text as it arrives (module docstring)."""
    return await serve_session(request, LiveSession)


async def serve_session(request: web.Request, session_class, protocols=()) -> web.WebSocketResponse:
    """Upgrade to a WebSocket (offering the subprotocols `protocols`) and serve one `session_class` session
    (LiveSession or a subclass) on it; 503 while the daemon stops."""
    ws = await open_socket(request, protocols)
    session = session_class(request.app[CTX], ws)
    try:
        await session.run()
    finally:
        await ws.close(code=session.close_code, message=close_reason(session.close_reason))
    return ws


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/audio/speech/live", live)
