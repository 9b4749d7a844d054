"""What a listener's library needs beyond a job's summary and files (the page's player, any other client):

    GET /v1/jobs/{id}/position   where the listener stopped in the book: {"id", "position_s", "chapter",
                                 "updated_at"} (position_s 0, chapter and updated_at null when none was saved)
    PUT /v1/jobs/{id}/position   keep it: {"position_s": seconds into the book (>= 0), "chapter": 0-based
                                 index or null} -> the same object as GET
    GET /v1/jobs/{id}/cover      the book's cover image, taken from the document at submit (an EPUB's cover;
                                 a job summary's "cover" says whether there is one); 404 when none

The place is kept in the queue (jobs.queue.positions), one per book: a browser opening the book later, or
another browser or device, goes on from it. A daemon without http.api_key over loopback or its Unix socket
has one listener; with a key, everyone holding the key shares each book's place.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from aiohttp import web

from appliance.http_common import CTX, ApiError, field, read_json
from appliance.http_jobs import _q

MAX_POSITION_S = 1e7  # about 115 days: no book is longer
IMAGES = ("image/jpeg", "image/png", "image/gif", "image/webp")  # a cover of another type is sent as bytes only


def _answer(job_id: str, saved) -> dict:
    saved = saved or {"position_s": 0.0, "chapter": None, "updated_at": None}
    return {"id": job_id, **saved}


async def get_position(request):
    """GET /v1/jobs/{id}/position"""
    job_id = request.match_info["id"]

    def read(q):
        q.job(job_id)  # 404 naming the job when there is none
        return q.position(job_id)

    return web.json_response(_answer(job_id, await _q(request.app[CTX], read)))


async def put_position(request):
    """PUT /v1/jobs/{id}/position {"position_s": float, "chapter": int | null}"""
    job_id = request.match_info["id"]
    data = await read_json(request)
    unknown = sorted(set(data) - {"position_s", "chapter"})
    if unknown:
        raise ApiError(400, f"unknown key(s) {', '.join(map(repr, unknown))}; a position is "
                            '{"position_s": <seconds into the book>, "chapter": <0-based index or null>}')
    position = field(data, "position_s", (int, float), required=True)
    if not math.isfinite(position) or not 0 <= position <= MAX_POSITION_S:
        raise ApiError(400, f"'position_s' must be seconds into the book, from 0 to {MAX_POSITION_S:.0f}")
    chapter = field(data, "chapter", int)
    if chapter is not None and chapter < 0:
        raise ApiError(400, "'chapter' is a 0-based chapter index (or null)")

    def save(q):
        q.job(job_id)
        return q.set_position(job_id, float(position), chapter)

    return web.json_response(_answer(job_id, await _q(request.app[CTX], save)))


async def get_cover(request):
    """GET /v1/jobs/{id}/cover"""
    ctx, job_id = request.app[CTX], request.match_info["id"]
    job = await _q(ctx, lambda q: q.job(job_id))
    meta = json.loads(job.get("meta") or "{}")
    covers = (ctx.paths.home / "covers").resolve()
    path = Path(meta["cover_path"]).resolve() if meta.get("cover_path") else None
    if path is None or covers not in path.parents or not path.is_file():
        raise ApiError(404, f"job {job_id} has no cover (a cover comes from the document: an EPUB's cover image)",
                       "not_found")
    mime = meta.get("cover_mime") or ("image/png" if path.suffix == ".png" else "image/jpeg")
    # an image, never a document of this origin (an SVG cover could carry scripts): shown, not run
    return web.FileResponse(path, headers={"Content-Type": mime if mime in IMAGES else "application/octet-stream",
                                           "Content-Security-Policy": "default-src 'none'; sandbox",
                                           "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/jobs/{id}/position", get_position)
    app.router.add_put("/v1/jobs/{id}/position", put_position)
    app.router.add_get("/v1/jobs/{id}/cover", get_cover)
