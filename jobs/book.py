"""Assembly of a finished job: chapter and book files, manifest, final state."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from jobs.assemble import AssemblyError, BookMeta, JoinSettings, assemble_book, read_audio
from jobs.manifest import build_manifest, write_manifest
from jobs.queue import Queue
from jobs.settings import JobSpec, Paths

log = logging.getLogger(__name__)


def assemble_job(queue: Queue, paths: Paths, job_id: str, join: JoinSettings = JoinSettings()) -> str:
    """Write a job's chapter/book files and manifest, then set its final state; returns the state."""
    job, chapters, segs = queue.job(job_id), queue.chapters(job_id), queue.segments(job_id)
    spec = JobSpec.from_dict(json.loads(job["spec"]))
    meta_raw = json.loads(job["meta"] or "{}")
    cover = Path(meta_raw["cover_path"]).read_bytes() if meta_raw.get("cover_path") else None
    meta = BookMeta(title=job["title"], author=job["author"], cover=cover, cover_mime=meta_raw.get("cover_mime"))
    out_dir = paths.output / job_id
    by_ch: dict[int, list] = {c["idx"]: [] for c in chapters}
    sample_rate = None
    for s in segs:
        audio = None
        if s["state"] == "done":
            audio, sample_rate = read_audio(s["audio_path"])
        by_ch[s["chapter_idx"]].append((audio, s["pause_after_ms"]))
    n_failed = sum(1 for s in segs if s["state"] != "done")
    outputs, book, codec, error = None, None, None, None
    try:
        if sample_rate is None:
            raise AssemblyError("every segment failed; nothing to assemble (see `tts-appliance logs JOB`)")
        book, outputs, codec = assemble_book(out_dir, [(c["title"], by_ch[c["idx"]]) for c in chapters],
                                             sample_rate, spec.format, meta, join)
        state = "partial" if n_failed else "done"
        if n_failed:
            error = f"{n_failed} of {len(segs)} segments failed; `tts-appliance retry {job_id}` requeues them"
    except AssemblyError as exc:
        state, error = "failed", str(exc)
    job["state"] = state
    job["error"] = error
    manifest = build_manifest(job, chapters, queue.segments(job_id), outputs, book, codec, sample_rate)
    write_manifest(out_dir / "manifest.json", manifest)
    queue.finish_job(job_id, state, str(out_dir), error)
    log.info("job %s %s%s", job_id, state, f": {error}" if error else "")
    return state

