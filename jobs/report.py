"""What a job looks like from outside: the summary the CLI prints and the HTTP API returns."""
from __future__ import annotations

import json
from pathlib import Path

from engines.model.text import CHARS_PER_S
from jobs.eta import estimate
from jobs.queue import Queue

STATES = ("queued", "leased", "done", "failed", "cancelled")


def job_summary(queue: Queue, job_id: str, failed_segments: bool = True) -> dict:
    """State, progress counts, error, output folder, sources, author, whether it has a cover, its length and,
    while it runs, the time it has left (`jobs.eta`) of one job (raises QueueError if unknown); with
    `failed_segments`, also each failed segment's index and last error."""
    job = queue.job(job_id)
    totals = queue.segment_totals(job_id)
    counts = {state: 0 for state in STATES} | {state: t["segments"] for state, t in totals.items()}
    meta = json.loads(job.get("meta") or "{}")
    s = {"id": job["id"], "state": job["state"], "priority": job["priority"], "title": job["title"],
         "author": job.get("author"), "progress": {"done": counts["done"], "total": sum(counts.values()), **counts},
         "error": job["error"], "output_dir": job["output_dir"], "sources": json.loads(job["sources"] or "[]"),
         "created_at": job["created_at"], "finished_at": job["finished_at"],
         "cover": bool(meta.get("cover_path")) and Path(meta["cover_path"]).is_file(),
         "length": length(queue, job, meta, totals), "eta": None}
    if job["state"] == "running":
        eta = estimate(queue.finishes(job_id), queue.text_chars(job_id, ("queued", "leased")))
        s["eta"] = eta.to_dict() if eta else None
    if failed_segments:
        s["failed_segments"] = [{"index": g["idx"], "error": g["last_error"]}
                                for g in queue.segments(job_id) if g["state"] == "failed"]
    return s


def length(queue: Queue, job: dict, meta: dict, totals: dict[str, dict]) -> dict:
    """{"seconds", "measured"}: how long the book plays. A finished book: its audio (the segments made, at the
    job's speed, and their pauses; measured). Before: the estimate made at submit (`audio_estimate_s`), or for
    jobs queued before there was one, its text at the usual speaking rate."""
    speed = float(json.loads(job.get("spec") or "{}").get("speed") or 1.0)
    if job["state"] in ("done", "partial"):
        done = totals.get("done", {"audio_s": 0.0, "pause_ms": 0})
        return {"seconds": round(done["audio_s"] / speed + done["pause_ms"] / 1000, 1), "measured": True}
    if meta.get("audio_estimate_s") is not None:
        return {"seconds": float(meta["audio_estimate_s"]), "measured": False}
    chars = queue.text_chars(job["id"], tuple(totals)) if totals else 0
    pauses = sum(t["pause_ms"] for t in totals.values()) / 1000
    return {"seconds": round(chars / CHARS_PER_S / speed + pauses, 1), "measured": False}


def describe(s: dict) -> str:
    """A job summary as the few lines `tts-appliance list/status` print."""
    p = s["progress"]
    line = f"{s['id']}  {s['state']:<9}  {p['done']}/{p['total']} segments  {s['title'] or ''}"
    if p["failed"]:
        line += f"  ({p['failed']} failed)"
    if s["error"]:
        line += f"\n    error: {s['error']}"
    if s["output_dir"] and s["state"] in ("done", "partial"):
        line += f"\n    output: {s['output_dir']}"
    return line
