"""POST /v1/audio/speech: the OpenAI speech API, streamed as the engine makes audio.

Like OpenAI's endpoint, the answer is streamed by default (chunked transfer encoding): every format
(pcm, wav, flac, mp3, opus) is encoded chunk by chunk (`audio.encode_stream`) and sent as soon
as the encoder has bytes. `"stream": false` (an extension) waits for the whole audio and sends one
complete file whose headers carry the exact length (WAV sizes, FLAC totals, MP3 Xing/LAME tag),
for readers that need them.
"""
from __future__ import annotations

import asyncio
import logging
import tempfile
from pathlib import Path

import numpy as np
from aiohttp import web

from engines.model.errors import TTSError
from audio.encode import encode_bytes
from audio.encode_stream import EncoderUnavailable, StreamEncoder
from audio.speed import StreamStretcher, check_speed, stretch

from appliance.http_common import CTX, ApiError, decode_b64_audio, field, read_json
from appliance.streams import ShuttingDown, serve_stream

log = logging.getLogger(__name__)
# response_format -> Content-Type (OpenAI's values)
FORMATS = {"pcm": "audio/pcm", "wav": "audio/wav", "flac": "audio/flac", "mp3": "audio/mpeg", "opus": "audio/ogg"}


async def speech(request: web.Request) -> web.StreamResponse:
    """POST /v1/audio/speech — OpenAI speech API.

    Body: model (ignored: one model is loaded), input (text), voice, instructions, response_format
    (pcm | wav | flac | mp3 | opus; default mp3 as OpenAI), speed (0.5-2.0, default 1.0: time-stretched
    with the pitch kept; a stream stays chunked, its first audio up to 0.4 s of speech later), stream_format ("audio" only), stream (default true: encoded chunk by chunk as
    audio is made; false: one complete file when done), and extras: language, ref_audio (base64),
    ref_text, seed, max_frames (cap on generated frames, 12.5 per second; model.max_frames caps it too).
    """
    ctx = request.app[CTX]
    data = await read_json(request)
    text = field(data, "input", str, required=True)
    if not text.strip():
        raise ApiError(400, "'input' is empty: give some text to speak")
    if len(text) > ctx.cfg.http.max_text_chars:
        raise ApiError(413, f"'input' has {len(text)} characters; the limit is {ctx.cfg.http.max_text_chars} "
                            "(submit long texts as a job: POST /v1/jobs)", "too_large")
    fmt = (field(data, "response_format", str) or "mp3").lower()  # null: the default too
    if fmt not in FORMATS:
        raise ApiError(400, f"unknown response_format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if (field(data, "stream_format", str) or "audio") != "audio":
        raise ApiError(400, "only stream_format 'audio' is supported (the encoded audio itself, sent in chunks "
                            "as it is made); server-sent events are not")
    stream = field(data, "stream", bool) is not False  # absent or null: stream, as OpenAI does
    notes = []
    try:
        speed = check_speed(field(data, "speed", (int, float)))
    except ValueError as exc:
        raise ApiError(400, f"'speed': {exc}") from None
    try:  # opening an encoder also tells, before any synthesis, whether this machine can write fmt
        encoder = StreamEncoder(fmt, ctx.host.engine.sample_rate)
    except EncoderUnavailable as exc:
        raise ApiError(400, str(exc), "unsupported_format") from None
    if not stream:
        encoder.close()
        encoder = None
    try:
        with tempfile.TemporaryDirectory(prefix="tts-req-") as tmp:
            ref_audio = decode_b64_audio(data, Path(tmp))
            req = ctx.host.request(text, voice=field(data, "voice", str),
                                   language=field(data, "language", str, "auto"),
                                   instruct=field(data, "instructions", str), ref_audio=ref_audio,
                                   ref_text=field(data, "ref_text", str), seed=field(data, "seed", int),
                                   max_frames=field(data, "max_frames", int))
            if req is None:
                raise ApiError(400, "this Base checkpoint clones voices: give 'ref_audio' (base64) or a saved voice "
                                    "(POST /v1/voices adds one)")
            return await _serve(request, req, fmt, encoder, notes, speed)
    finally:
        if encoder is not None:
            encoder.close()  # no-op once finished


async def _serve(request, req, fmt: str, encoder, notes: list, speed: float = 1.0) -> web.StreamResponse:
    ctx = request.app[CTX]
    loop = asyncio.get_running_loop()
    resp = None
    try:
        async with serve_stream(ctx, "speech", req) as stream:
            chunks = stream.chunks()
            try:
                first = await chunks.__anext__()  # a refusal (busy) or a bad request still gets its status code
            except StopAsyncIteration:
                first = np.zeros(0, np.float32)
            sr = stream.sample_rate
            headers = {"Content-Type": FORMATS[fmt], "X-Sample-Rate": str(sr)}
            if notes:
                headers["X-TTS-Note"] = "; ".join(notes)
            if encoder is None:
                audio = np.concatenate([first] + [c async for c in chunks])
                audio = await loop.run_in_executor(None, stretch, audio, sr, speed)
                body = await loop.run_in_executor(None, encode_bytes, audio, sr, fmt)
                stream.outcome = "ok"
                return web.Response(body=body, headers=headers)
            resp = web.StreamResponse(headers=headers)
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            timeout = ctx.cfg.http.write_timeout_s
            stretcher = StreamStretcher(sr, speed) if speed != 1.0 else None

            def push(chunk) -> bytes:
                return encoder.push(stretcher.push(chunk) if stretcher else chunk)

            def finish() -> bytes:
                return (encoder.push(stretcher.finish()) if stretcher else b"") + encoder.finish()

            async def send(work, *args):
                # coded formats and time-stretching take ms per chunk: a worker thread keeps other streams flowing
                blocking = encoder.blocking or stretcher is not None
                data = await loop.run_in_executor(None, work, *args) if blocking else work(*args)
                if data:
                    await asyncio.wait_for(resp.write(data), timeout)

            await send(push, first)
            async for chunk in chunks:
                await send(push, chunk)
            await send(finish)
            await resp.write_eof()
            stream.outcome = "ok"
            return resp
    except ShuttingDown as exc:
        raise ApiError(503, str(exc), "busy", {"Retry-After": str(ctx.cfg.runtime.retry_after_s)}) from None
    except TTSError as exc:
        if resp is None:
            raise
        log.warning("stream failed after start: %s", exc)  # headers already sent: nothing better than cutting it
        return resp
    except asyncio.TimeoutError:
        log.warning("dropping a stream whose client stopped reading")
        return resp
    except ConnectionResetError:
        log.info("client went away mid-stream; request cancelled")
        return resp
    except Exception:
        if resp is None:
            raise
        log.exception("%s stream failed after start", fmt)  # headers already sent: log it and cut the stream
        return resp
