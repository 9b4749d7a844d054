"""The narrated EPUB of an assembled job: its book (`jobs.narrated.prepare`: the input EPUB 3 itself, or a
simple EPUB of its text) with the chapter audio, a Media Overlay per narrated file and each segment's text
in id'd spans, written beside the job's other outputs as `<title>.epub`.

Clips come from the same spans as the subtitles (`ChapterOut.spans`: each segment's place in its chapter's
audio), made to tile the chapter's audio (`jobs.narrated.smil.tile`: a clip is its sentence and the pause
after it). The book's members are copied through as they are (`mimetype` first and stored, as OCF asks); only
the narrated XHTML files and the package document change, by insertions (`jobs.narrated.splice`). The book
is opened with the zip guards of ingestion (`jobs.ingest.safezip`), and nothing in it is run or fetched.
"""
from __future__ import annotations

import json
import logging
import posixpath
import zipfile
from pathlib import Path
from typing import Sequence

from jobs.assemble import AssemblyError, ChapterOut, atomic_path, safe_name
from jobs.document import EpubPackage
from jobs.errors import IngestError
from jobs.ingest.safezip import SafeZip
from jobs.narrated.accessibility import accessibility_metadata
from jobs.narrated.smil import Par, duration_ms, href, smil_document, tile
from jobs.narrated.splice import CSS, insert, opf_inserts, span_inserts
from jobs.subtitles import clock, milliseconds

log = logging.getLogger(__name__)
MAX_BOOK_BYTES = 2 << 30  # the book's members together, uncompressed (its audio included: it is ours)
MAX_RATIO = 100.0


def narration_of(job: dict) -> dict:
    """The job's narration entry (`jobs.narrated.prepare`), or AssemblyError saying what to do."""
    narration = json.loads(job.get("meta") or "{}").get("narration")
    if not narration:
        raise AssemblyError("this job has no book to narrate (it was queued by an older version, or not as "
                            "format epub); submit the document again with --format epub")
    return narration


def write_narrated_epub(job: dict, chapters: Sequence[dict], segments: Sequence[dict],
                        outputs: Sequence[ChapterOut], out_dir: Path) -> Path:
    """Write `<title>.epub` into `out_dir` for an assembled job (`outputs`: its chapters as `BookWriter`
    wrote them, in chapter order) -> its path. AssemblyError when the book cannot be written as asked."""
    narration = narration_of(job)
    package = EpubPackage.from_dict(narration["map"])
    try:
        data = Path(narration["package"]).read_bytes()
    except OSError as exc:
        raise AssemblyError(f"the book to narrate is gone ({exc}); submit the document again") from None
    try:
        book = SafeZip(data, "EPUB", MAX_BOOK_BYTES, MAX_RATIO)
    except IngestError as exc:
        raise AssemblyError(f"the book to narrate cannot be opened: {exc}") from None
    base = posixpath.dirname(package.opf)
    folder = posixpath.join(base, package.prefix) if base else package.prefix
    pars, audio, ends = _pars(package, folder, chapters, segments, outputs)
    try:
        changed, added = _files(book, package, folder, pars, audio, ends, job, bool(narration.get("generated")))
        path = out_dir / f"{safe_name(job.get('title') or 'book')}.epub"
        with atomic_path(path) as tmp:
            _write_zip(tmp, book, changed, added)
    finally:
        book.close()
    log.info("wrote %s: %d segments narrated in %d files (%s)", path.name, sum(len(p) for p in pars.values()),
             len(pars), "a new EPUB of the text" if narration.get("generated") else "the input EPUB")
    return path


def _pars(package: EpubPackage, folder: str, chapters, segments, outputs) -> tuple[dict, dict, dict]:
    """({narrated file: [Par, ...] in reading order, each clip its segment's own span}, {audio member: chapter
    file}, {audio member: its length in ms}) of the job's segments."""
    by_chapter: dict[int, list[dict]] = {}
    for s in segments:
        by_chapter.setdefault(s["chapter_idx"], []).append(s)
    pars: dict[str, list[Par]] = {}
    audio: dict[str, Path] = {}
    ends: dict[str, int] = {}
    for ch, out in zip(chapters, outputs):
        if out.path is None:
            continue
        if out.path.suffix != ".mp3":
            raise AssemblyError(f"the chapter audio {out.path.name} is no mp3; a narrated EPUB carries mp3")
        member = f"{folder}/audio/{ch['idx'] + 1:03d}.mp3"
        for row, span in zip(by_chapter.get(ch["idx"], []), out.spans):
            source = json.loads(row.get("metadata") or "{}").get("source")
            if span is None or not source or not source["ranges"] or source["doc"] not in package.items:
                continue
            begin, end = milliseconds(span[0]), milliseconds(span[1])
            if end > begin:
                ranges = tuple(tuple(r) for r in source["ranges"])
                span_id = f"{package.prefix}-s{row['idx']}"
                pars.setdefault(source["doc"], []).append(Par(source["doc"], span_id, member, begin, end, ranges))
                audio[member], ends[member] = out.path, milliseconds(out.end_s - out.start_s)
    order = list(package.items)  # files in spine order, a file's pars in the order of its text
    return ({doc: sorted(pars[doc], key=lambda p: p.ranges[0][0]) for doc in sorted(pars, key=order.index)},
            audio, ends)


def _files(book: SafeZip, package: EpubPackage, folder: str, pars: dict, audio: dict, ends: dict, job: dict,
           generated: bool):
    """The changed members ({name: bytes}) and the added ones ([(name, bytes or a file)]); `generated`: the
    book is a simple EPUB of the text."""
    css = f"{folder}/narration.css"
    changed: dict[str, bytes] = {}
    spans: dict[str, list] = {}  # narrated file -> its pars whose text was wrapped
    for doc, doc_pars in pars.items():
        data = book.read(doc)
        inserts, wrapped = span_inserts(len(data), [(p.span_id, p.ranges) for p in doc_pars])
        if not wrapped:
            continue
        head = package.heads.get(doc, -1)
        if head >= 0:
            inserts.append((head, 0, f'<link rel="stylesheet" type="text/css" href="{href(css, doc)}"/>\n'))
        changed[doc] = insert(data, inserts)
        spans[doc] = [p for p in doc_pars if p.span_id in wrapped]
    if not spans:
        raise AssemblyError("no segment of the job was found in the book's text, so nothing can be narrated "
                            "(see the job's log); choose an audio format for this document")
    tiled = iter(tile([p for doc_pars in spans.values() for p in doc_pars], ends))
    spans = {doc: [next(tiled) for _ in doc_pars] for doc, doc_pars in spans.items()}
    heard = sorted({p.audio for doc_pars in spans.values() for p in doc_pars})  # audio with a clip, no other
    added: list[tuple[str, object]] = [(css, CSS.encode("utf-8"))]
    items = [(f"{package.prefix}-css", href(css, package.opf), "text/css")]
    for n, member in enumerate(heard, 1):
        added.append((member, audio[member]))
        items.append((f"{package.prefix}-audio{n:03d}", href(member, package.opf), "audio/mpeg"))
    overlays, durations = {}, []
    for n, (doc, doc_pars) in enumerate(spans.items(), 1):
        smil, overlay = f"{folder}/smil/{n:03d}.smil", f"{package.prefix}-mo{n:03d}"
        added.append((smil, smil_document(smil, doc, doc_pars)))
        items.append((overlay, href(smil, package.opf), "application/smil+xml"))
        overlays[doc] = overlay
        durations.append((overlay, duration_ms(doc_pars)))
    total = clock(sum(d for _, d in durations))
    voice = json.loads(job.get("spec") or "{}").get("voice") or ""
    narrator = Path(voice).stem if voice.endswith(".voice") else voice  # a saved voice by its name, not its path
    metadata = accessibility_metadata(package, generated)
    changed[package.opf] = insert(book.read(package.opf), opf_inserts(
        package, items, overlays, [(i, clock(d)) for i, d in durations], total, narrator, metadata))
    return changed, added


def _write_zip(path: Path, book: SafeZip, changed: dict, added: list) -> None:
    with zipfile.ZipFile(path, "w") as out:
        out.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        for info in book.zf.infolist():
            if info.filename == "mimetype":
                continue
            data = changed.get(info.filename)
            copy = zipfile.ZipInfo(info.filename, info.date_time)
            copy.external_attr = info.external_attr
            copy.compress_type = zipfile.ZIP_STORED if info.is_dir() else zipfile.ZIP_DEFLATED
            out.writestr(copy, data if data is not None else book.read(info.filename))
        for name, content in added:
            if isinstance(content, Path):
                out.write(content, name, compress_type=zipfile.ZIP_STORED)
            else:
                out.writestr(name, content, compress_type=zipfile.ZIP_DEFLATED)
