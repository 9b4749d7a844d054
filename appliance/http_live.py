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

text_mode "words" (the default): the model's streaming-text mode (engines.runtime.text_feed). Each
complete word goes to the model as it comes, so audio starts after the first word; when the model has
used every word it has, its row waits for more (it never ends early on slow text). Text is spoken as
utterances of one request each: a new one starts at a sentence end after UTTERANCE_CHARS characters.
text_mode "sentences" (and any voice cloned with its reference text, which needs whole text): each
sentence is spoken once it is complete (`text.split.split_streamed`, as the Wyoming server
does). With a lexicon, text waits for the next space or punctuation mark before it is spoken (a word is
replaced whole). Both go through the same streaming engine path as POST /v1/audio/speech (priority 0), one after
the other in order. Text not yet spoken is capped at http.max_text_chars; a client that sends nothing
for http.read_timeout_s while the session waits for its text is dropped.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Optional

from aiohttp import WSMsgType, web

from engines.model.errors import TTSError
from engines.model.errors import EngineBusy
from engines.runtime.text_feed import TextFeed
from audio.encode import pcm16
from text.normalize.lexicon import LexiconError
from text.lexicons import file_lexicon, lexicon_entries, merged
from text.normalize import language_code
from text.split import split_streamed
from audio.speed import StreamStretcher, check_speed
from jobs.submit import check_voice

from appliance.http_common import CTX, ApiError, field
from appliance.languages import model_language
from appliance.streams import serve_stream

log = logging.getLogger(__name__)
END, GONE, CLOSE = object(), object(), object()  # speaker queue sentinel; reader results: client left, session.close
# WebSocket close codes (RFC 6455 7.4): done, bad input or a client breaking the rules, server error, busy
CLOSE_OK, CLOSE_POLICY, CLOSE_ERROR, CLOSE_AGAIN = 1000, 1008, 1011, 1013
UTTERANCE_CHARS = 600  # words mode: an utterance ends at a sentence end once it holds this many characters
UTTERANCE_MAX_CHARS = 2400  # ... or at a word boundary past this many (about 600 tokens: within one request)
TEXT_MODES = ("words", "sentences")


class LiveSession:
    """One WebSocket connection: a reader task turns messages into utterances (a TextFeed each) or
    sentences, a speaker task speaks them in order."""

    def __init__(self, ctx, ws: web.WebSocketResponse):
        self.ctx, self.ws = ctx, ws
        self.opts = {"voice": None, "language": "auto", "instructions": None, "seed": None, "max_frames": None,
                     "speed": 1.0, "text_mode": "words", "lexicon": None}
        self.words: Optional[bool] = None  # words mode, decided at the first text
        self.rest = ""  # sentences mode: text after the last complete sentence
        self.lexicon = None  # the session's pronunciation lexicon, set at the first text
        self.held = ""  # text not yet through the lexicon (after the last space or punctuation mark)
        self.feed: Optional[TextFeed] = None  # words mode: the utterance new text goes to
        self.text_came = asyncio.Event()  # set at every append/end (the speaker waits for a first word)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.queued_chars = 0  # text taken but not yet spoken
        self.speaking = False
        self.audio_started = False
        self.samples = 0
        self.frames_sent = 0  # binary frames of audio sent
        self.sample_rate = ctx.host.engine.sample_rate
        self.stretcher: Optional[StreamStretcher] = None
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
            if self.feed is not None:
                self.feed.end()
            for task in (reader, speaker):
                task.cancel()
            await asyncio.gather(reader, speaker, return_exceptions=True)

    # -- client messages -------------------------------------------------------------------------
    async def _read(self):
        """Read messages until the client leaves (-> GONE) or sends session.close (-> CLOSE); input_text.end
        queues END and reading goes on. Pings are answered here (the socket has no autoping), and only data
        frames restart the idle clock: a client whose library pings every few seconds but sends no text is
        still dropped after http.read_timeout_s while the session waits for its text."""
        idle = self.ctx.cfg.http.read_timeout_s
        clock = asyncio.get_running_loop().time
        deadline = clock() + idle
        while True:
            try:
                left = deadline - clock()
                if left <= 0:
                    raise asyncio.TimeoutError
                msg = await self.ws.receive(timeout=left)
            except asyncio.TimeoutError:
                deadline = clock() + idle
                if self.ended or (self.speaking or not self.queue.empty()) and self.feed is None:
                    continue  # waiting for audio is not idling (an utterance waiting for words is)
                raise ApiError(408, f"no message for {idle:g} s; send input_text.append or input_text.end",
                               "timeout") from None
            if msg.type == WSMsgType.PING:
                try:
                    await self.ws.pong(msg.data)
                except ConnectionResetError:
                    return GONE
                continue
            if msg.type == WSMsgType.PONG:
                continue
            deadline = clock() + idle
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
                self.queue.put_nowait(END)

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
        if self.words is not None:
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
        self._add(self._pronounce(text))

    def _end(self) -> None:
        """No more text: what is held is spoken, then the session ends."""
        held = self._pronounce("", final=True)
        if held:
            self._add(held)
        if self.feed is not None:
            self.feed.end()
            self.feed = None
        rest, self.rest = self.rest.strip(), ""
        if rest:
            self._queue(rest)
        self.text_came.set()

    def _pronounce(self, text: str, final: bool = False) -> str:
        """`text` through the session's lexicon; without `final`, what follows its last space or punctuation
        mark waits for the next piece (a word is replaced whole)."""
        if self.lexicon is None:
            try:
                self.lexicon = merged(file_lexicon(self.ctx.cfg.jobs.lexicon), self.opts["lexicon"])
            except LexiconError as exc:
                raise ApiError(400, str(exc)) from None
        if not self.lexicon:
            return text
        text, self.held = self.held + text, ""
        if not final:
            cut = max((i + 1 for i, ch in enumerate(text) if not (ch.isalnum() or ch == "_")), default=0)
            text, self.held = text[:cut], text[cut:]
            if len(self.held) > self.ctx.cfg.http.max_text_chars:
                raise ApiError(413, f"{len(self.held)} characters without a space or punctuation mark; the limit is "
                                    f"{self.ctx.cfg.http.max_text_chars}", "too_large")
        return self.lexicon.apply(text)

    def _add(self, text: str) -> None:
        limit = self.ctx.cfg.http.max_text_chars
        buffered = self.queued_chars + len(self.rest) + len(text)
        if buffered > limit:
            raise ApiError(413, f"{buffered} characters of text wait to be spoken; the limit is {limit} "
                                "(send text no faster than it is spoken)", "too_large")
        if self.words is None:
            voice = self.opts["voice"] or self.ctx.host.default_voice()
            self.words = self.opts["text_mode"] == "words" and self.ctx.host.engine.streams_text(voice)
        lang = language_code(self.opts["language"]) or "en"
        if not self.words:
            sentences, self.rest = split_streamed(self.rest + text, lang)
            for s in sentences:
                self._queue(s)
            return
        self.queued_chars += len(text)
        while text:
            if self.feed is None:
                self.feed = TextFeed()
                self.queue.put_nowait(self.feed)
            cut = _utterance_end(self.feed.text, text, lang)
            if cut is None:
                self.feed.append(text)
                break
            self.feed.append(text[:cut])
            self.feed.end()
            self.feed, text = None, text[cut:].lstrip()
        self.text_came.set()

    def _queue(self, sentence: str) -> None:
        self.queued_chars += len(sentence)
        self.queue.put_nowait(sentence)

    # -- audio -----------------------------------------------------------------------------------
    async def _speak(self) -> None:
        while True:
            item = await self.queue.get()
            if item is END:
                return
            while item is not None:
                item = await self._speak_item(item)

    async def _speak_item(self, item):
        """Speak a sentence or an utterance; returns an utterance for the words its request did not take
        (it ended early, e.g. at max_frames), else None."""
        if isinstance(item, TextFeed):
            while not item.ready()[0] and not item.ended:  # submitted once it holds a complete word
                self.text_came.clear()
                await self.text_came.wait()
            if not item.ready()[0]:
                return None  # an utterance of whitespace only
        self.speaking = True
        try:
            await self._speak_one(item)
        finally:
            self.speaking = False
        if isinstance(item, str):
            self.queued_chars -= len(item)
            await self._text_done(item)
            return None
        item.end()  # its request has ended: no more words go to it
        spoken, rest = item.text[:item.taken], item.rest
        self.queued_chars -= len(spoken)
        more = None
        if self.feed is item or rest.strip():  # (no await before self.feed moves on: the reader appends to it)
            more = TextFeed(rest)  # the words it did not take start the next utterance
            if self.feed is item:
                self.feed = more  # still receiving: new words go there
            else:
                more.end()
        await self._text_done(spoken.strip())
        return more

    async def _speak_one(self, item) -> None:
        ctx, o = self.ctx, self.opts
        feed = item if isinstance(item, TextFeed) else None
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


def _utterance_end(current: str, text: str, lang: str) -> Optional[int]:
    """Where in `text` (appended to an utterance holding `current`) the utterance should end: after its last
    complete sentence once it holds UTTERANCE_CHARS characters, else at a word boundary once it would pass
    UTTERANCE_MAX_CHARS; None: all of `text` goes to this utterance."""
    total = len(current) + len(text)
    if total < UTTERANCE_CHARS:
        return None
    _, rest = split_streamed(current + text, lang)
    cut = total - len(rest) - len(current)
    if cut > 0:
        return cut
    if total <= UTTERANCE_MAX_CHARS:
        return None
    space = text.rfind(" ", 0, max(UTTERANCE_MAX_CHARS - len(current), 1))
    return space if space > 0 else max(UTTERANCE_MAX_CHARS - len(current), 1)


def parse_message(raw: str) -> dict:
    """A client's message: a JSON object (400 otherwise)."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"message is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, 'each message must be a JSON object with a "type"')
    return data


async def live(request: web.Request) -> web.WebSocketResponse:
    """GET /v1/audio/speech/live: upgrade to a WebSocket and speak text as it arrives (module docstring)."""
    return await serve_session(request, LiveSession)


async def serve_session(request: web.Request, session_class, protocols=()) -> web.WebSocketResponse:
    """Upgrade to a WebSocket (offering the subprotocols `protocols`) and serve one `session_class` session
    (LiveSession or a subclass) on it; 503 while the daemon stops."""
    ctx = request.app[CTX]
    if not ctx.accepting:
        raise ApiError(503, "the daemon is shutting down", "busy", {"Retry-After": str(ctx.cfg.runtime.retry_after_s)})
    # autoping off: LiveSession._read answers pings itself, so that they do not restart its idle clock
    ws = web.WebSocketResponse(max_msg_size=ctx.cfg.http.max_body_bytes, autoping=False, protocols=protocols)
    await ws.prepare(request)
    session = session_class(ctx, ws)
    try:
        await session.run()
    finally:
        await ws.close(code=session.close_code, message=close_reason(session.close_reason))
    return ws


def close_reason(text: str) -> bytes:
    """A close frame's reason: at most 123 bytes of UTF-8 (RFC 6455 5.5), cut at a character boundary."""
    return text.encode("utf-8")[:123].decode("utf-8", "ignore").encode("utf-8")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/audio/speech/live", live)
