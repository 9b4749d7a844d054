"""ODT (OpenDocument Text) with the stdlib: content.xml's headings (text:h and their outline levels, or
paragraph styles with one) -> chapters, paragraphs, lists, tables and footnotes; meta.xml -> metadata.

The package is a zip read through `SafeZip` (no zip bomb is expanded) and its XML through
`jobs.ingest.safexml` (no entity is expanded); the tree is walked without recursion.
"""
from __future__ import annotations

import logging
from typing import Optional
from xml.etree.ElementTree import Element

from jobs.document import Document
from jobs.errors import IngestError
from jobs.ingest import safexml
from jobs.ingest.blocks import Block, build_chapters
from jobs.ingest.docx import HEADING_NAME_RE
from jobs.ingest.safexml import local
from jobs.ingest.safezip import SafeZip
from jobs.ingest.text import styled_block

log = logging.getLogger(__name__)

OFFICE = "{urn:oasis:names:tc:opendocument:xmlns:office:1.0}"
SVG = "{urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0}"
TEXT_TYPES = ("application/vnd.oasis.opendocument.text", "application/vnd.oasis.opendocument.text-template",
              "application/vnd.oasis.opendocument.text-master")
CONTAINERS = {"list", "list-item", "list-header", "section", "table", "table-row", "table-rows", "table-cell",
              "table-header-rows", "table-column-group", "frame", "text-box", "index-body"}
TOC = {"table-of-content"}
SKIPPED = {"tracked-changes", "sequence-decls", "variable-decls", "user-field-decls", "forms", "alphabetical-index",
           "illustration-index", "table-index", "object-index", "user-index", "bibliography", "index-title-template",
           "table-of-content-source", "annotation", "note-citation"}
ENCRYPTED = ("The ODT file is password-protected (encrypted); open it in its program, save it without a password "
             "and submit again")


def _attr(el: Element, name: str) -> Optional[str]:
    return next((v for k, v in el.attrib.items() if local(k) == name), None)


def _xml(z: SafeZip, name: str) -> Optional[Element]:
    return safexml.parse(z.read(name), f"ODT file's {name}") if z.has(name) else None


def _check_package(z: SafeZip) -> None:
    """Refuse another OpenDocument kind (spreadsheet, presentation ...) and an encrypted document."""
    if z.has("mimetype"):
        kind = z.read("mimetype").decode("ascii", "replace").strip()
        if kind not in TEXT_TYPES:
            what = kind.rsplit(".", 1)[-1] if kind.startswith("application/vnd.oasis.opendocument.") else kind
            raise IngestError(f"The file is an OpenDocument {what!r} file, not a text document (ODT); "
                              "export it as ODT, DOCX or plain text.")
    manifest = _xml(z, "META-INF/manifest.xml")
    if manifest is not None and any(local(el.tag) == "encryption-data" for el in manifest.iter()):
        raise IngestError(ENCRYPTED)
    if not z.has("content.xml"):
        raise IngestError("The ODT file has no content.xml; it is damaged or not an OpenDocument text.")


def _styles(*roots: Optional[Element]) -> dict[str, int]:
    """Paragraph style name -> heading level (0: the "Title" style), following parent styles."""
    parent: dict[str, str] = {}
    own: dict[str, int] = {}
    for root in filter(lambda r: r is not None, roots):
        for st in root.iter():
            if local(st.tag) != "style" or _attr(st, "family") != "paragraph" or not _attr(st, "name"):
                continue
            name = _attr(st, "name")
            display = _attr(st, "display-name") or name.replace("_20_", " ")
            level = _attr(st, "default-outline-level")
            m = HEADING_NAME_RE.match(display)
            if level and level.isdigit():
                own[name] = int(level)
            elif m:
                own[name] = int(m.group(1))
            elif display.lower() == "title":
                own[name] = 0
            if _attr(st, "parent-style-name"):
                parent[name] = _attr(st, "parent-style-name")
    levels: dict[str, int] = {}
    for name in set(parent) | set(own):
        seen, cur = set(), name
        while cur not in own and cur in parent and cur not in seen:
            seen.add(cur)
            cur = parent[cur]
        if cur in own:
            levels[name] = own[cur]
    return levels


def _inline(el: Element, notes: list[str], skip_notes: bool) -> str:
    """A paragraph's text in order (spaces, tabs and line breaks as spaces); its footnotes go to `notes`."""
    def instead(child: Element) -> Optional[str]:
        name = local(child.tag)
        if name in ("s", "tab", "line-break"):
            return " "
        if name == "note":
            body = next((c for c in child if local(c.tag) == "note-body"), None)
            if body is not None and not skip_notes:
                notes.extend(t for t in (_inline(p, notes, skip_notes) for p in body.iter()
                                         if local(p.tag) in ("p", "h")) if t)
            return ""
        if name in ("desc", "title") and child.tag.startswith(SVG):  # an image's description, not text
            return ""
        return "" if name in SKIPPED or name == "ruby-text" else None

    return safexml.inline_text(el, instead)


def _blocks(body: Element, levels: dict[str, int], skip_notes: bool) -> tuple[list[Block], Optional[str]]:
    """The text body's blocks in reading order, and a paragraph in the Title style (the document's title)."""
    blocks: list[Block] = []
    title = None
    stack = [(iter(body), False)]  # (children, inside a table of contents)
    while stack:
        el = next(stack[-1][0], None)
        if el is None:
            stack.pop()
            continue
        in_toc, name = stack[-1][1], local(el.tag)
        if name in ("p", "h"):
            notes: list[str] = []
            text = _inline(el, notes, skip_notes)
            level = levels.get(_attr(el, "style-name") or "")
            if name == "h":
                outline = _attr(el, "outline-level") or ""
                level = int(outline) if outline.isdigit() else (level or 1)
            block = Block("toc", text) if in_toc else styled_block(text, level)
            if block is None:
                title = title or text
            elif text:
                blocks.append(block)
            blocks.extend(Block("footnote", n) for n in notes)
        elif name in TOC:
            stack.append((iter(el), True))
        elif name in CONTAINERS:
            stack.append((iter(el), in_toc))
    return blocks, title


def _metadata(meta: Optional[Element]) -> dict[str, str]:
    found: dict[str, str] = {}
    if meta is None:
        return found
    for el in meta.iter():
        name, text = local(el.tag), " ".join((el.text or "").split())
        if text and name in ("title", "creator", "initial-creator", "language"):
            found.setdefault(name, text)
    return found


def load_odt(data: bytes, options) -> Document:
    """Read an OpenDocument text held in memory into a Document."""
    z = SafeZip(data, "ODT", options.max_uncompressed_bytes, options.max_compression_ratio)
    try:
        _check_package(z)
        content = _xml(z, "content.xml")
        body = content.find(f"{OFFICE}body/{OFFICE}text")
        if body is None:
            raise IngestError("The ODT file's content.xml has no text body; it is damaged or not a text document.")
        levels = _styles(_xml(z, "styles.xml"), content)
        blocks, style_title = _blocks(body, levels, options.skip_footnotes)
        promoted, chapters = build_chapters(blocks, options, promote_title=style_title is None)
        if not chapters:
            raise IngestError("The ODT file contains no readable text.")
        meta = _metadata(_xml(z, "meta.xml"))
        return Document(chapters, title=meta.get("title") or style_title or promoted,
                        author=meta.get("initial-creator") or meta.get("creator"), language=meta.get("language"),
                        source_format="odt")
    finally:
        z.close()
