"""FictionBook 2 (.fb2, and .fb2.zip: a zip holding one .fb2) with the stdlib.

Chapters are the book's <section>s, titled by their <title>: every section title starts a chapter, and
the title of a section that holds only sections (a part) is joined to its first chapter's ("Part One.
Chapter 1"). A section without a <title> that opens with a paragraph all in <strong> (calibre's FB2) is titled
by that paragraph. <description><title-info> gives title, authors and language; <coverpage> the cover (a
<binary>). A second <body> (notes, comments) is footnotes. The XML is parsed by `jobs.ingest.safexml`
(no entity is ever expanded) and walked without recursion, however deep its sections nest.
"""
from __future__ import annotations

import base64
import binascii
import logging
from typing import Optional
from xml.etree.ElementTree import Element

from jobs.document import Document
from jobs.errors import IngestError
from jobs.ingest import safexml
from jobs.ingest.blocks import PATTERN_LEVEL, Block, build_chapters
from jobs.ingest.safexml import local
from jobs.ingest.safezip import SafeZip

log = logging.getLogger(__name__)

PARAGRAPHS = {"p", "subtitle", "v", "text-author", "td", "th"}  # elements holding one paragraph of text
CONTAINERS = {"epigraph", "cite", "poem", "stanza", "annotation", "table", "tr"}  # elements holding paragraphs
NOTE_BODIES = {"notes", "comments", "footnotes"}


def _from_zip(data: bytes, options) -> bytes:
    """The .fb2 inside a .fb2.zip (the zip's sizes checked first: no zip bomb is expanded)."""
    z = SafeZip(data, "FB2.ZIP", options.max_uncompressed_bytes, options.max_compression_ratio)
    try:
        books = [n for n in sorted(z.names) if n.lower().endswith(".fb2") and not n.endswith("/")]
        if not books:
            raise IngestError("The .fb2.zip file holds no .fb2 book; put the .fb2 file in it, or submit it alone.")
        if len(books) > 1:
            log.warning("the .fb2.zip holds %d books; reading the first, %s", len(books), books[0])
        return z.read(books[0])
    finally:
        z.close()


def _inline(el: Element, skip_notes: bool) -> str:
    """The text of `el` and everything inside it, in order; links to notes left out when `skip_notes`."""
    def instead(child: Element) -> Optional[str]:
        name = local(child.tag)
        skipped = (skip_notes and name == "a" and child.get("type") == "note") or name in ("image", "binary")
        return "" if skipped else None

    return safexml.inline_text(el, instead)


def _href(el: Element) -> str:
    return next((v for k, v in el.attrib.items() if local(k) == "href"), "")


def _title_text(title: Element, skip_notes: bool) -> str:
    """A <title>'s paragraphs as one line: "Chapter 1" + "The Beginning" -> "Chapter 1. The Beginning"."""
    lines = [_inline(p, skip_notes) for p in title if local(p.tag) == "p"] or [_inline(title, skip_notes)]
    out = ""
    for line in filter(None, lines):
        out = f"{out}{' ' if out.rstrip()[-1:] in '.:!?' else '. '}{line}" if out else line
    return out


def _lead_title(children: list[Element], skip_notes: bool) -> Optional[str]:
    """The title of a section that has no <title>: its first paragraph, when that is short and all in one
    <strong> (calibre writes a chapter's heading so), else None."""
    if not children or local(children[0].tag) != "p" or any(local(c.tag) == "title" for c in children):
        return None
    first = children[0]
    inner = list(first)
    if len(inner) != 1 or local(inner[0].tag) != "strong" or (first.text or "").strip() or \
            (inner[0].tail or "").strip():
        return None
    text = _inline(first, skip_notes)
    return text if 0 < len(text) <= 150 else None


def _body_blocks(body: Element, notes: bool, skip_notes: bool) -> tuple[list[Block], Optional[str]]:
    """Blocks of one <body> in reading order, and the body's own <title> (the book's title page). A section
    inside a section that has text of its own before it (not counting an epigraph) is a subsection: its title
    is read as a paragraph."""
    blocks: list[Block] = []
    body_title = None
    stack: list[list] = [[iter(body), "body", False]]  # [children, body/section/sub/container/aside, has text]
    while stack:
        el = next(stack[-1][0], None)
        if el is None:
            stack.pop()
            continue
        name = local(el.tag)
        section = next(level for level in reversed(stack) if level[1] in ("body", "section", "sub"))
        heading = "footnote" if notes else "para" if section[1] == "sub" else "heading"
        if name == "section":
            children = list(el)
            sub = section[1] == "sub" or (section[1] == "section" and section[2])
            lead = _lead_title(children, skip_notes)
            if lead:  # a section without a <title> whose first paragraph is all bold (calibre's FB2)
                blocks.append(Block("para" if sub and not notes else heading, lead, PATTERN_LEVEL))
                children = children[1:]
            stack.append([iter(children), "sub" if sub else "section", False])
        elif name == "title":
            text = _title_text(el, skip_notes)
            if len(stack) == 1:
                body_title = body_title or text  # the body's title: the book's title page, not a chapter
            elif text:
                blocks.append(Block(heading, text, PATTERN_LEVEL))
        elif name in PARAGRAPHS:
            text = _inline(el, skip_notes)
            if text:
                blocks.append(Block("footnote" if notes else "para", text))
                if not any(level[1] == "aside" for level in stack):
                    section[2] = True
        elif name in CONTAINERS:
            stack.append([iter(el), "aside" if name in ("epigraph", "annotation") else "container", False])
    return blocks, body_title


def _person(el: Element) -> str:
    names = {local(c.tag): " ".join((c.text or "").split()) for c in el}
    full = " ".join(n for n in (names.get("first-name"), names.get("middle-name"), names.get("last-name")) if n)
    return full or names.get("nickname", "")


def _metadata(root: Element) -> dict:
    info = next((el for el in root.iter() if local(el.tag) == "title-info"), None)
    meta: dict = {"title": None, "author": None, "language": None, "cover": None}
    if info is None:
        return meta
    authors = []
    for el in info:
        name = local(el.tag)
        if name == "book-title" and not meta["title"]:
            meta["title"] = " ".join("".join(el.itertext()).split()) or None
        elif name == "author":
            authors.append(_person(el))
        elif name == "lang" and (el.text or "").strip():
            meta["language"] = el.text.strip()
        elif name == "coverpage":
            image = next((i for i in el.iter() if local(i.tag) == "image"), None)
            meta["cover"] = _href(image).lstrip("#") if image is not None else None
    meta["author"] = ", ".join(a for a in authors if a) or None
    return meta


def _cover(root: Element, cover_id: Optional[str]) -> tuple[Optional[bytes], Optional[str]]:
    if not cover_id:
        return None, None
    for el in root:
        if local(el.tag) == "binary" and el.get("id") == cover_id:
            try:
                return base64.b64decode("".join((el.text or "").split()), validate=True), el.get("content-type")
            except (binascii.Error, ValueError):
                log.info("FB2 cover %r is not valid base64; left out", cover_id)
    return None, None


def load_fb2(data: bytes, options) -> Document:
    """Read a FictionBook 2 file (or a .fb2.zip) held in memory into a Document."""
    if data.startswith(b"PK\x03\x04"):
        data = _from_zip(data, options)
    root = safexml.parse(data, "FB2 file")
    if local(root.tag) != "FictionBook":
        raise IngestError(f"The file is XML but not a FictionBook 2 book (its root element is <{local(root.tag)}>, "
                          "not <FictionBook>); submit it with the ending of its real format.")
    bodies = [el for el in root if local(el.tag) == "body"]
    if not bodies:
        raise IngestError("The FB2 file has no <body>: it holds no text to read (is it damaged?).")
    blocks: list[Block] = []
    body_title = None
    for i, body in enumerate(bodies):
        notes = i > 0 and (body.get("name") in NOTE_BODIES or body.get("name") is None)
        found, title = _body_blocks(body, notes, options.skip_footnotes)
        blocks.extend(found)
        body_title = body_title or (None if notes else title)
    _, chapters = build_chapters(blocks, options, promote_title=False)
    if not chapters:
        raise IngestError("The FB2 file contains no readable text.")
    meta = _metadata(root)
    cover, cover_mime = _cover(root, meta["cover"])
    return Document(chapters, title=meta["title"] or body_title, author=meta["author"], language=meta["language"],
                    cover=cover, cover_mime=cover_mime, source_format="fb2")
