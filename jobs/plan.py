"""A document's plan before it is queued: what `tts-appliance preview` prints and `POST /v1/jobs/preview`
answers. The document is segmented exactly as a submit would (`jobs.submit.document_chapters`), and its
chapters, totals and time estimates come from `jobs.preview`.
"""
from __future__ import annotations

from typing import Optional, Sequence

from jobs.preview import estimate, preview_chapters
from jobs.segment import resolve_language
from jobs.settings import JobSpec
from jobs.submit import document_chapters, unknown_voices


def plan_document(doc, spec: JobSpec, name: str, configured_rate: Optional[float], queue,
                  voices: Optional[Sequence[str]] = None) -> dict:
    """The plan of a read Document: title (the spec's, the document's, else `name`), language, every
    chapter (marked when `spec.chapters` keeps it), the totals of the kept ones with the synthesis time
    (`jobs.synth_rate` when `configured_rate`, else measured from the queue at `queue`), and the voices
    its [voice=...] tags name that are not among `voices` (the checkpoint's; None: not checked) with the
    chapters naming them. ValueError when `spec.chapters` names a chapter the document lacks, or when nothing
    in it can be read aloud."""
    found = document_chapters(doc, spec, select=False)
    if not found:  # a submit would fail the job: say so now, and why
        raise ValueError(f"{name}: nothing in it can be read aloud (no words: only punctuation, symbols or spaces?); "
                         "give a document with text")
    chapters = preview_chapters(found, spec.speed, spec.chapters)
    unknown = {voice: [i + 1 for i, (_, segs) in enumerate(found) if any(s.metadata.get("voice") == voice
                                                                         for s in segs)]
               for voice in unknown_voices(found, spec, voices)}
    language = resolve_language(spec.language if spec.language != "auto" else None, doc)
    return {"title": spec.title or doc.title or name, "language": language or "auto", "chapters": chapters,
            "total": estimate(chapters, configured_rate, queue), "unknown_voices": unknown,
            "voices": list(voices) if voices is not None else None}
