"""Voices beyond listing, adding and deleting them (appliance.http_api): a sample of each and renaming.

    GET   /v1/voices/{name}/sample   a short FLAC of the voice saying SAMPLE_TEXT: rendered at the first
                                     request and kept in HOME/voice-samples; a voice that changes (a clone
                                     saved again under its name, another checkpoint) gets a new one. ETag:
                                     a client's copy is revalidated, not downloaded again
    PATCH /v1/voices/{name}          {"name": NEW, "overwrite"?}: rename a saved cloned voice (409 when NEW is
                                     taken, unless "overwrite": true)

A sample is keyed by what makes its sound: the checkpoint (folder and the files' sizes and times), the
voice (a speaker's name, or a cloned voice's content, so a rename keeps its sample), the text and its
settings. Samples no voice has any more are removed whenever a sample is made or a voice removed.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np
from aiohttp import web

from audio.encode import encode_bytes
from jobs.settings import file_digest

from appliance.http_common import CTX, ApiError, field, read_json
from appliance.streams import ShuttingDown, serve_stream

log = logging.getLogger(__name__)
VOICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SAMPLE_TEXT = "Hello! This is how I sound when I read a book to you."
SAMPLE_LANGUAGE = "english"  # the language of SAMPLE_TEXT (auto where the checkpoint lacks it)
SAMPLE_SEED = 7
SAMPLE_MAX_FRAMES = 125  # 10 s at 12.5 frames a second: SAMPLE_TEXT takes about 4
SAMPLES = "voice-samples"  # the folder in the spool folder (HOME)
_locks: dict[str, asyncio.Lock] = {}


def check_name(name: str, what: str = "'name'") -> str:
    if not VOICE_NAME.match(name or ""):
        raise ApiError(400, f"{what} must be 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit")
    return name


def _checkpoint_stamp(root: Path) -> list:
    out = [str(root.resolve())]
    for name in ("config.json", "model.safetensors"):
        try:
            st = (root / name).stat()
            out.append([name, st.st_size, st.st_mtime_ns])
        except OSError:
            out.append([name, None])
    return out


def sample_key(ctx, name: str) -> Optional[str]:
    """The cache key of `name`'s sample (None: the checkpoint has no such voice)."""
    e = ctx.host.engine
    if name not in e.voices:
        return None
    voice = file_digest(str(e.voice_file(name))) if e.model_type == "base" else name
    what = {"checkpoint": _checkpoint_stamp(Path(str(ctx.cfg.model.path))), "voice": voice, "text": SAMPLE_TEXT,
            "language": SAMPLE_LANGUAGE, "seed": SAMPLE_SEED, "max_frames": SAMPLE_MAX_FRAMES}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def prune_samples(ctx) -> None:
    """Remove the samples that no voice of the checkpoint has any more (deleted, changed, renamed away)."""
    folder = ctx.paths.home / SAMPLES
    if not folder.is_dir():
        return
    keep = {sample_key(ctx, v) for v in ctx.host.engine.voices}
    for f in folder.glob("*.flac"):
        if f.stem not in keep:
            f.unlink(missing_ok=True)


async def _render(ctx, name: str) -> tuple[np.ndarray, int]:
    e = ctx.host.engine
    language = SAMPLE_LANGUAGE if SAMPLE_LANGUAGE in e.languages else "auto"
    req = ctx.host.request(SAMPLE_TEXT, voice=name, language=language, seed=SAMPLE_SEED,
                           max_frames=SAMPLE_MAX_FRAMES)
    try:
        async with serve_stream(ctx, "sample", req, SAMPLE_MAX_FRAMES) as stream:
            chunks = [c async for c in stream.chunks()]
            stream.outcome = "ok"
            rate = stream.sample_rate
    except ShuttingDown as exc:
        raise ApiError(503, str(exc), "busy", {"Retry-After": str(ctx.cfg.runtime.retry_after_s)}) from None
    return (np.concatenate(chunks) if chunks else np.zeros(0, np.float32)), rate


async def voice_sample(request):
    """GET /v1/voices/{name}/sample (audio/flac)"""
    ctx = request.app[CTX]
    name = request.match_info["name"]
    loop = asyncio.get_running_loop()
    key = await loop.run_in_executor(None, sample_key, ctx, name) if VOICE_NAME.match(name) else None
    if key is None:
        raise ApiError(404, f"no voice {name!r}; GET /v1/audio/voices lists them", "not_found")
    path = ctx.paths.home / SAMPLES / f"{key}.flac"
    async with _locks.setdefault(key, asyncio.Lock()):  # one rendering per sample, however many ask
        if not path.is_file():
            audio, rate = await _render(ctx, name)
            body = await loop.run_in_executor(None, encode_bytes, audio, rate, "flac")
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".sample-", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            os.replace(tmp, path)
            log.info("voice sample of %s made (%.1f s of audio)", name, len(audio) / rate)
            await loop.run_in_executor(None, prune_samples, ctx)
    _locks.pop(key, None)
    return web.FileResponse(path, headers={"Content-Type": "audio/flac", "Cache-Control": "no-cache"})


async def rename_voice(request):
    """PATCH /v1/voices/{name} {"name": NEW, "overwrite"?}"""
    ctx = request.app[CTX]
    e = ctx.host.engine
    old = request.match_info["name"]
    data = await read_json(request)
    new = check_name(field(data, "name", str, required=True))
    if e.model_type != "base":
        raise ApiError(400, f"only saved cloned voices can be renamed; this checkpoint's voices are its own "
                            f"({e.model_type})")
    src = e.voice_file(old) if VOICE_NAME.match(old) else None
    if src is None or not src.is_file():
        raise ApiError(404, f"no saved voice {old!r}", "not_found")
    dst = e.voice_file(new)
    if new != old and dst.is_file() and not field(data, "overwrite", bool):
        raise ApiError(409, f"a voice {new!r} is already saved; send \"overwrite\": true to replace it", "conflict")
    os.replace(src, dst)
    log.info("voice %s renamed to %s", old, new)
    await asyncio.get_running_loop().run_in_executor(None, prune_samples, ctx)
    return web.json_response({"name": new, "renamed_from": old})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/voices/{name}/sample", voice_sample)
    app.router.add_patch("/v1/voices/{name}", rename_voice)
