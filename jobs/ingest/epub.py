"""EPUB 2/3: container.xml -> OPF -> spine order, TOC titles (nav.xhtml / toc.ncx), metadata, cover."""
from __future__ import annotations

import logging
import posixpath
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from typing import Optional
from urllib.parse import unquote

from jobs.document import Document
from jobs.errors import IngestError, NotText
from jobs.ingest.blocks import PATTERN_LEVEL, Block, _key, build_chapters
from jobs.ingest.epub_package import package_map
from jobs.ingest.epub_sources import positioned_blocks
from jobs.ingest.html import decode_html, html_to_blocks
from jobs.ingest.safezip import SafeZip
from jobs.ingest.xmlscan import Scan

log = logging.getLogger(__name__)


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1].lower() if isinstance(tag, str) else ""


def _parse_xml(data: bytes, what: str) -> ET.Element:
    try:
        return ET.fromstring(data)
    except ET.ParseError as exc:
        raise IngestError(f"The EPUB's {what} is not valid XML ({exc}).") from None


# font obfuscation (IDPF, Adobe) is not DRM: the text stays readable
FONT_OBFUSCATION = {"http://www.idpf.org/2008/embedding", "http://ns.adobe.com/pdf/enc#rc"}
DRM_MESSAGE = ("EPUB is DRM-protected (encrypted); remove the DRM with the tool of your store/library "
               "and submit again")
# rights manifests of DRM schemes: Adobe ADEPT, Apple FairPlay, Readium LCP
DRM_FILES = ("META-INF/rights.xml", "META-INF/sinf.xml", "META-INF/license.lcpl")


def _check_drm(z: SafeZip) -> None:
    """Refuse an EPUB whose content is encrypted (a DRM rights file, or encryption.xml beyond font
    obfuscation); content encrypted without either is caught when a chapter is no text (_chapter_text)."""
    if any(z.has(name) for name in DRM_FILES):
        raise IngestError(DRM_MESSAGE)
    if not z.has("META-INF/encryption.xml"):
        return
    try:
        root = ET.fromstring(z.read("META-INF/encryption.xml"))
    except ET.ParseError:
        raise IngestError(DRM_MESSAGE) from None  # an unreadable encryption manifest: assume the worst
    for data in root.iter():
        if _local(data.tag) != "encrypteddata":
            continue
        method = next((el for el in data.iter() if _local(el.tag) == "encryptionmethod"), None)
        algorithm = (method.get("Algorithm") or "").strip().lower() if method is not None else ""
        if algorithm not in FONT_OBFUSCATION:
            raise IngestError(DRM_MESSAGE)


def _chapter_text(z: SafeZip, path: str) -> str:
    """A spine document as text. One that is binary noise is an encrypted book, not a binary file."""
    try:
        return decode_html(z.read(path))
    except NotText:
        raise IngestError(f"{DRM_MESSAGE} (its text {path!r} is not readable: encrypted)") from None


def _find_opf(z: SafeZip) -> str:
    if z.has("META-INF/container.xml"):
        root = _parse_xml(z.read("META-INF/container.xml"), "META-INF/container.xml")
        for el in root.iter():
            if _local(el.tag) == "rootfile" and el.get("full-path"):
                path = el.get("full-path")
                if z.has(path):
                    return path
                raise IngestError(f"The EPUB is missing its package document (OPF) {path!r}.")
    opfs = sorted(n for n in z.names if n.lower().endswith(".opf"))
    if not opfs:
        raise IngestError("The EPUB has no package document (OPF file); it is damaged or not an EPUB.")
    return opfs[0]


def _resolve(base_dir: str, href: str) -> str:
    href = unquote(href.split("#", 1)[0])
    return posixpath.normpath(posixpath.join(base_dir, href)) if href else ""


class _NavParser(HTMLParser):
    """Collect (href, text) of links inside <nav epub:type="toc"> (or any nav if none is typed)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.links: list[tuple[str, str, bool]] = []
        self._nav_depth = 0
        self._in_toc = False
        self._href: Optional[str] = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        if tag == "nav":
            self._nav_depth += 1
            self._in_toc = "toc" in a.get("epub:type", "").split() or "doc-toc" in a.get("role", "")
        elif tag == "a" and self._nav_depth:
            self._href, self._text = a.get("href", ""), []

    def handle_endtag(self, tag):
        if tag == "nav":
            self._nav_depth = max(0, self._nav_depth - 1)
        elif tag == "a" and self._href is not None:
            self.links.append((self._href, re.sub(r"\s+", " ", "".join(self._text)).strip(), self._in_toc))
            self._href = None

    def handle_data(self, data):
        if self._href is not None:
            self._text.append(data)


def _toc_titles(z: SafeZip, manifest: dict, opf_dir: str, ncx_id: Optional[str]) -> dict[str, str]:
    """Map content file path -> first TOC title pointing into it."""
    titles: dict[str, str] = {}
    nav = next((it for it in manifest.values() if "nav" in it["properties"]), None)
    if nav and z.has(nav["path"]):
        p = _NavParser()
        p.feed(decode_html(z.read(nav["path"])))
        links = p.links
        if any(t for _, _, t in links):
            links = [x for x in links if x[2]]
        nav_dir = posixpath.dirname(nav["path"])
        for href, text, _ in links:
            path = _resolve(nav_dir, href)
            if text and path:
                titles.setdefault(path, text)
    if titles:
        return titles
    ncx = manifest.get(ncx_id) if ncx_id else None
    ncx = ncx or next((it for it in manifest.values() if it["type"] == "application/x-dtbncx+xml"), None)
    if ncx and z.has(ncx["path"]):
        root = _parse_xml(z.read(ncx["path"]), "toc.ncx")
        ncx_dir = posixpath.dirname(ncx["path"])
        for point in root.iter():
            if _local(point.tag) != "navpoint":
                continue
            label = next((t for t in point.iter() if _local(t.tag) == "text"), None)
            content = next((c for c in point if _local(c.tag) == "content"), None)
            if label is not None and content is not None and content.get("src"):
                text = re.sub(r"\s+", " ", "".join(label.itertext())).strip()
                if text:
                    titles.setdefault(_resolve(ncx_dir, content.get("src")), text)
    return titles


def _file_blocks(blocks: list[Block], toc_title: Optional[str]) -> list[Block]:
    """Blocks of one spine file, with its chapter heading(s) as pattern-level headings."""
    headings = [b for b in blocks if b.kind == "heading"]
    top = min((b.level for b in headings), default=None)
    tops = [b for b in headings if b.level == top]
    out: list[Block] = []
    if len(tops) >= 2:  # several chapters in one file: split at its top heading level
        if toc_title and _key(tops[0].text) != _key(toc_title) and blocks and blocks[0] is not tops[0]:
            out.append(Block("heading", toc_title, PATTERN_LEVEL))
        for b in blocks:
            if b.kind == "heading":
                b = Block("heading", b.text, PATTERN_LEVEL, source=b.source) if b.level == top \
                    else Block("para", b.text, source=b.source)
            out.append(b)
        return out
    title = toc_title
    first_heading = next((b for b in blocks[:3] if b.kind == "heading"), None)
    if title is None and first_heading is not None:
        title = first_heading.text
    own = first_heading is not None and (first_heading is blocks[0] or toc_title is None
                                         or _key(toc_title) in _key(first_heading.text))
    if title:  # the file's own chapter heading, when it is one, holds the title's text
        out.append(Block("heading", title, PATTERN_LEVEL, source=first_heading.source if own else None))
    for b in blocks:
        if b.kind == "heading":
            if b is first_heading and own:
                continue  # the file's own chapter heading; the TOC title (or it) is the chapter title
            b = Block("para", b.text, source=b.source)
        out.append(b)
    return out


def _spine_blocks(z: SafeZip, path: str, skip_footnotes: bool) -> tuple[list[Block], dict, Optional[Scan]]:
    """A spine document's blocks, each with its source when the document is plain UTF-8 XML
    (`jobs.ingest.epub_sources`; else read as before, without positions), its metadata and its scan."""
    found = positioned_blocks(z.read(path), path, skip_footnotes)
    if found is not None:
        return found
    log.info("EPUB document %s is read without positions (not plain UTF-8 XML): it is not narrated", path)
    blocks, meta = html_to_blocks(_chapter_text(z, path), skip_footnotes)
    return blocks, meta, None


def load_epub(data: bytes, options) -> Document:
    """Read an EPUB held in memory (already size-checked) into a Document."""
    z = SafeZip(data, "EPUB", options.max_uncompressed_bytes, options.max_compression_ratio)
    try:
        _check_drm(z)
        opf_path = _find_opf(z)
        opf = _parse_xml(z.read(opf_path), "package document (OPF)")
        opf_dir = posixpath.dirname(opf_path)
        meta: dict[str, str] = {}
        cover_id = None
        manifest: dict[str, dict] = {}
        spine: list[tuple[str, bool]] = []
        ncx_id = None
        for el in opf.iter():
            tag = _local(el.tag)
            if tag in ("title", "creator", "language") and tag not in meta and (el.text or "").strip():
                meta[tag] = el.text.strip()
            elif tag == "meta" and el.get("name") == "cover":
                cover_id = el.get("content")
            elif tag == "item" and el.get("id") and el.get("href"):
                manifest[el.get("id")] = {
                    "path": _resolve(opf_dir, el.get("href")),
                    "type": (el.get("media-type") or "").lower(),
                    "properties": (el.get("properties") or "").split(),
                }
            elif tag == "spine":
                ncx_id = el.get("toc")
            elif tag == "itemref" and el.get("idref"):
                spine.append((el.get("idref"), el.get("linear", "yes") != "no"))
        if not spine:
            raise IngestError("The EPUB's package document has no spine (no reading order).")
        titles = _toc_titles(z, manifest, opf_dir, ncx_id)
        all_blocks: list[Block] = []
        language = meta.get("language")
        docs, heads, ids = {}, {}, set()  # what the package map needs of the documents read with positions
        for idref, linear in spine:
            item = manifest.get(idref)
            if item is None or not linear or "html" not in item["type"] and "xml" not in item["type"]:
                continue
            if options.skip_toc and "nav" in item["properties"]:
                continue
            if not z.has(item["path"]):
                log.warning("EPUB spine item missing: %s", item["path"])
                continue
            blocks, hmeta, found = _spine_blocks(z, item["path"], options.skip_footnotes)
            if found is not None:
                docs[item["path"]], heads[item["path"]] = idref, hmeta["head_end"]
                ids.update(t.attrs["id"] for t in found.tags if "id" in t.attrs)
            language = language or hmeta.get("language")
            if blocks:
                all_blocks.extend(_file_blocks(blocks, titles.get(item["path"])))
        _, chapters = build_chapters(all_blocks, options, promote_title=False)
        if not chapters:
            raise IngestError("The EPUB contains no readable text.")
        cover, cover_mime = _cover(z, manifest, cover_id)
        package = package_map(data, opf_path, z.read(opf_path), docs, heads, ids, z.names)
        return Document(
            chapters=chapters,
            title=meta.get("title"),
            author=meta.get("creator"),
            language=language,
            cover=cover,
            cover_mime=cover_mime,
            source_format="epub",
            package=package,
        )
    finally:
        z.close()


def _cover(z: SafeZip, manifest: dict, cover_id: Optional[str]) -> tuple[Optional[bytes], Optional[str]]:
    item = manifest.get(cover_id) if cover_id else None
    if item is None or not item["type"].startswith("image/"):
        item = next((it for it in manifest.values() if "cover-image" in it["properties"]), None)
    if item is None or not z.has(item["path"]):
        return None, None
    return z.read(item["path"]), item["type"] or None
