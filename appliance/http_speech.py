"""The OpenAI speech API: POST /v1/audio/speech, and GET /v1/models and /v1/audio/voices for clients
that ask what there is (the `openai` SDK, Open WebUI ...).

What the OpenAI SDK sends (`client.audio.speech.create(...)`: no `stream`) gets one complete file with
exact length headers (WAV sizes, FLAC totals, MP3 Xing/LAME tag) and a Content-Length, sent when the
audio is done. `"stream": true` (an extension) streams it as the engine makes it (chunked transfer
encoding): every format is encoded chunk by chunk (`audio.encode_stream`) and sent as soon as the
encoder has bytes. `"stream_format": "sse"` streams Server-Sent Events as OpenAI's API does:
`speech.audio.delta` events with base64 audio in response_format, then one `speech.audio.done`.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np
from aiohttp import web

from engines.model.errors import TTSError
from text.normalize.lexicon import LexiconError
from text.lexicons import file_lexicon, lexicon_entries, merged
from audio.speed import StreamStretcher, check_speed, stretch

from audio.encode_stream import EncoderUnavailable, StreamEncoder, encode_whole
from appliance.http_common import CTX, ApiError, decode_b64_audio, field, read_json
from appliance.languages import model_language
from appliance.streams import ShuttingDown, serve_stream

log = logging.getLogger(__name__)
# response_format -> Content-Type (OpenAI's values)
FORMATS = {"pcm": "audio/pcm", "wav": "audio/wav", "flac": "audio/flac", "mp3": "audio/mpeg", "opus": "audio/ogg",
           "aac": "audio/aac"}
STREAM_FORMATS = ("audio", "sse")
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")  # names OpenAI clients send; all mean the loaded model
FRAME_SAMPLES = 1920  # samples of one codec frame (12.5 frames per second at 24 kHz): the audio "tokens"


async def speech(request: web.Request) -> web.StreamResponse:
    """POST /v1/audio/speech — OpenAI speech API.

    Body: model (ignored: one model is loaded), input (text), voice (a name, or {"id": name}), instructions,
    response_format (pcm | wav | flac | mp3 | opus | aac; default mp3 as OpenAI), speed (0.5-2.0, default
    1.0: time-stretched with the pitch kept; a stream stays chunked, its first audio up to 0.4 s of speech
    later), stream_format ("audio": the encoded audio; "sse": Server-Sent Events, streamed), and extras:
    stream (default false: one complete file when done; true: encoded chunk by chunk as audio is made),
    language (a name or a BCP-47 tag: en, de-DE), ref_audio (base64), ref_text, seed, max_frames (cap on
    the answer's frames, 12.5 per second, over all pieces of a long input; model.max_frames caps each piece), lexicon ({"word": "what to say"},
    over the entries of jobs.lexicon's file).
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
    stream_format = field(data, "stream_format", str) or "audio"
    if stream_format not in STREAM_FORMATS:
        raise ApiError(400, f"unknown stream_format {stream_format!r}; choose audio (the encoded audio itself) or "
                            "sse (Server-Sent Events with base64 audio)")
    sse = stream_format == "sse"
    stream = sse or field(data, "stream", bool) is True  # absent or null: one complete file
    try:
        lexicon = merged(file_lexicon(ctx.cfg.jobs.lexicon), lexicon_entries(data.get("lexicon"), "request"))
    except LexiconError as exc:
        raise ApiError(400, str(exc)) from None
    text = lexicon.apply(text) if lexicon else text
    voice = data.get("voice")
    if isinstance(voice, dict):  # the SDK's custom voice reference {"id": ...}
        voice = voice.get("id")
    if voice is not None and not isinstance(voice, str):
        raise ApiError(400, """'voice' must be a voice name or {"id": name} (GET /v1/audio/voices lists them)""")
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
            language = model_language(field(data, "language", str), ctx.host.engine.languages)
            req = ctx.host.request(text, voice=voice, language=language, instruct=field(data, "instructions", str),
                                   ref_audio=ref_audio, ref_text=field(data, "ref_text", str),
                                   seed=field(data, "seed", int), max_frames=field(data, "max_frames", int))
            if req is None:
                raise ApiError(400, "this Base checkpoint clones voices: give 'ref_audio' (base64) or a saved voice "
                                    "(POST /v1/voices adds one)")
            return await _serve(request, req, fmt, encoder, speed, sse, field(data, "max_frames", int))
    finally:
        if encoder is not None:
            encoder.close()  # no-op once finished


def sse_event(event: dict) -> bytes:
    """One Server-Sent Event carrying `event` as JSON (named by its type, as OpenAI's stream does)."""
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


async def _serve(request, req, fmt: str, encoder, speed: float = 1.0, sse: bool = False,
                 max_frames: Optional[int] = None) -> web.StreamResponse:
    ctx = request.app[CTX]
    loop = asyncio.get_running_loop()
    resp = None
    try:
        async with serve_stream(ctx, "speech", req, max_frames) as stream:
            chunks = stream.chunks()
            try:
                first = await chunks.__anext__()  # a refusal (busy) or a bad request still gets its status code
            except StopAsyncIteration:
                first = np.zeros(0, np.float32)
            sr = stream.sample_rate
            headers = {"Content-Type": "text/event-stream" if sse else FORMATS[fmt], "X-Sample-Rate": str(sr)}
            if encoder is None:
                audio = np.concatenate([first] + [c async for c in chunks])
                audio = await loop.run_in_executor(None, stretch, audio, sr, speed)
                body = await loop.run_in_executor(None, encode_whole, audio, sr, fmt)
                stream.outcome = "ok"
                return web.Response(body=body, headers=headers)  # Content-Length: the whole file
            if sse:
                headers["Cache-Control"] = "no-cache"
            resp = web.StreamResponse(headers=headers)
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            timeout = ctx.cfg.http.write_timeout_s
            stretcher = StreamStretcher(sr, speed) if speed != 1.0 else None
            samples = 0

            def push(chunk) -> bytes:
                return encoder.push(stretcher.push(chunk) if stretcher else chunk)

            def finish() -> bytes:
                return (encoder.push(stretcher.finish()) if stretcher else b"") + encoder.finish()

            async def send(work, *args):
                # coded formats and time-stretching take ms per chunk: a worker thread keeps other streams flowing
                blocking = encoder.blocking or stretcher is not None
                data = await loop.run_in_executor(None, work, *args) if blocking else work(*args)
                if data and sse:
                    data = sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
                if data:
                    await asyncio.wait_for(resp.write(data), timeout)

            await send(push, first)
            samples += len(first)
            async for chunk in chunks:
                await send(push, chunk)
                samples += len(chunk)
            await send(finish)
            if sse:  # usage: the audio frames made (the model's audio tokens); text tokens are not counted here
                frames = -(-samples // FRAME_SAMPLES)
                usage = {"input_tokens": 0, "output_tokens": frames, "total_tokens": frames}
                await asyncio.wait_for(resp.write(sse_event({"type": "speech.audio.done", "usage": usage})), timeout)
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


# -- what there is -----------------------------------------------------------------------------
def _models(ctx) -> list[dict]:
    """The loaded checkpoint (by its folder name), then the OpenAI model names the speech route takes for it."""
    path = Path(str(ctx.cfg.model.path))
    try:
        created = int(path.stat().st_mtime)
    except OSError:
        created = 0
    return [{"id": name, "object": "model", "created": created, "owned_by": "tts-appliance"}
            for name in (path.name, *OPENAI_MODELS)]


async def list_models(request):
    """GET /v1/models -> {"object": "list", "data": [{"id", "object": "model", "created", "owned_by"}]}"""
    return web.json_response({"object": "list", "data": _models(request.app[CTX])})


async def get_model(request):
    """GET /v1/models/{id}: one of the list (404 otherwise)."""
    name = request.match_info["id"]
    for m in _models(request.app[CTX]):
        if m["id"] == name:
            return web.json_response(m)
    raise ApiError(404, f"no model {name!r}; GET /v1/models lists them", "not_found")


async def list_audio_voices(request):
    """GET /v1/audio/voices -> {"object": "list", "data": [{"id", "name", "object": "audio.voice", "type",
    "created_at"}], "languages": [...]}: the checkpoint's speakers (type "builtin") or saved cloned voices
    (type "audio_sample"), the names `voice` takes."""
    e = request.app[CTX].host.engine
    builtin = e.model_type != "base"
    data = []
    for name in e.voices:
        created = 0
        if not builtin:
            try:
                created = int(e.voice_file(name).stat().st_mtime)
            except (OSError, ValueError):
                pass
        data.append({"id": name, "name": name, "object": "audio.voice", "created_at": created,
                     "type": "builtin" if builtin else "audio_sample"})
    return web.json_response({"object": "list", "data": data, "languages": e.languages})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/v1/audio/voices", list_audio_voices)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{id}", get_model)
