"""Format-independent structure: a flat list of blocks -> chapters.

Every reader (text, Markdown, HTML, EPUB, DOCX) turns its input into a list of
:class:`Block` (headings and paragraphs). :func:`build_chapters` then applies the
shared rules: choose the heading level that starts chapters, merge stacked
headings ("Part One" + "Chapter 1"), skip a table of contents, footnotes and
(optionally) front matter.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Optional

from jobs.document import Chapter, TextSource
from jobs.ingest.notes import is_backlinked_note, strip_glued_references, without_backlink

log = logging.getLogger(__name__)

# Heading level 0 marks headings found by pattern ("Chapter 12"): they always start a chapter.
PATTERN_LEVEL = 0


@dataclass
class Block:
    """One structural unit: ``kind`` is "heading", "para", "footnote" or "toc"."""

    kind: str
    text: str
    level: int = PATTERN_LEVEL
    lines: list[str] = field(default_factory=list)  # original lines (plain text), for TOC detection
    runs: Optional[list[int]] = None  # HTML read with positions: the indexes of the runs its text came from
    source: Optional[TextSource] = None  # where its text lies in the input file (EPUB)


TOC_TITLE_RE = re.compile(r"^\s*(table of contents|contents|inhalt|inhaltsverzeichnis|table des matières|índice)\s*[:.]?\s*$", re.I)
FOOTNOTE_MARK_RE = re.compile(r"(?<=\S)\s?(\[\d{1,3}\]|\[\^[^\]\s]{1,12}\])|(?<=[\w.,;:!?\"'”’)])[¹²³⁴⁵⁶⁷⁸⁹⁰]+")
FOOTNOTE_BLOCK_RE = re.compile(r"^\s*(\[\d{1,3}\]|\[\^[^\]\s]{1,12}\]:?)\s")
NOTES_HEADING_RE = re.compile(r"^\s*(foot)?notes?\s*:?\s*$|^\s*(fußnoten|anmerkungen)\s*:?\s*$", re.I)
FRONT_TITLE_RE = re.compile(
    r"^\s*(copyright|dedication|title page|half[- ]title|also by .*|impressum|widmung|colophon)\s*$", re.I
)
FRONT_TEXT_RE = re.compile(r"all rights reserved|\bisbn\b|©|\(c\)\s*\d{4}|copyright\s+(©\s*)?\d{4}|alle rechte vorbehalten", re.I)
PAGE_NUM_RE = re.compile(r"[\s.·…_-]*\d+\s*$")


def _key(text: str) -> str:
    """Comparison key for titles: lowercase letters/digits only."""
    return re.sub(r"[\W_]+", " ", text.lower()).strip()


def _toc_line_key(line: str) -> str:
    return _key(PAGE_NUM_RE.sub("", line))


def _matches_later(key: str, later: list[str]) -> bool:
    if not key:
        return False
    return any(key == k or (len(key) > 3 and (key in k or k in key)) for k in later if k)


def skip_toc(blocks: list[Block]) -> list[Block]:
    """Remove tables of contents: explicit "Contents" sections and runs of title-only lines."""
    blocks = [b for b in blocks if b.kind != "toc"]
    out: list[Block] = []
    i = 0
    heading_keys = [_key(b.text) for b in blocks]
    while i < len(blocks):
        b = blocks[i]
        if b.kind == "heading" and TOC_TITLE_RE.match(b.text):
            # drop the heading, then the listing until a heading repeats an entry (the real chapter 1)
            i += 1
            seen: set[str] = set()
            while i < len(blocks):
                nb = blocks[i]
                k = heading_keys[i]
                if nb.kind == "heading" and (k in seen or _content_follows(blocks, i)):
                    break
                if nb.kind == "para" and len(nb.lines) <= 1 and len(nb.text) > 150:
                    break
                if nb.kind == "para" and len(nb.lines) > 1:
                    seen.update(_toc_line_key(x) for x in nb.lines)
                else:
                    seen.add(_toc_line_key(nb.text))
                i += 1
            log.debug("skipped table of contents")
            continue
        if b.kind == "para" and len(b.lines) >= 3 and all(len(x) < 90 for x in b.lines):
            later = [heading_keys[j] for j in range(i + 1, len(blocks)) if blocks[j].kind == "heading"]
            hits = sum(_matches_later(_toc_line_key(x), later) for x in b.lines)
            if hits >= 0.6 * len(b.lines):
                i += 1
                continue
        if b.kind == "heading":
            # a run of >= 3 headings with no text between them, repeated later, is a TOC
            j = i
            while j < len(blocks) and blocks[j].kind == "heading":
                j += 1
            run = blocks[i:j]
            if len(run) >= 3:
                rest = [heading_keys[x] for x in range(j, len(blocks)) if blocks[x].kind == "heading"]
                hits = sum(_matches_later(_key(h.text), rest) for h in run[:-1])
                if hits >= 0.6 * (len(run) - 1):
                    out.append(run[-1])  # the last one is the real first chapter
                    i = j
                    continue
        out.append(b)
        i += 1
    return out


def _content_follows(blocks: list[Block], i: int) -> bool:
    """True if the heading at ``i`` is followed by real prose (not a listing of short lines)."""
    nxt = blocks[i + 1 : i + 3]
    if not nxt or nxt[0].kind != "para":
        return False
    first = nxt[0]
    if len(first.lines) <= 1 and len(first.text) > 150:
        return True
    return len(nxt) == 2 and nxt[1].kind == "para" and len(first.text) + len(nxt[1].text) > 200


def strip_footnote_markers(text: str) -> str:
    """Remove inline reference markers such as ``word[3]``, ``[^n]`` and superscript digits."""
    return FOOTNOTE_MARK_RE.sub("", text)


def _footnotes_start(paras: list[str]) -> int:
    """Where a chapter's trailing footnotes begin (len(paras): none)."""
    end = len(paras)
    while end > 0 and FOOTNOTE_BLOCK_RE.match(paras[end - 1]):
        end -= 1
    if end < len(paras) and end > 0 and NOTES_HEADING_RE.match(paras[end - 1]):
        end -= 1
    return end


def _joined_source(first: Optional[TextSource], second: Optional[TextSource]) -> Optional[TextSource]:
    """The source of two headings read as one title: their runs together when they are of one file."""
    if first is None or second is None or first.doc != second.doc:
        return first or second
    return TextSource(first.doc, first.runs + second.runs, tuple(dict.fromkeys(first.elements + second.elements)))


def _split_level(blocks: list[Block], promote_title: bool) -> tuple[Optional[int], Optional[str]]:
    """Return (level that starts chapters, document title promoted from a lone top heading)."""
    levels = [b.level for b in blocks if b.kind == "heading" and b.level != PATTERN_LEVEL]
    if not levels:
        return None, None
    top = min(levels)
    deeper = sorted({lv for lv in levels if lv > top})
    if promote_title and levels.count(top) == 1 and deeper:
        first = next(b for b in blocks if b.kind == "heading")
        if first.level == top:
            return deeper[0], first.text
    return top, None


def build_chapters(blocks: list[Block], options, promote_title: bool = True) -> tuple[Optional[str], list[Chapter]]:
    """Turn blocks into chapters; returns (document title found in headings or None, chapters)."""
    if options.skip_footnotes:
        blocks = [b for b in blocks if b.kind != "footnote"]
    if options.skip_toc:
        blocks = skip_toc(blocks)
    split, doc_title = _split_level(blocks, promote_title)
    blocks = _flatten_heading_runs(blocks, split)
    chapters: list[Chapter] = []
    current: Optional[Chapter] = None
    for b in blocks:
        if b.kind in ("footnote", "toc"):
            b = Block("para", b.text)
        if b.kind == "heading" and doc_title is not None and b.text == doc_title and b.level < (split or 0):
            continue
        starts = b.kind == "heading" and (b.level == PATTERN_LEVEL or (split is not None and b.level <= split))
        if starts:
            if current is not None and not current.paragraphs and current.title and not getattr(current, "_merged", False):
                current.title = _join_titles(current.title, b.text)
                current.title_source = _joined_source(current.title_source, b.source)
                current._merged = True  # type: ignore[attr-defined]
            else:
                current = Chapter(title=b.text, paragraphs=[], sources=[], title_source=b.source)
                chapters.append(current)
            continue
        if current is None:
            current = Chapter(title="", paragraphs=[], sources=[])
            chapters.append(current)
        text = " ".join(b.text.split())
        if text:
            current.paragraphs.append(text)
            current.sources.append(b.source)
    backlinked = sum(is_backlinked_note(p) for ch in chapters for p in ch.paragraphs)
    for ch in chapters:
        if options.skip_footnotes:
            end = _footnotes_start(ch.paragraphs)
            kept = [(p, s) for p, s in ((strip_glued_references(strip_footnote_markers(p), backlinked).strip(), s)
                                        for p, s in zip(ch.paragraphs[:end], ch.sources[:end])
                                        if not is_backlinked_note(p)) if p]
            ch.paragraphs, ch.sources = [p for p, _ in kept], [s for _, s in kept]
            ch.title = strip_footnote_markers(ch.title).strip()
        elif backlinked:
            ch.paragraphs = [without_backlink(p) for p in ch.paragraphs]
        if not any(ch.sources):
            ch.sources = None  # a format without positions
    chapters = [c for c in chapters if c.paragraphs]
    if options.skip_front_matter:
        chapters = skip_front_matter(chapters)
    return doc_title, chapters


def _flatten_heading_runs(blocks: list[Block], split: Optional[int]) -> list[Block]:
    """In a run of 3+ chapter headings with no text between (a kept TOC), the middle ones become text."""
    def is_chapter(b: Block) -> bool:
        return b.kind == "heading" and (b.level == PATTERN_LEVEL or (split is not None and b.level <= split))

    out = list(blocks)
    i = 0
    while i < len(out):
        j = i
        while j < len(out) and is_chapter(out[j]):
            j += 1
        if j - i >= 3:
            for k in range(i + 1, j - 1):
                out[k] = Block("para", out[k].text)
        i = max(j, i + 1)
    return out


def _join_titles(a: str, b: str) -> str:
    return f"{a} {b}" if a.rstrip()[-1:] in ".:!?" else f"{a}. {b}"


def is_front_matter(ch: Chapter) -> bool:
    """A copyright page, dedication, title page or similar."""
    if FRONT_TITLE_RE.match(ch.title or ""):
        return True
    text = " ".join(ch.paragraphs)
    if FRONT_TEXT_RE.search(text) and len(text) < 3000:
        return True
    return not ch.title and len(text) < 200


def skip_front_matter(chapters: list[Chapter]) -> list[Chapter]:
    """Drop leading front-matter chapters (never the last remaining one)."""
    i = 0
    while i < len(chapters) - 1 and is_front_matter(chapters[i]):
        log.debug("skipping front matter %r", chapters[i].title)
        i += 1
    kept = chapters[i:]
    if kept and not kept[0].title:  # untitled preamble: drop copyright-like paragraphs only
        first = kept[0]
        keep = [i for i, p in enumerate(first.paragraphs) if not FRONT_TEXT_RE.search(p)]
        if keep:
            first.paragraphs = [first.paragraphs[i] for i in keep]
            first.sources = [first.sources[i] for i in keep] if first.sources is not None else None
        elif len(kept) > 1:
            kept = kept[1:]
    return kept
