"""Turning files and documents into queued jobs."""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Optional, Sequence

from text.tags import TagError
from jobs.preview import preview_chapters
from jobs.queue import Queue
from jobs.settings import JobSpec, Paths, file_digest

log = logging.getLogger(__name__)

TEXT_SUFFIXES = {"", ".txt", ".text", ".md", ".markdown", ".html", ".htm", ".xhtml", ".rst"}


class SubmitError(Exception):
    """A file cannot become a job (message says why and what to do)."""


def precheck_file(path: Path) -> None:
    """Reject what can never be a book before ingestion: missing, a folder or other non-file, empty,
    binary-looking text files."""
    if path.is_dir():
        raise SubmitError(f"{path}: is a folder, not a file; submit the files in it")
    if path.exists() and not path.is_file():
        raise SubmitError(f"{path}: is not a regular file (a FIFO, socket or device); save the document as a file")
    if not path.is_file():
        raise SubmitError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise SubmitError(f"{path.name}: the file is empty; nothing to read aloud")
    if path.suffix.lower() in TEXT_SUFFIXES:
        with open(path, "rb") as f:
            head = f.read(8192)
        if b"\x00" in head and not head.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise SubmitError(f"{path.name}: this looks like a binary file, not text; "
                              "save it as plain text (UTF-8), EPUB, HTML or another supported format")


def precheck_type(path: Path) -> str:
    """The format ingestion will read `path` as (jobs.ingest's rules, applied to the name and the
    first and last 64 KiB), after precheck_file; SubmitError for a file it would refuse. Lets a
    client refuse a file before uploading it."""
    from jobs.errors import IngestError
    from jobs.ingest import guess_format

    precheck_file(path)
    with open(path, "rb") as f:
        head = f.read(1 << 16)
        f.seek(max(f.seek(0, 2) - (1 << 16), len(head)))
        tail = f.read()
    try:
        return guess_format(path, head + tail)
    except IngestError as exc:
        raise SubmitError(f"{path.name}: {exc}") from None


def check_voice(engine, voice: Optional[str]) -> None:
    """Raise the engine's VoiceNotFound when `voice` is neither a known voice (in any case: "Ryan" is the
    speaker ryan, as the engine reads it) nor a voice file."""
    voices = list(getattr(engine, "voices", None) or [])
    if voice and voices and voice not in voices and voice.strip().lower() not in voices and not Path(voice).is_file():
        from engines.model.errors import VoiceNotFound

        raise VoiceNotFound(voice, voices)


def job_voices(chapters: Sequence[tuple[str, list]], spec) -> set[str]:
    """Every voice a job names: its own, its chapter voices and its inline tags (segment metadata)."""
    names = {s.metadata.get("voice") for _, segs in chapters for s in segs}
    names.update((spec.chapter_voices or {}).values())
    names.add(spec.voice)
    return {n for n in names if n}


def unknown_voices(chapters: Sequence[tuple[str, list]], spec, known: Optional[Sequence[str]]) -> list[str]:
    """The voices a job names (job_voices) that are neither among `known` (the engine's voices) nor a voice
    file, sorted. `known` None or empty: nothing to check against, none."""
    if not known:
        return []
    return [name for name in sorted(job_voices(chapters, spec)) if name not in known and not Path(name).is_file()]


def check_job_voices(chapters: Sequence[tuple[str, list]], spec, known: Optional[Sequence[str]]) -> None:
    """Raise TagError naming the first unknown voice of the job (unknown_voices); the worker checks again."""
    for name in unknown_voices(chapters, spec, known)[:1]:
        raise TagError(f"unknown voice {name!r} (in the text's [voice=...] tags, chapter_voices or --voice); "
                       f"available: {', '.join(sorted(known))}")


def apply_chapter_voices(chapters: list[tuple[str, list]], numbers: Sequence[int], spec) -> None:
    """Give the segments of chapter number `numbers[i]` (as `preview` numbers them) the voice
    `spec.chapter_voices` names for it, where no inline tag chose one."""
    voices = spec.chapter_voices or {}
    unknown = sorted(set(voices) - {str(n) for n in numbers}, key=lambda k: (len(k), k))
    if unknown:
        log.warning("chapter_voices names chapters %s that the job does not include", ", ".join(unknown))
    for number, (_, segs) in zip(numbers, chapters):
        voice = voices.get(str(number))
        if voice:
            for s in segs:
                s.metadata.setdefault("voice", voice)


def job_defaults(voice: Optional[str], language: str, instruct: Optional[str], model_type: Optional[str] = None,
                 speakers: Sequence[str] = (), lexicon: Optional[str] = None) -> dict:
    """The spec values a job takes when it names none (the settings' jobs.voice, jobs.language,
    jobs.instruct, and the entries of jobs.lexicon's file `lexicon`), fitted to the checkpoint (`model_type`,
    its `speakers`: engines.catalog.Catalog): a CustomVoice model without jobs.voice speaks with its first
    speaker (alphabetical), said in the log; the instruction goes only to VoiceDesign models, the voice only
    to the others."""
    from text.lexicons import file_lexicon

    out = {"language": language or "auto"}
    if lexicon:
        out["lexicon"] = dict(file_lexicon(lexicon).entries)
    if model_type == "voice_design":
        out["instruct"] = instruct
        if voice:
            log.warning("jobs.voice = %r is ignored: VoiceDesign checkpoints have no named voices "
                        "(describe the voice with jobs.instruct)", voice)
        return out
    if instruct and model_type is not None:
        log.warning("jobs.instruct is only used with VoiceDesign checkpoints; this one is %s", model_type)
    if voice is None and model_type == "custom_voice" and speakers:
        voice = speakers[0]
        log.info("jobs.voice is not set: jobs that name no voice speak with %r, the model's first speaker "
                 "(voices: %s; set jobs.voice in the config to choose)", voice, ", ".join(speakers))
    out["voice"] = voice
    return out


def chapter_names(doc) -> list[str]:
    """Each chapter's name as the book lists it: its title; an untitled opening before titled chapters (a
    preamble) is named after the book (else "Opening"), never like the chapter after it; other untitled
    chapters "Chapter N"."""
    titled = any(ch.title for ch in doc.chapters)
    names = []
    for i, ch in enumerate(doc.chapters):
        if ch.title:
            names.append(ch.title)
        elif titled and not any(c.title for c in doc.chapters[:i]):
            names.append(doc.title or "Opening")
        else:
            names.append(f"Chapter {i + 1}")
    return names


def document_chapters(doc, spec: JobSpec, select: bool = True) -> list[tuple[str, list]]:
    """Segment a Document into [(chapter title, [SegmentText, ...]), ...] (empty chapters dropped), then
    (`select`) keep the chapters `spec.chapters` names (numbers as `tts-appliance preview` shows them)."""
    from text.normalize.lexicon import Lexicon
    from jobs.preview import select_chapters
    from jobs.segment import SegmentOptions, segment_document

    language = spec.language if spec.language and spec.language != "auto" else (doc.language or "auto")
    options = SegmentOptions(pack_sentences=spec.format != "epub")  # a narrated EPUB highlights each sentence
    per_chapter = segment_document(doc, language, options, Lexicon(spec.lexicon) if spec.lexicon else None)
    names = chapter_names(doc)
    found = [(name, segs) for name, segs in zip(names, per_chapter) if segs]
    if not select:
        return found
    try:
        chosen = select_chapters(spec.chapters, len(found))
    except ValueError as exc:
        raise SubmitError(str(exc)) from None
    out = [found[i] for i in chosen]
    apply_chapter_voices(out, [i + 1 for i in chosen], spec)
    return out


def submit_document(queue: Queue, paths: Paths, doc, spec: JobSpec, sources: Sequence[str] = (),
                    chapters: Optional[list] = None, job_id: Optional[str] = None) -> str:
    """Queue a Document (already segmented `chapters` may be given; `job_id`: a reserved id).
    Returns the job id."""
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
    chapters = chapters if chapters is not None else document_chapters(doc, spec)
    meta["audio_estimate_s"] = round(sum(c["audio_s"] for c in preview_chapters(chapters, spec.speed)), 1)
    if spec.format == "epub":
        from jobs.narrated.prepare import prepare_narration
        from jobs.segment import resolve_language

        source = Path(sources[0]) if sources else None
        meta["narration"] = prepare_narration(paths.home, doc, chapters, source, resolve_language(spec.language, doc),
                                              spec.title or "", spec.author)
    return queue.add_job(spec, chapters, sources, meta, job_id=job_id)


def submit_file(queue: Queue, paths: Paths, path: str | Path, spec: JobSpec,
                voices: Optional[Sequence[str]] = None, wait_s: float = 30.0, *, limits=None, cancel=None,
                options=None) -> tuple[str, Optional[str]]:
    """Ingest and queue one file. Bad input becomes a failed job (titled with the file name): returns
    (job id, error or None). `voices`: the engine's voices, when known: a voice the job names elsewhere
    fails it here.

    Idempotent: the same content with the same options gives the job of the earlier submit
    (`submit_file_once`). The file is parsed in a child process under `limits`
    (jobs.ingest.isolate.IngestLimits; defaults when None), so a pathological file fails with a reason
    instead of stalling the caller; `cancel` (a threading.Event) stops the parse and raises
    IngestCancelled (no job is recorded then). The user's file is only read, never moved or deleted.
    """
    job_id, error, _ = submit_file_once(queue, paths, path, spec, voices, wait_s, limits=limits, cancel=cancel,
                                        options=options)
    return job_id, error


def submit_key(path: str | Path, spec: JobSpec) -> str:
    """Idempotency key of a submit (jobs.queue.submissions): the file's content and the job's options (all
    JobSpec fields, defaults filled in, reference audio by content), not the file's name or location."""
    options = json.loads(spec.to_json())
    options["ref_audio"] = file_digest(spec.ref_audio)
    blob = json.dumps({"content": file_digest(str(path)), "options": options}, sort_keys=True,
                      ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


def submit_file_once(queue: Queue, paths: Paths, path: str | Path, spec: JobSpec,
                     voices: Optional[Sequence[str]] = None, wait_s: float = 30.0, *, limits=None, cancel=None,
                     options=None) -> tuple[str, Optional[str], bool]:
    """`submit_file` that also says whether this call made the job: (job id, error or None, new).
    Not new: an earlier submit had the same content and options (jobs.queue.submissions); this waits
    up to `wait_s` while that one is still being ingested, and returns its id either way."""
    read = dict(voices=voices, limits=limits, cancel=cancel, options=options)
    path = Path(path)
    if not path.is_file():
        return (*_ingest(queue, paths, path, spec, None, **read), True)
    key = submit_key(path, spec)
    job_id, mine = queue.claim_submission(key)
    if not mine:
        row = queue.wait_for_job(job_id, wait_s)
        log.info("submit of %s: same content and options as job %s (%s); not queued again", path.name, job_id,
                 row["state"] if row else "still being ingested")
        return job_id, row["error"] if row and row["state"] == "failed" else None, False
    try:
        return (*_ingest(queue, paths, path, spec, job_id, **read), True)
    except BaseException:
        queue.release_submission(key, job_id)
        raise


def _ingest(queue: Queue, paths: Paths, path: Path, spec: JobSpec, job_id: Optional[str],
            voices: Optional[Sequence[str]], limits, cancel, options):
    """Read `path` and queue it (as `job_id` when given; the rest: see submit_file); bad input -> a failed job."""
    from jobs.errors import JobError
    from jobs.ingest.isolate import IngestCancelled
    from jobs.queue import QueueError

    try:
        precheck_file(path)
        from jobs.ingest import IngestOptions
        from jobs.ingest.isolate import load_document_isolated

        doc = load_document_isolated(path, options or IngestOptions(), limits, cancel)
        chapters = document_chapters(doc, spec)
        check_job_voices(chapters, spec, voices)
        return submit_document(queue, paths, doc, spec, [str(path.resolve())], chapters, job_id=job_id), None
    except IngestCancelled:
        raise
    except (SubmitError, JobError, QueueError, TagError) as exc:
        error = str(exc)
    except (ImportError, ModuleNotFoundError) as exc:
        raise SubmitError(f"document ingestion is not available ({exc}); the jobs.ingest module is missing")
    except Exception as exc:  # unexpected failure: still a clear job error, other jobs carry on
        log.exception("ingesting %s failed", path)
        error = f"could not read {path.name}: {type(exc).__name__}: {exc}"
    failed = JobSpec.from_dict({**json.loads(spec.to_json()), "title": spec.title or path.name})
    return queue.add_failed_job(failed, [str(path.resolve())], error, job_id=job_id), error
