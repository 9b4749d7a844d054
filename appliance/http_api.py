"""Local HTTP API (aiohttp), served on a Unix socket and optionally on loopback TCP.

    POST   /v1/audio/speech      OpenAI-compatible speech: a whole file, streamed or SSE (appliance.http_speech)
    GET    /v1/models            OpenAI model list; GET /v1/audio/voices: OpenAI-style voice list (POST: 400
                                 naming POST /v1/voices, for vllm-omni's multipart upload)
    GET    /v1/audio/speech/live WebSocket: speech from text that is still arriving (appliance.http_live)
    GET    /v1/audio/speech/ws   the same, in the Nari server's protocol nari.speech.v1 (appliance.ws_nari)
    GET    /v1/audio/speech/stream  WebSocket: vllm-omni's text in pieces, audio per sentence (appliance.ws_vllm)
    GET    /v1/voices            voices and languages of the loaded checkpoint; "test_model": why it makes no
                                 speech (a test checkpoint of random weights), else ""
    POST   /v1/voices            add a cloned voice (Base checkpoints): {"name", "ref_audio" (base64), "ref_text",
                                 "overwrite"}: 409 when the name is taken, unless overwrite
    DELETE /v1/voices/{name}     remove a saved cloned voice (also DELETE /v1/audio/voices/{name}, vllm-omni's route)
    GET    /v1/voices/{name}/sample, PATCH /v1/voices/{name}: a voice's sample, a rename (appliance.http_voices)
    GET    /v1/formats           what the server writes (books, speech) and the documents it reads
    GET    /health               {"status": "ok" | "degraded" | "starting" | "stopping", "queue": {"ok": ...},
                                  "disk": {"ok": ...}, "parts": {...}, "down": {...}, ...}: 503 while a part is
                                  down; "degraded" with 200 while jobs wait for room on the disk
    GET    /metrics              Prometheus text format (OpenMetrics when asked for)
    /v1/jobs...                  batch jobs (appliance.http_jobs), their output files (appliance.http_outputs),
                                 a book's cover and listening position (appliance.http_library)
    GET    /, /web/...           the page for browsers (appliance.http_web); it uses the routes above

Every error is JSON: `{"error": {"message": ..., "type": ..., "code": <http status>}}`; JSON bodies
must say `Content-Type: application/json` (415 otherwise). With http.api_key set, requests over TCP need
`Authorization: Bearer KEY` (401 otherwise; the page's static files excepted); a browser's cross-site
request over TCP is refused (403), and on loopback without a key so is any request whose Host is not a loopback
name (DNS rebinding). Shared pieces: appliance.http_common.
"""
from __future__ import annotations

import asyncio
import logging
import tempfile
from pathlib import Path

from aiohttp import web

from appliance.http_common import CTX, ApiError, field, json_errors, read_json, require_key, same_origin
from appliance.http_refaudio import reference_audio
from appliance.http_voices import VOICE_NAME, check_name, prune_samples

log = logging.getLogger(__name__)


# -- voices ----------------------------------------------------------------------------------
async def list_voices(request):
    """GET /v1/voices -> {"voices": [...], "languages": [...], "model_type": ..., "test_model": ...}; test_model:
    why the checkpoint makes no speech (a test checkpoint of random weights), else ""."""
    e = request.app[CTX].host.engine
    return web.json_response({"voices": [{"name": v} for v in e.voices], "languages": e.languages,
                              "model_type": e.model_type, "test_model": getattr(e, "test_model", "")})


async def add_voice(request):
    """POST /v1/voices {"name", "ref_audio" (base64), "ref_text"?, "overwrite"?} -> 201 (Base checkpoints only);
    a name already saved: 409, unless "overwrite": true (then 200)."""
    ctx = request.app[CTX]
    data = await read_json(request)
    name = check_name(field(data, "name", str, required=True))
    if ctx.host.engine.model_type != "base":
        raise ApiError(400, f"reference audio needs a Base checkpoint; this one is {ctx.host.engine.model_type}")
    path = ctx.host.engine.voice_file(name)
    replaced = path.is_file()
    if replaced and not field(data, "overwrite", bool):
        raise ApiError(409, f"a voice {name!r} is already saved; send \"overwrite\": true to replace it, or "
                            f"DELETE /v1/voices/{name} first", "conflict")
    with tempfile.TemporaryDirectory(prefix="tts-voice-") as tmp:
        ref = reference_audio(ctx, data.get("ref_audio"), Path(tmp))
        if not ref:
            raise ApiError(400, "'ref_audio' is required: base64 audio, a data URL or a file in the voices folder")
        voice = await asyncio.get_running_loop().run_in_executor(
            None, ctx.host.pool.clone_voice, ref, field(data, "ref_text", str))
    path.parent.mkdir(parents=True, exist_ok=True)
    voice.save(str(path))
    log.info("voice %s %s", name, "replaced" if replaced else "added")
    if replaced:
        await asyncio.get_running_loop().run_in_executor(None, prune_samples, ctx)  # its old sample
    return web.json_response({"name": name, "replaced": replaced}, status=200 if replaced else 201)


async def delete_voice(request):
    """DELETE /v1/voices/{name}, and DELETE /v1/audio/voices/{name} as vllm-omni's clients send it (their delete
    of an uploaded voice: the same saved voice here) -> {"name", "deleted": true, "success": true, "message"}."""
    ctx = request.app[CTX]
    name = request.match_info["name"]
    path = ctx.host.engine.voice_file(name)
    if not VOICE_NAME.match(name) or not path.is_file():
        raise ApiError(404, f"no saved voice {name!r}", "not_found")
    path.unlink()
    await asyncio.get_running_loop().run_in_executor(None, prune_samples, ctx)
    return web.json_response({"name": name, "deleted": True, "success": True, "message": f"voice {name!r} deleted"})


def disk_of(ctx) -> dict:
    """The spool folder's disk as /health and /metrics show it (jobs.disk.disk_state, through the daemon)."""
    return ctx.disk_state() if hasattr(ctx, "disk_state") else {"ok": True}


async def health(request):
    """GET /health: 200 while the daemon serves speech, also when its job queue cannot be read
    (then `"queue": {"ok": false, "error": ...}`; streams go on, jobs wait for the queue). `parts`: the
    queue workers (with the books they write), the inbox watcher and each engine's loop; while one is
    down (dead, waiting to be restarted) the answer is 503, status "degraded", and `down` says which
    part and why. `disk`: the spool folder's free space (jobs.disk.disk_state); while jobs wait for room
    there (or less than jobs.min_free_mb is free) the status is "degraded", with 200: speech goes on."""
    ctx = request.app[CTX]
    e = ctx.host.engine
    q = await asyncio.get_running_loop().run_in_executor(None, ctx.queue_state)
    parts = ctx.parts()
    down = {name: p.get("error") for name, p in parts.items() if not p["ok"]}
    disk = disk_of(ctx)
    degraded = (down or not disk["ok"]) and ctx.state == "ok"
    body = {"status": "degraded" if degraded else ctx.state, "model": str(ctx.cfg.model.path),
            "model_type": e.model_type, "test_model": getattr(e, "test_model", ""), "sample_rate": e.sample_rate,
            "runtime": getattr(ctx.host.runner, "settings", None), "engine": ctx.host.stats(), "pid": ctx.pid,
            "queue": {"ok": True} if q.ok else {"ok": False, "error": q.error}, "disk": disk, "parts": parts,
            "limits": {"max_body_bytes": ctx.cfg.http.max_body_bytes, "max_text_chars": ctx.cfg.http.max_text_chars,
                       "max_file_bytes": ctx.cfg.jobs.max_file_mb << 20, "ingest_wall_s": ctx.settings.ingest.wall_s}}
    if down:
        body["down"] = down
    return web.json_response(body, status=503 if down else 200)


async def formats(request):
    """GET /v1/formats: what this server reads and writes, for clients that offer a choice: `books` (a job's
    `format`: jobs.settings.FORMATS), `speech` (response_format of POST /v1/audio/speech) and `documents`
    (the file name endings a submit reads; other names are read as text, or refused by their content)."""
    from jobs.ingest import READ_SUFFIXES
    from jobs.settings import FORMATS as BOOK_FORMATS

    from appliance.http_speech import FORMATS as SPEECH_FORMATS

    return web.json_response({"books": list(BOOK_FORMATS), "speech": list(SPEECH_FORMATS),
                              "documents": sorted(READ_SUFFIXES)})


async def metrics(request):
    """GET /metrics (Prometheus text format 0.0.4, or OpenMetrics when the scraper's Accept asks for it:
    appliance.metrics); `tts_queue_up 0` while the job queue cannot be read; the disk as /health shows it."""
    ctx = request.app[CTX]
    q = await asyncio.get_running_loop().run_in_executor(None, ctx.queue_state)
    body, content_type = ctx.metrics.render(ctx.host.stats(), q.segments, q.jobs, queue_up=q.ok,
                                            accept=request.headers.get("Accept", ""), disk=disk_of(ctx))
    return web.Response(body=body, headers={"Content-Type": content_type})


def make_app(ctx) -> web.Application:
    from appliance.http_jobs import add_routes as add_job_routes
    from appliance.http_library import add_routes as add_library_routes
    from appliance.http_live import add_routes as add_live_routes
    from appliance.http_outputs import add_routes as add_output_routes
    from appliance.http_speech import add_routes as add_speech_routes
    from appliance.http_voices import add_routes as add_voice_routes
    from appliance.http_web import add_routes as add_page_routes
    from appliance.ws_nari import add_routes as add_nari_routes
    from appliance.ws_vllm import add_routes as add_stream_routes

    app = web.Application(middlewares=[json_errors, same_origin, require_key],
                          client_max_size=ctx.cfg.http.max_body_bytes)
    app[CTX] = ctx
    add_speech_routes(app)
    app.router.add_get("/v1/voices", list_voices)
    app.router.add_post("/v1/voices", add_voice)
    app.router.add_delete("/v1/voices/{name}", delete_voice)
    app.router.add_delete("/v1/audio/voices/{name}", delete_voice)
    add_voice_routes(app)
    app.router.add_get("/v1/formats", formats)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    add_job_routes(app)
    add_output_routes(app)
    add_library_routes(app)
    add_live_routes(app)
    add_nari_routes(app)
    add_stream_routes(app)
    add_page_routes(app)
    return app
