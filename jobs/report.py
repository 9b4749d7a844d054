"""What a job looks like from outside: the summary the CLI prints and the HTTP API returns."""
from __future__ import annotations

import json

from jobs.queue import Queue


def job_summary(queue: Queue, job_id: str, failed_segments: bool = True) -> dict:
    """State, progress counts, error, output folder and sources of one job (raises QueueError if unknown);
    with `failed_segments`, also each failed segment's index and last error."""
    job = queue.job(job_id)
    counts = queue.counts(job_id)
    s = {"id": job["id"], "state": job["state"], "priority": job["priority"], "title": job["title"],
         "progress": {"done": counts["done"], "total": sum(counts.values()), **counts},
         "error": job["error"], "output_dir": job["output_dir"], "sources": json.loads(job["sources"] or "[]"),
         "created_at": job["created_at"], "finished_at": job["finished_at"]}
    if failed_segments:
        s["failed_segments"] = [{"index": g["idx"], "error": g["last_error"]}
                                for g in queue.segments(job_id) if g["state"] == "failed"]
    return s


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
