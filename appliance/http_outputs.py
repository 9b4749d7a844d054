"""A job's output files over the local HTTP API: the book, its chapters, subtitles and manifest.

    GET /v1/jobs/{id}/files              {"id", "state", "files": [{"name", "bytes", "type", "modified"}]}: every
                                         file of the job's output folder (names relative to it, `/` between
                                         folders), none while it has none yet
    GET /v1/jobs/{id}/files/{name}       one of them (Range requests for seeking; `?download=1` asks the
                                         browser to save it)

Only files inside the job's output folder are served: a name that leaves it (`..`, an absolute path, a link
pointing elsewhere), a hidden or temporary file, or anything but a regular file is 404.
"""
from __future__ import annotations

import asyncio
import mimetypes
from pathlib import Path
from typing import Optional
from urllib.parse import quote

from aiohttp import web

from appliance.http_common import CTX, ApiError
from appliance.http_jobs import job_row

# what the book writer makes, where mimetypes has no (or another) answer
TYPES = {".vtt": "text/vtt", ".srt": "application/x-subrip", ".m4b": "audio/mp4", ".opus": "audio/ogg",
         ".ogg": "audio/ogg", ".flac": "audio/flac", ".mp3": "audio/mpeg", ".wav": "audio/wav",
         ".json": "application/json", ".epub": "application/epub+zip"}
PARTIAL = (".tmp", ".part", "~")  # files being written


def content_type(name: str) -> str:
    suffix = Path(name).suffix.lower()
    return TYPES.get(suffix) or mimetypes.guess_type(name)[0] or "application/octet-stream"


def _shown(rel: Path) -> bool:
    return not any(p.startswith(".") for p in rel.parts) and not rel.name.endswith(PARTIAL)


async def _output_dir(ctx, job_id: str) -> tuple[dict, Optional[Path]]:
    job = await job_row(ctx, job_id)
    out = job.get("output_dir")
    return job, Path(out).resolve() if out else None


def list_files(folder: Optional[Path]) -> list[dict]:
    """The regular files under `folder` (hidden and partial ones left out), sorted by name."""
    if folder is None or not folder.is_dir():
        return []
    files = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_file() and not path.is_symlink() and _shown(rel):
            st = path.stat()
            files.append({"name": rel.as_posix(), "bytes": st.st_size, "type": content_type(path.name),
                          "modified": int(st.st_mtime)})
    return files


def inside(folder: Path, name: str) -> Optional[Path]:
    """The regular file `name` (relative, `/` between folders) inside `folder`, or None when it is not
    there, is hidden or partial, or resolves anywhere else (`..`, an absolute name, a link out)."""
    rel = Path(name)
    if not name or rel.is_absolute() or ".." in rel.parts or "\\" in name or "\x00" in name or not _shown(rel):
        return None
    path = (folder / rel).resolve()
    if folder not in path.parents or not path.is_file():
        return None
    return path


async def job_files(request):
    """GET /v1/jobs/{id}/files"""
    ctx = request.app[CTX]
    job, folder = await _output_dir(ctx, request.match_info["id"])
    files = await asyncio.get_running_loop().run_in_executor(None, list_files, folder)
    return web.json_response({"id": job["id"], "state": job["state"], "files": files})


async def job_file(request):
    """GET /v1/jobs/{id}/files/{name}"""
    ctx = request.app[CTX]
    job_id, name = request.match_info["id"], request.match_info["name"]
    _, folder = await _output_dir(ctx, job_id)
    path = inside(folder, name) if folder else None
    if path is None:
        raise ApiError(404, f"job {job_id} has no output file {name!r}; GET /v1/jobs/{job_id}/files lists them",
                       "not_found")
    headers = {"Content-Type": content_type(path.name), "X-Content-Type-Options": "nosniff",
               "Cache-Control": "no-cache"}
    if request.query.get("download") not in (None, "", "0", "false"):
        headers["Content-Disposition"] = f"attachment; filename*=UTF-8''{quote(path.name)}"
    return web.FileResponse(path, headers=headers)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/jobs/{id}/files", job_files)
    app.router.add_get("/v1/jobs/{id}/files/{name:.+}", job_file)
