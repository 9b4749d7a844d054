"""GET /v1/audio/speech/stream: vllm-omni's WebSocket for text that arrives in pieces, so clients written for
vllm-omni's Qwen3-TTS serving (its streaming_speech_client example among them) speak to this daemon unmodified.

Client -> server, JSON text frames:
    {"type": "session.config", ...}  first (within http.read_timeout_s); again between utterances to change it.
        The fields of POST /v1/audio/speech but `input` (voice, task_type, language, instructions, speed,
        max_new_tokens, ref_audio, ref_text, x_vector_only_mode, seed, ...: appliance.speech_body), with
        response_format defaulting to wav (vllm-omni's default here), plus
        stream_audio        false (default): one binary frame per sentence, the whole file in response_format;
                            true: 16-bit PCM chunks as they are made (response_format pcm)
        split_granularity   none (default): what input.done flushes is one request; sentence: a request at each
                            complete sentence, before input.done; clause: also at , ; : and their CJK marks
    {"type": "input.text", "text": "..."}
    {"type": "input.done"}          flush: the buffered text is spoken, then session.done; the connection stays
    {"type": "session.close"}       close (1000) once everything flushed before it has been spoken
Server -> client, per request ("sentence"):
    {"type": "audio.start", "utterance_index", "sentence_index", "sentence_text", "format", "sample_rate",
     "channels"}  (with stream_audio: at its first audio), binary frame(s),
    {"type": "audio.done", "utterance_index", "sentence_index", "total_bytes", "error"}
and per flush {"type": "session.done", "utterance_index", "total_sentences"}. `utterance_index` counts flushes,
`sentence_index` the requests inside one. {"type": "error", "message"} reports a bad message (the session goes
on) or a request that failed (its audio.done says "error": true; "partial_audio": true when some audio was
sent). Fatal, followed by a close with 1008: anything but a valid session.config first, no message for
http.read_timeout_s while nothing is being spoken (pings, e.g. the `websockets` package's keepalive, are
answered but are not messages: appliance.ws_common). Speech goes through the same streaming path as
POST /v1/audio/speech (appliance.streams.serve_stream); speed is applied also to streamed audio.
"""
from __future__ import annotations

import asyncio
import logging
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
from aiohttp import WSMsgType, web

from audio.encode import pcm16
from audio.encode_stream import encode_whole
from audio.speed import StreamStretcher, stretch
from engines.model.errors import EngineBusy, TTSError
from jobs.submit import check_voice
from text.normalize import language_code
from text.split import split_clauses, split_streamed

from appliance.http_common import CTX, ApiError, field
from appliance.http_refaudio import reference_audio
from appliance.speech_body import SpeechOptions, options, synthesis_request
from appliance.streams import serve_stream
from appliance.ws_common import CLOSE_OK, CLOSE_POLICY, Messages, close_reason, open_socket, parse_message

log = logging.getLogger(__name__)
SPLITS = ("none", "sentence", "clause")
CLAUSE_END = re.compile(r"[,;:\u2014](?=\s)|[\uff0c\u3001\uff1b\uff1a]")  # complete once whitespace follows
FLUSH, CLOSE, GONE = object(), object(), object()


@dataclass
class StreamConfig:
    """One session.config, checked."""

    opts: SpeechOptions
    stream_audio: bool = False
    split: str = "none"
    ref_audio: Optional[str] = None


class Fatal(Exception):
    """The session ends: an error event, then a close with 1008."""


class StreamSession:
    """One connection: a reader turns messages into configs, texts to speak and flushes, in order; a speaker
    speaks them one after the other."""

    def __init__(self, ctx, ws: web.WebSocketResponse, tmp: Path):
        self.ctx, self.ws, self.tmp = ctx, ws, tmp
        self.queue: asyncio.Queue = asyncio.Queue()
        self.config: Optional[StreamConfig] = None  # the reader's (the speaker takes them from the queue)
        self.buffer = ""  # text of the open utterance not yet queued
        self.open = False  # text came since the last input.done
        self.speaking = False
        self.close_code, self.close_reason = CLOSE_OK, ""

    async def run(self) -> None:
        reader, speaker = asyncio.create_task(self._read()), asyncio.create_task(self._speak())
        try:
            done, _ = await asyncio.wait({reader, speaker}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done and reader.result() is not CLOSE:
                return  # the client left (GONE), or a fatal error (reported: None)
            await speaker
        except (ConnectionResetError, asyncio.TimeoutError):
            log.info("speech stream client stopped reading; its speech is cancelled")
            self.close_code, self.close_reason = CLOSE_POLICY, "the client stopped reading"
        finally:
            for task in (reader, speaker):
                task.cancel()
            await asyncio.gather(reader, speaker, return_exceptions=True)

    # -- client messages -------------------------------------------------------------------------
    async def _read(self):
        """Apply the client's messages until it leaves (GONE), closes the session (CLOSE) or a fatal error
        (None). Pings are answered but are not messages (ws_common.Messages): a client that only pings is
        idle."""
        idle = self.ctx.cfg.http.read_timeout_s
        messages = Messages(self.ws, idle)
        while True:
            try:
                msg = await messages.next()
            except asyncio.TimeoutError:
                if self.speaking or not self.queue.empty():
                    continue  # waiting for audio is not idling
                what = "session.config" if self.config is None else "message"
                return await self._fatal(f"no {what} for {idle:g} s; the session is closed")
            if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                return GONE
            try:
                if msg.type != WSMsgType.TEXT:
                    raise ApiError(400, "send JSON text frames, not binary ones")
                if self._message(parse_message(msg.data)):
                    return CLOSE
            except Fatal as exc:
                return await self._fatal(str(exc))
            except (ApiError, TTSError) as exc:
                if self.config is None:
                    return await self._fatal(exc.message if isinstance(exc, ApiError) else str(exc))
                await self._send({"type": "error", "message": exc.message if isinstance(exc, ApiError) else str(exc)})

    def _message(self, data: dict) -> bool:
        """Apply one message; True at session.close."""
        kind = data.get("type")
        if kind == "session.config":
            if self.open:
                raise ApiError(400, "session.config cannot change an utterance in progress; send input.done first")
            self.config = self._configure(data)
            self.queue.put_nowait(self.config)
            return False
        if self.config is None:
            raise Fatal(f"the first message must be session.config, not {kind!r}")
        if kind == "input.text":
            self._add(field(data, "text", str, required=True))
        elif kind == "input.done":
            self._add("", flush=True)
            self.open = False
            self.queue.put_nowait(FLUSH)
        elif kind == "session.close":
            self.queue.put_nowait(CLOSE)
            return True
        else:
            raise ApiError(400, f"unknown message type {kind!r}; send session.config, input.text, input.done or "
                                "session.close")
        return False

    def _configure(self, data: dict) -> StreamConfig:
        body = {k: v for k, v in data.items() if k not in ("type", "input", "stream", "stream_format")}
        body["response_format"] = body.get("response_format") or "wav"
        if field(data, "word_timestamps", bool):
            raise ApiError(400, "word timestamps are not made here; leave word_timestamps out")
        if data.get("speaker_embedding") is not None:
            raise ApiError(400, "speaker_embedding is not taken here; send ref_audio or name a saved voice")
        opts = options(self.ctx, body)
        cfg = StreamConfig(opts, bool(field(data, "stream_audio", bool)), field(data, "split_granularity", str) or "none")
        if cfg.split not in SPLITS:
            raise ApiError(400, f"split_granularity must be one of {', '.join(SPLITS)}")
        if cfg.stream_audio and opts.fmt != "pcm":
            raise ApiError(400, "stream_audio sends 16-bit PCM chunks: set response_format to pcm (or stream_audio "
                                "to false for one file per sentence)")
        check_voice(self.ctx.host.engine, opts.voice)
        cfg.ref_audio = reference_audio(self.ctx, data.get("ref_audio"), Path(tempfile.mkdtemp(dir=self.tmp)))
        if self.ctx.host.engine.model_type == "base" and not (opts.voice or cfg.ref_audio):
            raise ApiError(400, "this Base checkpoint clones voices: give ref_audio or a saved voice in session.config")
        return cfg

    def _add(self, text: str, flush: bool = False) -> None:
        limit = self.ctx.cfg.http.max_text_chars
        if len(self.buffer) + len(text) > limit:
            raise ApiError(413, f"more than {limit} characters wait for input.done; the text was dropped (send "
                                "input.done sooner, or split_granularity sentence)", "too_large")
        self.buffer += text
        self.open = self.open or bool(text)
        units, split = [], self.config.split
        if flush:
            units, self.buffer = [self.buffer], ""
        elif split != "none":
            units, self.buffer = split_streamed(self.buffer, language_code(self.config.opts.language) or "en")
            if split == "clause":
                cut = max((m.end() for m in CLAUSE_END.finditer(self.buffer)), default=0)
                units, self.buffer = units + [self.buffer[:cut]], self.buffer[cut:]
        for unit in units:
            parts = split_clauses(unit) if split == "clause" else [unit.strip()]
            for part in filter(None, parts):
                self.queue.put_nowait(part)

    async def _fatal(self, message: str):
        self.close_code, self.close_reason = CLOSE_POLICY, message
        await self._send({"type": "error", "message": message})
        return None

    # -- audio -----------------------------------------------------------------------------------
    async def _speak(self) -> None:
        config, utterance, sentence = None, 0, 0
        while True:
            item = await self.queue.get()
            if item is CLOSE:
                return
            if isinstance(item, StreamConfig):
                config = item
            elif item is FLUSH:
                await self._send({"type": "session.done", "utterance_index": utterance, "total_sentences": sentence})
                utterance, sentence = utterance + 1, 0
            else:
                self.speaking = True
                try:
                    await self._speak_one(config, item, utterance, sentence)
                finally:
                    self.speaking = False
                sentence += 1

    async def _speak_one(self, cfg: StreamConfig, text: str, utterance: int, sentence: int) -> None:
        ctx, opts, loop = self.ctx, cfg.opts, asyncio.get_running_loop()
        where = {"utterance_index": utterance, "sentence_index": sentence}
        start = {"type": "audio.start", **where, "sentence_text": text, "format": opts.fmt,
                 "sample_rate": ctx.host.engine.sample_rate, "channels": 1}
        started, sent, why = False, 0, None

        async def put(data: bytes = b"") -> None:  # audio.start before the first bytes
            nonlocal started, sent
            if not started:
                started = True
                await self._send(start)
            if data:
                await asyncio.wait_for(self.ws.send_bytes(data), ctx.cfg.http.write_timeout_s)
                sent += len(data)

        if not cfg.stream_audio:
            await put()  # a whole file per sentence: audio.start before synthesis, as vllm-omni sends it
        try:
            req = synthesis_request(ctx, opts, opts.lexicon.apply(text) if opts.lexicon else text, cfg.ref_audio)
            async with serve_stream(ctx, "speech_stream", req, opts.max_frames) as stream:
                sr = stream.sample_rate
                if cfg.stream_audio:
                    stretcher = StreamStretcher(sr, opts.speed) if opts.speed != 1.0 else None
                    async for chunk in stream.chunks():
                        if stretcher is not None:
                            chunk = await loop.run_in_executor(None, stretcher.push, chunk)
                        await put(pcm16(chunk) if len(chunk) else b"")
                    if stretcher is not None:
                        await put(pcm16(await loop.run_in_executor(None, stretcher.finish)))
                else:
                    audio = np.concatenate([np.zeros(0, np.float32)] + [c async for c in stream.chunks()])
                    audio = await loop.run_in_executor(None, stretch, audio, sr, opts.speed)
                    await put(await loop.run_in_executor(None, encode_whole, audio, sr, opts.fmt))
                stream.outcome = "ok"
        except EngineBusy as exc:
            why = f"{exc}; try again in {ctx.cfg.runtime.retry_after_s} s"
        except (ApiError, TTSError) as exc:
            why = exc.message if isinstance(exc, ApiError) else str(exc)
        except (ConnectionResetError, asyncio.TimeoutError):
            raise
        except Exception as exc:  # a bug: this request fails, the session and the daemon go on
            log.exception("speech stream request failed")
            why = f"internal error: {type(exc).__name__}"
        await put()  # no audio at all: audio.start and audio.done stay paired
        if why is not None:
            log.info("speech stream request failed: %s", why)
            event = {"type": "error", "message": f"utterance {utterance}, sentence {sentence}: {why}"}
            await self._send({**event, "partial_audio": True, "action": "discard"} if sent else event)
        await self._send({"type": "audio.done", **where, "total_bytes": sent, "error": why is not None})

    async def _send(self, event: dict) -> None:
        await asyncio.wait_for(self.ws.send_json(event), self.ctx.cfg.http.write_timeout_s)


async def speech_stream(request: web.Request) -> web.WebSocketResponse:
    """GET /v1/audio/speech/stream: one vllm-omni streaming-text session (module docstring)."""
    ws = await open_socket(request)
    with tempfile.TemporaryDirectory(prefix="tts-stream-") as tmp:
        session = StreamSession(request.app[CTX], ws, Path(tmp))
        try:
            await session.run()
        finally:
            await ws.close(code=session.close_code, message=close_reason(session.close_reason))
    return ws


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/audio/speech/stream", speech_stream)
