"""Turning files and documents into queued jobs."""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Optional, Sequence

from jobs.queue import Queue
from jobs.settings import JobSpec, Paths

log = logging.getLogger(__name__)

TEXT_SUFFIXES = {"", ".txt", ".text", ".md", ".markdown", ".html", ".htm", ".xhtml", ".rst"}


class SubmitError(Exception):
    """A file cannot become a job (message says why and what to do)."""


def precheck_file(path: Path) -> None:
    """Reject what can never be a book before ingestion: missing, empty, binary-looking text files."""
    if not path.is_file():
        raise SubmitError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise SubmitError(f"{path.name}: the file is empty; nothing to read aloud")
    if path.suffix.lower() in TEXT_SUFFIXES:
        head = path.read_bytes()[:8192]
        if b"\x00" in head and not head.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise SubmitError(f"{path.name}: this looks like a binary file, not text; "
                              "save it as plain text (UTF-8), EPUB, HTML or another supported format")


def check_voice(engine, voice: Optional[str]) -> None:
    """Raise the engine's VoiceNotFound when `voice` is neither a known voice nor a voice file."""
    voices = list(getattr(engine, "voices", None) or [])
    if voice and voices and voice not in voices and not Path(voice).is_file():
        from engines.model.errors import VoiceNotFound

        raise VoiceNotFound(voice, voices)


def document_chapters(doc, spec: JobSpec) -> list[tuple[str, list]]:
    """Segment a Document into [(chapter title, [SegmentText, ...]), ...] (empty chapters dropped)."""
    from jobs.segment import SegmentOptions, segment_document

    language = spec.language if spec.language and spec.language != "auto" else (doc.language or "auto")
    per_chapter = segment_document(doc, language, SegmentOptions(), None)
    return [(ch.title or f"Chapter {i + 1}", segs)
            for i, (ch, segs) in enumerate(zip(doc.chapters, per_chapter)) if segs]


def submit_document(queue: Queue, paths: Paths, doc, spec: JobSpec, sources: Sequence[str] = (),
                    chapters: Optional[list] = None) -> str:
    """Queue a Document (already segmented `chapters` may be given). Returns the job id."""
    spec = JobSpec.from_dict({**json.loads(spec.to_json()),
                              "title": spec.title or doc.title or (Path(sources[0]).stem if sources else None),
                              "author": spec.author or doc.author})
    meta = {"source_format": doc.source_format, "language_hint": doc.language}
    if doc.cover:
        ext = ".png" if (doc.cover_mime or "").endswith("png") else ".jpg"
        cover = paths.home / "covers" / (hashlib.sha256(doc.cover).hexdigest()[:16] + ext)
        if not cover.exists():
            from jobs.assemble import write_bytes_atomic

            write_bytes_atomic(cover, doc.cover)
        meta.update(cover_path=str(cover), cover_mime=doc.cover_mime)
    return queue.add_job(spec, chapters if chapters is not None else document_chapters(doc, spec), sources, meta)


def submit_file(queue: Queue, paths: Paths, path: str | Path, spec: JobSpec, limits=None, cancel=None,
                options=None) -> tuple[str, Optional[str]]:
    """Ingest and queue one file. Bad input becomes a failed job (titled with the file name): returns
    (job id, error or None).

    The file is parsed in a child process under `limits` (jobs.ingest.isolate.IngestLimits; defaults
    when None), so a pathological file fails with a reason instead of stalling the caller; `cancel`
    (a threading.Event) stops the parse and raises IngestCancelled (no job is recorded then).
    The user's file is only read, never moved or deleted.
    """
    from jobs.errors import JobError
    from jobs.ingest.isolate import IngestCancelled
    from jobs.queue import QueueError

    path = Path(path)
    try:
        precheck_file(path)
        from jobs.ingest import IngestOptions
        from jobs.ingest.isolate import load_document_isolated

        doc = load_document_isolated(path, options or IngestOptions(), limits, cancel)
        return submit_document(queue, paths, doc, spec, [str(path.resolve())]), None
    except IngestCancelled:
        raise
    except (SubmitError, JobError, QueueError) as exc:
        error = str(exc)
    except (ImportError, ModuleNotFoundError) as exc:
        raise SubmitError(f"document ingestion is not available ({exc}); the jobs.ingest module is missing")
    except Exception as exc:  # unexpected failure: still a clear job error, other jobs carry on
        log.exception("ingesting %s failed", path)
        error = f"could not read {path.name}: {type(exc).__name__}: {exc}"
    failed = JobSpec.from_dict({**json.loads(spec.to_json()), "title": spec.title or path.name})
    return queue.add_failed_job(failed, [str(path.resolve())], error), error
