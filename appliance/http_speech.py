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
from audio.speed import StreamStretcher, stretch

from audio.encode_stream import CONTENT_TYPES, EncoderUnavailable, StreamEncoder, encode_whole
from appliance.http_common import CTX, ApiError, read_json
from appliance.http_refaudio import reference_audio
from appliance.speech_body import options, spoken_text, synthesis_request
from appliance.streams import ShuttingDown, serve_stream

log = logging.getLogger(__name__)
FORMATS = CONTENT_TYPES  # response_format -> Content-Type (OpenAI's values)
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")  # names OpenAI clients send; all mean the loaded model
FRAME_SAMPLES = 1920  # samples of one codec frame (12.5 frames per second at 24 kHz): the audio "tokens"


async def speech(request: web.Request) -> web.StreamResponse:
    """POST /v1/audio/speech — OpenAI speech API.

    Body: model (ignored: one model is loaded), input (text), voice (a name, or {"id": name}), instructions,
    response_format (pcm | wav | flac | mp3 | opus | aac; default http.response_format, mp3 as OpenAI), speed
    (0.25-4.0, default 1.0: time-stretched with the pitch kept; natural within 0.5-2.0; a stream stays chunked,
    its first audio up to 0.4 s of speech later), stream_format ("audio": the encoded audio; "sse": Server-Sent
    Events, streamed), and extras: stream (default false: one complete file when done; true: encoded chunk by
    chunk as audio is made), language (a name or a BCP-47 tag: en, de-DE), ref_audio (base64, a data URL or a
    file in the voices folder: appliance.http_refaudio), ref_text, seed, max_frames (cap on the answer's
    frames, 12.5 per second, over all pieces of a long input; model.max_frames caps each piece), lexicon
    ({"word": "what to say"}, over the entries of jobs.lexicon's file); vllm-omni's fields (task_type,
    max_new_tokens, non_streaming_mode, x_vector_only_mode, ...: appliance.speech_body).
    """
    ctx = request.app[CTX]
    data = await read_json(request)
    opts = options(ctx, data)
    text = spoken_text(ctx, data, opts)
    try:  # opening an encoder also tells, before any synthesis, whether this machine can write the format
        encoder = StreamEncoder(opts.fmt, ctx.host.engine.sample_rate)
    except EncoderUnavailable as exc:
        raise ApiError(400, str(exc), "unsupported_format") from None
    if not opts.stream:
        encoder.close()
        encoder = None
    try:
        with tempfile.TemporaryDirectory(prefix="tts-req-") as tmp:
            req = synthesis_request(ctx, opts, text, reference_audio(ctx, data.get("ref_audio"), Path(tmp)))
            return await _serve(request, req, opts.fmt, encoder, opts.speed, opts.sse, opts.max_frames)
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
    "created_at"}], "languages": [...], "voices": [names], "uploaded_voices": [{"name", "created_at",
    "file_size"}]}: the checkpoint's speakers (type "builtin") or saved cloned voices (type "audio_sample"), the
    names `voice` takes; `voices` and `uploaded_voices` (the saved clones) are what vllm-omni's clients read."""
    e = request.app[CTX].host.engine
    builtin = e.model_type != "base"
    data, uploaded = [], []
    for name in e.voices:
        created = size = 0
        if not builtin:
            try:
                st = e.voice_file(name).stat()
                created, size = int(st.st_mtime), st.st_size
            except (OSError, ValueError):
                pass
            uploaded.append({"name": name, "created_at": created, "file_size": size})
        data.append({"id": name, "name": name, "object": "audio.voice", "created_at": created,
                     "type": "builtin" if builtin else "audio_sample"})
    return web.json_response({"object": "list", "data": data, "languages": e.languages, "voices": list(e.voices),
                              "uploaded_voices": uploaded})


async def upload_audio_voice(request):
    """POST /v1/audio/voices (vllm-omni's multipart voice upload: audio_sample, name, consent, ref_text): 400
    naming the route that adds a voice here; nothing is read or saved."""
    raise ApiError(400, "voices are not uploaded here: send the reference audio to POST /v1/voices as JSON "
                        '{"name": ..., "ref_audio": <base64 audio or a data URL>, "ref_text": ...} (a Base checkpoint '
                        "clones it; GET /v1/audio/voices lists the voices)")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/v1/audio/voices", list_audio_voices)
    app.router.add_post("/v1/audio/voices", upload_audio_voice)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{id}", get_model)
