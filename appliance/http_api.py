"""Local HTTP API (aiohttp), served on a Unix socket and optionally on loopback TCP.

    POST   /v1/audio/speech      OpenAI-compatible speech, streamed (appliance.http_speech)
    GET    /v1/voices            voices and languages of the loaded checkpoint
    POST   /v1/voices            add a cloned voice (Base checkpoints): {"name", "ref_audio" (base64), "ref_text"}
    DELETE /v1/voices/{name}     remove a saved cloned voice
    GET    /health               {"status": "ok" | "starting" | "stopping", ...}
    GET    /metrics              Prometheus text format
    /v1/jobs...                  batch jobs (appliance.http_jobs)

Every error is JSON: `{"error": {"message": ..., "type": ..., "code": <http status>}}`.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
import tempfile
from pathlib import Path

from aiohttp import web

from engines.model.errors import TTSError

from appliance.engine_host import EngineBusy

log = logging.getLogger(__name__)
VOICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
CTX = web.AppKey("ctx", object)


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", headers=None):
        super().__init__(message)
        self.status, self.message, self.type, self.headers = status, message, type_, headers or {}


def error_response(status: int, message: str, type_: str, headers=None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": type_, "code": status}}, status=status,
                             headers=headers)


@web.middleware
async def json_errors(request: web.Request, handler):
    """Turn every failure into a JSON error body (400 bad input, 413 too large, 503 busy ...)."""
    ctx = request.app[CTX]
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.message, exc.type, exc.headers)
    except EngineBusy as exc:
        ctx.metrics.error("busy")
        return error_response(503, str(exc), "busy",
                              {"Retry-After": str(ctx.cfg.runtime.retry_after_s)})
    except TTSError as exc:
        ctx.metrics.error(type(exc).__name__)
        return error_response(400, str(exc), type(exc).__name__)
    except web.HTTPRequestEntityTooLarge:
        return error_response(413, f"request body larger than {ctx.cfg.http.max_body_bytes} bytes", "too_large")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.reason, "http_error", {k: v for k, v in exc.headers.items()
                                                                    if k in ("Allow", "Retry-After")})
    except asyncio.TimeoutError:
        return error_response(408, "the request was not received in time", "timeout")
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as exc:  # a bug: log it, answer 500, keep serving
        log.exception("%s %s failed", request.method, request.path)
        ctx.metrics.error(type(exc).__name__)
        return error_response(500, f"internal error: {type(exc).__name__}", "internal_error")


async def read_json(request: web.Request) -> dict:
    """The request body as a JSON object (400 otherwise), read within the read timeout."""
    ctx = request.app[CTX]
    if request.content_length is not None and request.content_length > ctx.cfg.http.max_body_bytes:
        raise ApiError(413, f"request body larger than {ctx.cfg.http.max_body_bytes} bytes", "too_large")
    raw = await asyncio.wait_for(request.read(), ctx.cfg.http.read_timeout_s)
    try:
        data = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "body must be a JSON object")
    return data


def _field(data: dict, name: str, typ, default=None, required=False):
    value = data.get(name, default)
    if value is None:
        if required:
            raise ApiError(400, f"'{name}' is required")
        return None
    if typ is int and isinstance(value, bool) or not isinstance(value, typ):
        want = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise ApiError(400, f"'{name}' must be a {want}")
    return value


def decode_b64_audio(data: dict, tmpdir: Path):
    """Write the base64 `ref_audio` to a temp file; returns its path or None."""
    raw = _field(data, "ref_audio", str)
    if not raw:
        return None
    try:
        blob = base64.b64decode(raw.split(",", 1)[-1] if raw.startswith("data:") else raw, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "'ref_audio' must be base64-encoded audio (WAV, FLAC ...)") from None
    path = tmpdir / "ref_audio"
    path.write_bytes(blob)
    return str(path)


# -- voices ----------------------------------------------------------------------------------
async def list_voices(request):
    """GET /v1/voices -> {"voices": [...], "languages": [...], "model_type": ...}"""
    e = request.app[CTX].host.engine
    return web.json_response({"voices": [{"name": v} for v in e.voices], "languages": e.languages,
                              "model_type": e.model_type})


async def add_voice(request):
    """POST /v1/voices {"name", "ref_audio" (base64), "ref_text"?} -> 201 (Base checkpoints only)."""
    ctx = request.app[CTX]
    data = await read_json(request)
    name = _field(data, "name", str, required=True)
    if not VOICE_NAME.match(name):
        raise ApiError(400, "'name' must be 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit")
    vdir = Path(ctx.host.engine.voices_dir or ctx.paths.home / "voices")
    with tempfile.TemporaryDirectory(prefix="tts-voice-") as tmp:
        ref = decode_b64_audio(data, Path(tmp))
        if not ref:
            raise ApiError(400, "'ref_audio' (base64 audio) is required")
        voice = await asyncio.get_running_loop().run_in_executor(
            None, ctx.host.engine.make_voice, ref, _field(data, "ref_text", str))
    vdir.mkdir(parents=True, exist_ok=True)
    voice.save(str(vdir / f"{name}.voice"))
    log.info("voice %s added", name)
    return web.json_response({"name": name}, status=201)


async def delete_voice(request):
    """DELETE /v1/voices/{name}"""
    ctx = request.app[CTX]
    name = request.match_info["name"]
    path = Path(ctx.host.engine.voices_dir or ctx.paths.home / "voices") / f"{name}.voice"
    if not VOICE_NAME.match(name) or not path.is_file():
        raise ApiError(404, f"no saved voice {name!r}", "not_found")
    path.unlink()
    return web.json_response({"name": name, "deleted": True})


async def health(request):
    """GET /health"""
    ctx = request.app[CTX]
    e = ctx.host.engine
    return web.json_response({"status": ctx.state, "model": str(ctx.cfg.model.path), "model_type": e.model_type,
                              "sample_rate": e.sample_rate, "engine": ctx.host.stats(), "pid": ctx.pid})


async def metrics(request):
    """GET /metrics (Prometheus text format)."""
    ctx = request.app[CTX]
    counts, jobs = await asyncio.get_running_loop().run_in_executor(None, ctx.queue_counts)
    text = ctx.metrics.render(ctx.host.stats(), counts, jobs)
    return web.Response(text=text, content_type="text/plain", charset="utf-8",
                        headers={"X-Prometheus-Format": "0.0.4"})


def make_app(ctx) -> web.Application:
    from appliance.http_jobs import add_routes as add_job_routes
    from appliance.http_speech import speech

    app = web.Application(middlewares=[json_errors], client_max_size=ctx.cfg.http.max_body_bytes)
    app[CTX] = ctx
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/v1/voices", list_voices)
    app.router.add_post("/v1/voices", add_voice)
    app.router.add_delete("/v1/voices/{name}", delete_voice)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    add_job_routes(app)
    return app
