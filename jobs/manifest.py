"""The per-job manifest (`output/<job>/manifest.json`): settings, chapters, outputs and every segment.

Each segment entry carries its index (use it with `tts-appliance redo JOB --segment N`), its
chapter, start/end seconds in the chapter file and in the book file, the original and the
normalized text, where its text stands in the book (`kind`: "title" for the chapter's title spoken, else
"text"; `paragraph`: its paragraph's number in the chapter, None for a title), so that a reader shows the text
as the book does: the title as the heading, once, and each paragraph as one; the seed used, its status/error
and the path of its cached audio.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

from jobs.assemble import ChapterOut, write_bytes_atomic
from text.language import spoken_language

MANIFEST_VERSION = 1


def _r(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(float(x), 3)


def build_manifest(job: dict, chapters: Sequence[dict], segments: Sequence[dict],
                   outputs: Optional[Sequence[ChapterOut]] = None, book_path: Optional[Path] = None,
                   codec: Optional[str] = None, sample_rate: Optional[int] = None,
                   subtitles: Optional[dict] = None, epub: Optional[Path] = None) -> dict:
    """Assemble the manifest dict from queue rows and (when assembled) the chapter outputs; `subtitles` as
    `jobs.subtitles.write_job_subtitles` returns it; `epub`: the narrated EPUB (format epub)."""
    spec = json.loads(job["spec"]) if isinstance(job.get("spec"), str) else job.get("spec")
    by_chapter: dict[int, list[dict]] = {}
    for s in segments:
        by_chapter.setdefault(s["chapter_idx"], []).append(s)
    ch_subs = (subtitles or {}).get("chapters") or []
    out_chapters = []
    for ch in chapters:
        segs = by_chapter.get(ch["idx"], [])
        out = outputs[ch["idx"]] if outputs and ch["idx"] < len(outputs) else None
        entries = []
        for j, s in enumerate(segs):
            span = out.spans[j] if out and j < len(out.spans) else None
            where = _metadata(s)
            entries.append({
                "index": s["idx"],
                "chapter": ch["idx"],
                "index_in_chapter": j,
                "start_s": _r(span[0]) if span else None,
                "end_s": _r(span[1]) if span else None,
                "book_start_s": _r(out.start_s + span[0]) if span else None,
                "book_end_s": _r(out.start_s + span[1]) if span else None,
                "original": s["original"],
                "text": s["text"],
                "kind": "title" if where.get("kind") == "title" else "text",
                "paragraph": where.get("paragraph_index"),
                "seed": s["seed_used"] if s.get("seed_used") is not None else s["seed"],
                "pause_after_ms": s["pause_after_ms"],
                "status": s["state"],
                "error": s["last_error"] if s["state"] != "done" else None,
                "attempts": s["attempts"],
                "key": s["key"],
                "audio_path": s["audio_path"],
            })
        out_chapters.append({
            "index": ch["idx"],
            "title": ch["title"],
            "file": str(out.path) if out and out.path else None,
            "subtitles": ch_subs[ch["idx"]] if ch["idx"] < len(ch_subs) else None,
            "book_start_s": _r(out.start_s) if out else None,
            "book_end_s": _r(out.end_s) if out else None,
            "segments": entries,
        })
    failed = [e for c in out_chapters for e in c["segments"] if e["status"] == "failed"]
    return {
        "version": MANIFEST_VERSION,
        "job": {k: job.get(k) for k in ("id", "state", "priority", "title", "author", "model", "error",
                                        "created_at", "finished_at")},
        "sources": json.loads(job.get("sources") or "[]"),
        "settings": spec,
        "language": spoken_language((spec or {}).get("language"), (s["original"] for s in segments)),
        "output": {"book": str(book_path) if book_path else None, "format": (spec or {}).get("format"),
                   "codec": codec, "sample_rate": sample_rate,
                   "subtitles": (subtitles or {}).get("book") or None, "epub": str(epub) if epub else None},
        "chapter_list": [{"title": c["title"], "start_s": c["book_start_s"], "end_s": c["book_end_s"]}
                         for c in out_chapters if c["book_end_s"] is not None and c["book_end_s"] > c["book_start_s"]],
        "chapters": out_chapters,
        "failed_segments": [{"index": e["index"], "error": e["error"]} for e in failed],
    }


def _metadata(row: dict) -> dict:
    """A segment row's metadata (`jobs.segment`: where its text came from)."""
    meta = row.get("metadata")
    try:
        meta = json.loads(meta) if isinstance(meta, str) else meta
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}


def write_manifest(path: str | Path, manifest: dict) -> Path:
    """Write the manifest atomically; returns its path."""
    path = Path(path)
    write_bytes_atomic(path, json.dumps(manifest, indent=2, ensure_ascii=False).encode("utf-8"))
    return path


def read_manifest(path: str | Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))
