"""What a Kindle book's links say about its text: which part is a table of contents, where chapters start,
which paragraphs are notes.

Old MOBI (calibre's .mobi) links by byte offset into the text, `<a filepos=0000001596>`: its head's `<guide>`
names the generated table of contents (`<reference type="toc" filepos=...>`), a list of links to where each
chapter starts; a note reference is a link whose text is a number and which points forward, to the note. Here
the table of contents is cut out, every chapter start it lists gets a marker (`CHAPTER_RE`: its number in the
list of titles returned) and every note the KF8 mark of a note (`type="footnote"`, read by
`jobs.ingest.html`). KF8 (azw3) links by `kindle:pos:fid:...`; a part of its text that holds nothing but such
links (and a heading) is a table of contents (pandoc's nav page, calibre's generated one) and is left out.
"""
from __future__ import annotations

import re
from html import unescape
from typing import Optional

# a link's text and a tag are short: no match scans further (no quadratic search in a hostile book)
FILEPOS_LINK_RE = re.compile(rb"<a\s+[^>]{0,200}?filepos=[\"']?0*(\d{1,10})[\"']?[^>]{0,200}>(.{0,2000}?)</a\s*>",
                             re.I | re.S)
GUIDE_TOC_RE = re.compile(rb"<reference\s[^>]*?type=[\"']?toc[\"']?[^>]*>", re.I)
FILEPOS_RE = re.compile(rb"filepos=[\"']?0*(\d+)", re.I)
PAGEBREAK_RE = re.compile(rb"<mbp:pagebreak\s*/?>", re.I)
LIST_TAG_RE = re.compile(rb"<(/?)(?:ol|ul)\b", re.I)
TAG_NAME_RE = re.compile(rb"<([a-zA-Z][\w]*)")
MARKER_RE = re.compile(r"^\s*(\[?\(?\d{1,3}\)?\]?|[*†‡§]+)\s*$")
CHAPTER_RE = re.compile(r'<tts-chapter n="(\d+)"\s*/>')
NOTE_TAGS = {b"p", b"li", b"div", b"aside", b"blockquote", b"dd", b"dt", b"span"}
KINDLE_LINK_RE = re.compile(r"<a\s[^>]{0,200}href=[\"']kindle:pos:[^>]{0,200}>.{0,2000}?</a\s*>", re.I | re.S)
HEADING_RE = re.compile(r"<h([1-6])\b.{0,2000}?</h\1\s*>", re.I | re.S)
TAG_RE = re.compile(r"<[^>]*>")


def _text(markup: bytes, codec: str = "utf-8") -> str:
    return " ".join(unescape(TAG_RE.sub(" ", markup.decode(codec, "replace"))).split())


def _toc_span(text: bytes) -> Optional[tuple[int, int]]:
    """The generated table of contents the guide names: [its start, the next page break)."""
    ref = GUIDE_TOC_RE.search(text)
    at = FILEPOS_RE.search(ref.group(0)) if ref else None
    if at is None or not 0 <= int(at.group(1)) < len(text):
        return None
    start = int(at.group(1))
    end = PAGEBREAK_RE.search(text, start)
    return start, end.start() if end else len(text)


def _toc_entries(text: bytes, start: int, end: int, codec: str) -> list[tuple[int, str]]:
    """The outermost entries of the table of contents in text[start:end]: (where the chapter starts, title)."""
    entries: list[tuple[int, int, str]] = []
    depth, at = 0, start
    for link in FILEPOS_LINK_RE.finditer(text, start, end):
        depth += sum(1 if m.group(1) == b"" else -1 for m in LIST_TAG_RE.finditer(text, at, link.start()))
        at = link.start()
        title = _text(link.group(2), codec)
        target = int(link.group(1))
        if title and not start <= target < end and target < len(text):
            entries.append((depth, target, title))
    top = min((d for d, _, _ in entries), default=0)
    found: dict[int, str] = {}
    for d, target, title in entries:
        if d == top:
            found.setdefault(target, title)
    return sorted(found.items())


def old_mobi_markup(text: bytes, codec: str) -> tuple[bytes, list[str]]:
    """Old MOBI's markup without its generated table of contents, its notes marked and a `<tts-chapter n="i"/>`
    where each chapter it lists starts; and the chapters' titles (none when the book names no such table).
    `codec`: the text's encoding (cp1252 or UTF-8)."""
    edits: list[tuple[int, int, bytes]] = []  # (start, end, replacement), applied from the end
    span = _toc_span(text)
    titles: list[str] = []
    if span:
        edits.append((span[0], span[1], b""))
        for target, title in _toc_entries(text, *span, codec):
            edits.append((target, target, f'<tts-chapter n="{len(titles)}"/>'.encode()))
            titles.append(title)
    marked = set()
    for link in FILEPOS_LINK_RE.finditer(text):
        target = int(link.group(1))
        if span and span[0] <= link.start() < span[1] or target <= link.end() or target in marked:
            continue
        name = TAG_NAME_RE.match(text, target)
        if name and name.group(1).lower() in NOTE_TAGS and MARKER_RE.match(_text(link.group(2), codec)):
            edits.append((name.end(), name.end(), b' type="footnote"'))
            marked.add(target)
    pieces, at = [], 0
    for start, end, new in sorted(edits, key=lambda e: (e[0], e[1])):
        if start < at:  # inside a span already cut out
            continue
        pieces += [text[at:start], new]
        at = end
    return b"".join(pieces + [text[at:]]), titles


def drop_link_lists(markup: str) -> str:
    """KF8 markup without its parts that hold nothing but links within the book (and headings): the tables of
    contents."""
    splitter = "<?xml" if "<?xml" in markup else "<html"
    parts = re.split(f"(?={re.escape(splitter)})", markup)
    kept = []
    for part in parts:
        body = part.split("</head>", 1)[-1]
        links = len(KINDLE_LINK_RE.findall(body))
        rest = TAG_RE.sub(" ", HEADING_RE.sub(" ", KINDLE_LINK_RE.sub(" ", body)))
        if links >= 2 and not unescape(rest).strip():
            continue
        kept.append(part)
    return "".join(kept)
