"""PDF text layer via ``pypdf``: outline (bookmarks) -> chapters, else chapter-heading detection.

PDF has no paragraph structure; paragraphs are rebuilt from line lengths and end-of-sentence punctuation, and
hyphenated line breaks are joined. Every top-level bookmark starts a chapter where its title stands on its page
(LibreOffice starts several chapters on one page), and that heading line is not read again; a bookmark whose
title is not found on its page starts its chapter at the page's top. A page's footnotes (lines at its foot that
start with the numbers of references glued to its words: "bench.1 It" ... "1 The bench was green.") are notes;
replacement text (/ActualText) is honoured (`jobs.ingest.pdf_actualtext`).
"""
from __future__ import annotations

import io
import logging
import re
from typing import Optional

from jobs.document import Document
from jobs.errors import IngestError
from jobs.ingest.blocks import PATTERN_LEVEL, Block, _key, build_chapters
from jobs.ingest.notes import BACKLINK_RE, note_number, strip_glued_references
from jobs.ingest.text import chapter_heading

log = logging.getLogger(__name__)
PAGE_NO_RE = re.compile(r"^\s*(?:page\s+)?\d{1,4}(?:\s*(?:/|of)\s*\d{1,4})?\s*$", re.I)
MAX_NOTE_LINES = 40  # the foot of a page that may hold its notes


def _glued(text: str, number: int) -> bool:
    """`text` holds `number` glued to the word or punctuation before it (a note reference)."""
    return strip_glued_references(text, number, only=(number,)) != text


def _page_notes(lines: list[str], before: str = "") -> tuple[list[str], list[str], set[int]]:
    """A page's lines split into (body, notes at its foot, their numbers): the notes start at the first line
    that starts with the number of a reference in the body above it (or in `before`, the previous page's body:
    a note may flow to the next page) and are followed only by lines of the next such numbers and lines
    continuing them."""
    for start in range(max(1, len(lines) - MAX_NOTE_LINES), len(lines)):
        first = note_number(lines[start])
        if not first:
            continue
        body = before + " " + " ".join(lines[:start])
        numbers, expected = set(), first
        for line in lines[start:]:
            n = note_number(line)
            if n and n == expected and _glued(body, n):
                numbers.add(n)
                expected += 1
            elif n:
                break
        else:
            if numbers:
                return lines[:start], lines[start:], numbers
    return lines, [], set()


def _paragraphs(lines: list[str], heading_words: bool) -> list[tuple[str, bool]]:
    """Rebuild (paragraph, is_heading) pairs from lines; `heading_words`: a line of chapter words ("Chapter 3")
    is a heading of its own."""
    if not lines:
        return []
    width = sorted(len(ln) for ln in lines)[int(len(lines) * 0.8)]
    out: list[tuple[str, bool]] = []
    cur = ""
    for i, ln in enumerate(lines):
        note_line = bool(note_number(ln)) and any(BACKLINK_RE.search(x) for x in lines[i:i + 6])
        if heading_words and chapter_heading(ln) or note_line:
            if cur:
                out.append((cur, False))
                cur = ""
            if not note_line:
                out.append((ln, True))
                continue
        if cur.endswith("-") and ln[:1].islower():
            cur = cur[:-1] + ln
        else:
            cur = f"{cur} {ln}" if cur else ln
        if (ln[-1:] in ".!?:\"”’»)" and len(ln) < 0.8 * width) or BACKLINK_RE.search(ln):
            out.append((cur, False))
            cur = ""
    if cur:
        out.append((cur, False))
    return out


def _lines(text: str) -> list[str]:
    return [ln for ln in (x.strip() for x in text.splitlines()) if ln and not PAGE_NO_RE.match(ln)]


def _split_at_titles(lines: list[str], titles: list[str]) -> list[tuple[Optional[str], list[str]]]:
    """A page's lines cut where the bookmarks' `titles` (in order) stand: [(title or None, its lines)], the title
    lines (one, or two that a long title wraps over) left out. Titles not found start at the page's top."""
    pieces: list[tuple[Optional[str], list[str]]] = [(None, [])]
    todo = list(titles)
    i = 0
    while i < len(lines):
        found = None
        for k, title in enumerate(todo):
            key = _key(title)
            if _key(lines[i]) == key:
                found, used = k, 1
            elif i + 1 < len(lines) and key.startswith(_key(lines[i])) and _key(f"{lines[i]} {lines[i + 1]}") == key:
                found, used = k, 2
            if found is not None:
                break
        if found is None:
            pieces[-1][1].append(lines[i])
            i += 1
            continue
        pieces.extend((t, []) for t in todo[:found + 1])  # titles passed over start here too, empty
        todo = todo[found + 1:]
        i += used
    if todo:  # not found on the page: they start at its top
        head = [(t, []) for t in todo[:-1]] + [(todo[-1], pieces[0][1])]
        pieces = [(None, [])] + head + pieces[1:]
    return pieces


def _pages_notes(pages: list[str]) -> tuple[list[tuple[list[str], list[str]]], set[int]]:
    """Every page's (body lines, note lines), and the numbers of all the notes found."""
    out, numbers, before = [], set(), ""
    for text in pages:
        body, notes, found = _page_notes(_lines(text), before)
        out.append((body, notes))
        numbers |= found
        before = " ".join(body)
    return out, numbers


def _outline_blocks(pages: list[str], starts: list[tuple[int, str]]) -> list[Block]:
    """Blocks of a PDF with bookmarks: a heading where each starts, the pages' paragraphs and notes."""
    by_page: dict[int, list[str]] = {}
    for page, title in starts:
        by_page.setdefault(page, []).append(title)
    split, numbers = _pages_notes(pages)
    blocks: list[Block] = []
    for index, (body, notes) in enumerate(split):
        for title, lines in _split_at_titles(body, by_page.get(index, [])):
            if title is not None:
                blocks.append(Block("heading", title, PATTERN_LEVEL))
            lines = [strip_glued_references(ln, max(numbers), numbers) for ln in lines] if numbers else lines
            blocks.extend(Block("para", t) for t, _ in _paragraphs(lines, heading_words=False))
        blocks.extend(Block("footnote", t) for t, _ in _paragraphs(notes, heading_words=False))
    return blocks


def load_pdf(data: bytes, options) -> Document:
    """Read a PDF's text layer into a Document."""
    try:
        from pypdf import PdfReader
        from pypdf.errors import PdfReadError

        from jobs.ingest.pdf_actualtext import honour_actual_text
    except ImportError:  # pragma: no cover - pypdf is a declared dependency
        raise IngestError("PDF is not supported yet: convert the file to text, EPUB or DOCX.") from None
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise IngestError("The PDF is password-protected; remove the password and try again.")
        pages = []
        for page in reader.pages:
            honour_actual_text(page, reader)
            pages.append(page.extract_text() or "")
        starts = _outline_starts(reader)
        meta = reader.metadata or {}
    except IngestError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, OSError, RecursionError) as exc:
        raise IngestError(f"The PDF could not be read ({exc}); it may be damaged.") from None
    if not any(p.strip() for p in pages):
        raise IngestError("The PDF has no text layer (it is probably scanned images); run OCR on it first.")
    if starts:
        blocks = _outline_blocks(pages, starts)
    else:
        blocks = []
        split, numbers = _pages_notes(pages)
        for body, notes in split:
            body = [strip_glued_references(ln, max(numbers), numbers) for ln in body] if numbers else body
            blocks += [Block("heading" if h else "para", t, PATTERN_LEVEL) for t, h in _paragraphs(body, True)]
            blocks += [Block("footnote", t) for t, _ in _paragraphs(notes, heading_words=False)]
    _, chapters = build_chapters(blocks, options, promote_title=False)
    title = str(meta.get("/Title") or "").strip() or None
    author = str(meta.get("/Author") or "").strip() or None
    return Document(chapters, title=title, author=author, source_format="pdf")


def _outline_starts(reader) -> list[tuple[int, str]]:
    """Top-level bookmarks as (page index, title), by page, in the outline's order within a page."""
    out: list[tuple[int, str]] = []
    try:
        for item in reader.outline:
            if isinstance(item, list):
                continue
            page = reader.get_destination_page_number(item)
            if page is not None and page >= 0 and item.title and item.title.strip():
                out.append((page, item.title.strip()))
    except Exception as exc:  # outlines are often broken; fall back to headings
        log.debug("ignoring PDF outline: %s", exc)
        return []
    out = sorted(out, key=lambda s: s[0])  # stable: several on one page keep their order
    return out if len({p for p, _ in out}) >= 2 or len(out) >= 2 else []
