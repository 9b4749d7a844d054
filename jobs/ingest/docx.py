"""DOCX (Office Open XML) with the stdlib: paragraphs, Heading styles -> chapters, core metadata."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Optional

from jobs.document import Document
from jobs.errors import IngestError
from jobs.ingest.blocks import Block, build_chapters
from jobs.ingest.safezip import SafeZip
from jobs.ingest.text import styled_block

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
HEADING_NAME_RE = re.compile(r"^(?:heading|überschrift|titre|titolo|título)\s*(\d)$", re.I)


def _xml(z: SafeZip, name: str) -> Optional[ET.Element]:
    if not z.has(name):
        return None
    try:
        return ET.fromstring(z.read(name))
    except ET.ParseError as exc:
        raise IngestError(f"The DOCX file is damaged: {name} is not valid XML ({exc}).") from None


def _style_levels(styles: Optional[ET.Element]) -> dict[str, int]:
    """Map style id -> heading level (0 for the "Title" style)."""
    levels: dict[str, int] = {}
    if styles is None:
        return levels
    for st in styles.iter(f"{W}style"):
        sid = st.get(f"{W}styleId") or ""
        name_el = st.find(f"{W}name")
        name = (name_el.get(f"{W}val") if name_el is not None else "") or sid
        m = HEADING_NAME_RE.match(name) or HEADING_NAME_RE.match(sid)
        if m:
            levels[sid] = int(m.group(1))
        elif name.lower() == "title" or sid.lower() == "title":
            levels[sid] = 0
        else:
            ol = st.find(f"{W}pPr/{W}outlineLvl")
            if ol is not None and (ol.get(f"{W}val") or "").isdigit() and int(ol.get(f"{W}val")) < 9:
                levels[sid] = int(ol.get(f"{W}val")) + 1
    return levels


def _para_text(p: ET.Element) -> str:
    parts: list[str] = []
    for el in p.iter():
        tag = el.tag
        if tag == f"{W}t" and el.text:
            parts.append(el.text)
        elif tag in (f"{W}tab", f"{W}br", f"{W}cr"):
            parts.append(" ")
        elif tag == f"{W}noBreakHyphen":
            parts.append("-")
    return re.sub(r"\s+", " ", "".join(parts)).strip()


def load_docx(data: bytes, options) -> Document:
    """Read a .docx held in memory into a Document."""
    z = SafeZip(data, "DOCX", options.max_uncompressed_bytes, options.max_compression_ratio)
    try:
        body = _xml(z, "word/document.xml")
        if body is None:
            raise IngestError("The DOCX file has no word/document.xml; it is damaged or not a Word document.")
        levels = _style_levels(_xml(z, "word/styles.xml"))
        blocks: list[Block] = []
        doc_title = None
        for p in body.iter(f"{W}p"):
            text = _para_text(p)
            if not text:
                continue
            style = p.find(f"{W}pPr/{W}pStyle")
            sid = style.get(f"{W}val") if style is not None else None
            level = levels.get(sid) if sid else None
            if level is None and sid and HEADING_NAME_RE.match(sid):
                level = int(HEADING_NAME_RE.match(sid).group(1))
            outline = p.find(f"{W}pPr/{W}outlineLvl")
            if level is None and outline is not None and (outline.get(f"{W}val") or "").isdigit():
                level = int(outline.get(f"{W}val")) + 1 if int(outline.get(f"{W}val")) < 9 else None
            block = styled_block(text, level)
            if block is None:
                doc_title = doc_title or text
            else:
                blocks.append(block)
        promoted, chapters = build_chapters(blocks, options, promote_title=doc_title is None)
        if not chapters:
            raise IngestError("The DOCX file contains no readable text.")
        core = _xml(z, "docProps/core.xml")
        meta: dict[str, str] = {}
        if core is not None:
            for el in core.iter():
                name = el.tag.rsplit("}", 1)[-1]
                if name in ("title", "creator", "language") and (el.text or "").strip():
                    meta.setdefault(name, el.text.strip())
        return Document(
            chapters=chapters,
            title=meta.get("title") or doc_title or promoted,
            author=meta.get("creator"),
            language=meta.get("language"),
            source_format="docx",
        )
    finally:
        z.close()
