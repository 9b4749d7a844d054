"""Batch job routes of the local HTTP API.

    POST   /v1/jobs                 submit; the job's settings are one JSON object `spec` with the
                                    fields of jobs.settings.JobSpec (unknown keys, wrong types: 400):
                                    JSON {"path": "<server-side file inside jobs.allowed_dirs>",
                                    "spec": {...}}, or multipart/form-data with a `file` part and a
                                    `spec` part holding the JSON. -> 201 job summary (422: the file
                                    could not become a job). Idempotent: the same content with the
                                    same options answers 200 with the earlier job ("existing": true;
                                    202 {"id", "state": "ingesting"} while that one is still read).
                                    What the spec does not name comes from jobs.voice, jobs.language
                                    and jobs.instruct. A spec's ref_audio is a server-side path too
                                    (inside jobs.allowed_dirs).
    POST   /v1/jobs/preview         the same body as a submit: the document's plan, nothing queued
                                    (jobs.plan: chapters, segments, characters, estimated audio
                                    length and synthesis time); 422 when it cannot be read
    GET    /v1/jobs[?state=...]     list (the same JSON as `tts-appliance list --json`)
    GET    /v1/jobs/{id}            one job (as `tts-appliance status --json`)
    POST   /v1/jobs/{id}/cancel     cancel a queued or running job: {"id", "state": "cancelled"} (409: it ended)
    DELETE /v1/jobs/{id}            delete the job and its files (jobs.deletion; a queued or running job is
                                    cancelled first): {"id", "deleted": true, "freed_bytes": N}; 404: no such job
    POST   /v1/jobs/prune           apply the retention now (jobs.retention): {"jobs": [ids whose working
                                    files went], "freed_bytes", "files"}
    POST   /v1/jobs/{id}/retry      requeue failed/cancelled segments
    POST   /v1/jobs/{id}/segments/{index}/redo   re-render one segment (body {"seed": N}, optional)
    GET    /v1/jobs/{id}/events     progress as Server-Sent Events: `event: progress` with the job
                                    summary whenever it changes, `event: log` per log line, and a final
                                    `event: end` when the job is finished; a comment line after
                                    KEEPALIVE_S without news (a client's read timeout: the daemon is gone)
"""
from __future__ import annotations

import asyncio
import json
import re
import shutil
import uuid
from pathlib import Path

from aiohttp import web

from jobs.queue import TERMINAL, Queue, QueueError
from jobs.report import job_summary
from jobs.settings import JobSpec, with_defaults

from appliance.http_common import CTX, ApiError, field, parse_object, read_json

SUBMIT_KEYS = ("path", "spec")  # a JSON submit; multipart: the parts "file" and "spec"
KEEPALIVE_S = 15.0  # an event stream with nothing new says so this often


async def _q(ctx, fn, *args):
    """Run `fn(queue, *args)` on a fresh queue connection in a worker thread."""

    def call():
        q = Queue(ctx.paths.db)
        try:
            return fn(q, *args)
        finally:
            q.close()

    try:
        return await asyncio.get_running_loop().run_in_executor(None, call)
    except QueueError as exc:
        status = 404 if "no job" in str(exc) else 409
        raise ApiError(status, str(exc), "not_found" if status == 404 else "conflict") from None


async def job_row(ctx, job_id: str) -> dict:
    """The job's queue row; 404 naming it when there is none."""
    return await _q(ctx, lambda q: q.job(job_id))


def _spec(ctx, raw) -> JobSpec:
    """The submitted spec, strictly parsed; what it does not name comes from the daemon's job
    defaults (jobs.voice, jobs.language, jobs.instruct), then JobSpec's."""
    try:
        JobSpec.parse({} if raw is None else raw)  # the client's own keys and types
        spec = JobSpec.parse(with_defaults(raw, ctx.job_defaults))
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    if spec.ref_audio:
        spec.ref_audio = str(_allowed(ctx, spec.ref_audio))
    return spec


def _allowed(ctx, raw: str) -> Path:
    path = Path(raw).expanduser().resolve()
    roots = [Path(d).expanduser().resolve() for d in ctx.cfg.jobs.allowed_dirs]
    if not any(path == r or r in path.parents for r in roots):
        where = ", ".join(map(str, roots)) or "(none configured: set jobs.allowed_dirs, or upload the file)"
        raise ApiError(403, f"{raw}: not inside an allowed folder; allowed: {where}", "forbidden")
    if not path.is_file():
        raise ApiError(400, f"{raw}: no such file")
    return path


async def _upload(ctx, request, folder: Path) -> tuple[Path, JobSpec]:
    """Read a multipart submit into `folder`: the `file` part and the optional `spec` part."""
    reader = await request.multipart()
    path, spec = None, None
    timeout = ctx.cfg.http.read_timeout_s
    while True:
        part = await asyncio.wait_for(reader.next(), timeout)
        if part is None:
            break
        if part.name == "file" and part.filename:
            name = re.sub(r"[^A-Za-z0-9._ -]", "_", Path(part.filename).name).strip(" .") or "upload.txt"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / name
            with open(path, "wb") as f:
                while chunk := await asyncio.wait_for(part.read_chunk(1 << 16), timeout):
                    f.write(chunk)
        elif part.name == "spec":
            spec = parse_object(await asyncio.wait_for(part.text(), timeout), "the 'spec' part")
        else:
            raise ApiError(400, f"unknown part {part.name!r}; a multipart submit has a 'file' part (with a "
                                "filename) and an optional 'spec' part (the job's settings as JSON)")
    if path is None:
        raise ApiError(400, "multipart submit needs a 'file' part with a filename")
    return path, _spec(ctx, spec)


async def _read_submit(ctx, request, folder: Path) -> tuple[Path, JobSpec]:
    """The document and spec of a submit (or preview): an upload goes into `folder` (removed on failure)."""
    if request.content_type.startswith("multipart/"):
        try:
            return await _upload(ctx, request, folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)  # nothing was queued: drop the upload
            raise
    data = await read_json(request)
    unknown = sorted(set(data) - set(SUBMIT_KEYS))
    if unknown:
        raise ApiError(400, f"unknown key(s) {', '.join(map(repr, unknown))}; a JSON submit is "
                            '{"path": "<server-side file>", "spec": {<job settings>}}')
    raw = field(data, "path", str)
    if not raw:
        raise ApiError(400, "give 'path' (a server-side file) in JSON, or upload a 'file' as multipart/form-data")
    return _allowed(ctx, raw), _spec(ctx, field(data, "spec", dict))


async def submit(request):
    """POST /v1/jobs"""
    ctx = request.app[CTX]
    path, spec = await _read_submit(ctx, request, ctx.paths.home / "uploads" / uuid.uuid4().hex[:12])
    uploaded = path.parent if path.parent.parent == ctx.paths.home / "uploads" else None

    def do(q):
        from jobs.submit import SubmitError, submit_file_once

        try:
            job_id, error, new = submit_file_once(q, ctx.paths, path, spec, ctx.host.engine.voices,
                                                  limits=ctx.settings.ingest)
        except SubmitError as exc:
            raise ApiError(400, str(exc)) from None
        try:
            s = job_summary(q, job_id)
        except QueueError:  # an earlier submit of the same content and options is still reading it
            s = {"id": job_id, "state": "ingesting"}
        return {**s, "submit_error": error, "existing": not new}

    s = await _q(ctx, do)
    if s["existing"] and uploaded:
        shutil.rmtree(uploaded, ignore_errors=True)  # the job reads the earlier upload of the same content
    status = 422 if s["submit_error"] else 200 if s["existing"] else 201
    return web.json_response(s, status=202 if s["state"] == "ingesting" else status)


async def preview(request):
    """POST /v1/jobs/preview: what a submit of the same body would queue, queueing nothing (`tts-appliance
    preview`): the document read in the ingest child, its chapters (numbered as `spec.chapters` takes them,
    each marked `selected`), segments, characters, estimated audio length and synthesis time."""
    ctx = request.app[CTX]
    folder = ctx.paths.home / "uploads" / f"preview-{uuid.uuid4().hex[:12]}"
    try:
        path, spec = await _read_submit(ctx, request, folder)

        def plan():
            from jobs.errors import JobError
            from jobs.ingest.isolate import load_document_isolated
            from jobs.plan import plan_document
            from jobs.submit import SubmitError, precheck_file

            try:
                precheck_file(path)
                doc = load_document_isolated(path, limits=ctx.settings.ingest)
                return plan_document(doc, spec, path.stem, ctx.cfg.jobs.synth_rate, ctx.paths.db,
                                     ctx.host.engine.voices)
            except (SubmitError, JobError, ValueError) as exc:
                raise ApiError(422, str(exc), "unreadable_document") from None

        out = await asyncio.get_running_loop().run_in_executor(None, plan)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # a preview keeps nothing
    return web.json_response({"file": path.name, **out})


async def list_jobs(request):
    """GET /v1/jobs"""
    states = request.query.getall("state", []) or None
    rows = await _q(request.app[CTX], lambda q: [job_summary(q, j["id"], failed_segments=False) for j in q.jobs(states)])
    return web.json_response(rows)


async def get_job(request):
    """GET /v1/jobs/{id}"""
    return web.json_response(await _q(request.app[CTX], job_summary, request.match_info["id"]))


async def job_log(request):
    """GET /v1/jobs/{id}/log: the job's log entries, oldest first (what `tts-appliance logs` shows)"""
    job_id = request.match_info["id"]

    def read(q):
        q.job(job_id)  # 404 naming the job when there is none
        return q.events(job_id)

    return web.json_response(await _q(request.app[CTX], read))


def _ended(ctx, job_id: str) -> None:
    """Tell the daemon's workers that `job_id` ended: its segments stop in the engine now (jobs.inflight)."""
    told = getattr(ctx, "job_ended", None)
    if told is not None:
        told(job_id)


async def cancel_job(request):
    """POST /v1/jobs/{id}/cancel"""
    ctx, job_id = request.app[CTX], request.match_info["id"]
    await _q(ctx, lambda q: q.cancel(job_id))
    _ended(ctx, job_id)
    return web.json_response({"id": job_id, "state": "cancelled"})


async def delete_job(request):
    """DELETE /v1/jobs/{id}: the job and every file of it (jobs.deletion) -> {"id", "deleted": true,
    "freed_bytes"}; a queued or running job is cancelled first."""
    from jobs.deletion import delete_job as delete

    ctx, job_id = request.app[CTX], request.match_info["id"]
    await job_row(ctx, job_id)  # 404 naming it when there is none
    _ended(ctx, job_id)
    return web.json_response(await _q(ctx, lambda q: delete(q, ctx.paths, job_id)))


async def prune(request):
    """POST /v1/jobs/prune: jobs.retention.prune now, with jobs.keep_work_days."""
    from jobs.retention import prune as apply

    ctx = request.app[CTX]
    return web.json_response(await _q(ctx, lambda q: apply(q, ctx.paths, ctx.cfg.jobs.keep_work_days)))


async def retry_job(request):
    """POST /v1/jobs/{id}/retry"""
    ctx, job_id = request.app[CTX], request.match_info["id"]
    n = await _q(ctx, lambda q: q.retry(job_id))
    return web.json_response({**await _q(ctx, job_summary, job_id), "requeued": n})


async def redo_segment(request):
    """POST /v1/jobs/{id}/segments/{index}/redo  {"seed": N} (optional; empty body: a random seed)"""
    ctx, job_id = request.app[CTX], request.match_info["id"]
    if not re.fullmatch(r"\d+", request.match_info["index"]):
        raise ApiError(400, "the segment index is a number, as in the job's manifest.json")
    index = int(request.match_info["index"])
    seed = field(await read_json(request), "seed", int) if request.can_read_body else None
    seed = await _q(ctx, lambda q: q.redo(job_id, index, seed))
    return web.json_response({**await _q(ctx, job_summary, job_id), "segment": index, "seed": seed})


async def job_events(request):
    """GET /v1/jobs/{id}/events (text/event-stream)."""
    ctx, job_id = request.app[CTX], request.match_info["id"]
    await _q(ctx, lambda q: q.job(job_id))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    loop = asyncio.get_running_loop()
    last, seen, said = None, 0, loop.time()

    def poll(q):
        return job_summary(q, job_id), q.events(job_id)

    while True:
        s, events = await _q(ctx, poll)
        news = [f"event: log\ndata: {json.dumps(e)}\n\n" for e in events[seen:]]
        seen = len(events)
        if s != last:
            news.append(f"event: progress\ndata: {json.dumps(s, default=str)}\n\n")
            last = s
        if news or loop.time() - said >= KEEPALIVE_S:
            await resp.write("".join(news or [": keep-alive\n\n"]).encode())
            said = loop.time()
        if s["state"] in TERMINAL:
            await resp.write(f"event: end\ndata: {json.dumps({'state': s['state']})}\n\n".encode())
            break
        if not ctx.accepting:
            break
        await asyncio.sleep(0.5)
    await resp.write_eof()
    return resp


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/jobs", submit)
    app.router.add_post("/v1/jobs/preview", preview)
    app.router.add_get("/v1/jobs", list_jobs)
    app.router.add_get("/v1/jobs/{id}", get_job)
    app.router.add_post("/v1/jobs/prune", prune)
    app.router.add_post("/v1/jobs/{id}/cancel", cancel_job)
    app.router.add_delete("/v1/jobs/{id}", delete_job)
    app.router.add_post("/v1/jobs/{id}/retry", retry_job)
    app.router.add_post("/v1/jobs/{id}/segments/{index}/redo", redo_segment)
    app.router.add_get("/v1/jobs/{id}/events", job_events)
    app.router.add_get("/v1/jobs/{id}/log", job_log)
