"""PDF text layer via ``pypdf``: outline (bookmarks) -> chapters, else chapter-heading detection.

PDF has no paragraph structure; paragraphs are rebuilt from line lengths and
end-of-sentence punctuation, and hyphenated line breaks are joined.
"""
from __future__ import annotations

import io
import logging
import re

from jobs.document import Chapter, Document
from jobs.errors import IngestError
from jobs.ingest.blocks import PATTERN_LEVEL, Block, build_chapters
from jobs.ingest.text import chapter_heading

log = logging.getLogger(__name__)
PAGE_NO_RE = re.compile(r"^\s*(?:page\s+)?\d{1,4}(?:\s*(?:/|of)\s*\d{1,4})?\s*$", re.I)


def _page_paragraphs(text: str) -> list[tuple[str, bool]]:
    """Rebuild (paragraph, is_heading) pairs from one page's extracted lines."""
    lines = [ln.strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln and not PAGE_NO_RE.match(ln)]
    if not lines:
        return []
    width = sorted(len(ln) for ln in lines)[int(len(lines) * 0.8)]
    out: list[tuple[str, bool]] = []
    cur = ""
    for ln in lines:
        if chapter_heading(ln):
            if cur:
                out.append((cur, False))
                cur = ""
            out.append((ln, True))
            continue
        if cur.endswith("-") and ln[:1].islower():
            cur = cur[:-1] + ln
        else:
            cur = f"{cur} {ln}" if cur else ln
        if ln[-1:] in ".!?:\"”’»)" and len(ln) < 0.8 * width:
            out.append((cur, False))
            cur = ""
    if cur:
        out.append((cur, False))
    return out


def load_pdf(data: bytes, options) -> Document:
    """Read a PDF's text layer into a Document."""
    try:
        from pypdf import PdfReader
        from pypdf.errors import PdfReadError
    except ImportError:  # pragma: no cover - pypdf is a declared dependency
        raise IngestError("PDF is not supported yet: convert the file to text, EPUB or DOCX.") from None
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise IngestError("The PDF is password-protected; remove the password and try again.")
        pages = [(page.extract_text() or "") for page in reader.pages]
        starts = _outline_starts(reader)
        meta = reader.metadata or {}
    except IngestError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, OSError, RecursionError) as exc:
        raise IngestError(f"The PDF could not be read ({exc}); it may be damaged.") from None
    if not any(p.strip() for p in pages):
        raise IngestError("The PDF has no text layer (it is probably scanned images); run OCR on it first.")
    if starts:
        chapters = []
        bounds = starts + [(len(pages), "")]
        for (first, title), (nxt, _) in zip(bounds, bounds[1:]):
            paras = [t for pg in pages[first:nxt] for t, _ in _page_paragraphs(pg)]
            if paras:
                chapters.append(Chapter(title=title, paragraphs=paras))
        if pages[: starts[0][0]] and any(p.strip() for p in pages[: starts[0][0]]):
            chapters.insert(0, Chapter("", [t for pg in pages[: starts[0][0]] for t, _ in _page_paragraphs(pg)]))
        blocks = [b for ch in chapters for b in ([Block("heading", ch.title, PATTERN_LEVEL)] if ch.title else [])
                  + [Block("para", p) for p in ch.paragraphs]]
    else:
        blocks = [Block("heading" if h else "para", t, PATTERN_LEVEL) for pg in pages for t, h in _page_paragraphs(pg)]
    _, chapters = build_chapters(blocks, options, promote_title=False)
    title = str(meta.get("/Title") or "").strip() or None
    author = str(meta.get("/Author") or "").strip() or None
    return Document(chapters, title=title, author=author, source_format="pdf")


def _outline_starts(reader) -> list[tuple[int, str]]:
    """Top-level bookmarks as sorted (page index, title)."""
    out: list[tuple[int, str]] = []
    try:
        for item in reader.outline:
            if isinstance(item, list):
                continue
            page = reader.get_destination_page_number(item)
            if page is not None and page >= 0 and item.title:
                out.append((page, item.title.strip()))
    except Exception as exc:  # outlines are often broken; fall back to headings
        log.debug("ignoring PDF outline: %s", exc)
        return []
    out = sorted(dict(out).items()) if out else []
    return [(p, t) for p, t in out] if len(out) >= 2 else []
