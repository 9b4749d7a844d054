"""A simple EPUB 3 of a document's chapters and paragraphs, for inputs that are no EPUB 3 of their own (txt,
md, html, docx, pdf; an EPUB 2): one XHTML file per chapter, its title a heading, each paragraph a `<p>`.

It is made when the job is queued and kept with it, with the same map an EPUB input gets from the sandboxed
reader (`jobs.document.EpubPackage`: where the package document takes new entries) and each paragraph's
source (`jobs.document.TextSource`: the bytes its text occupies), so the narration is then written the
same way for every input.
"""
from __future__ import annotations

import hashlib
import html
import io
import re
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from typing import Optional, Sequence

from jobs.document import Document, EpubPackage, TextRun, TextSource
from jobs.ingest.epub_package import PREFIX
from text.normalize.cleanup import cleanup
from text.tags import strip_tags

OPF = "OEBPS/content.opf"
CONTAINER = ('<?xml version="1.0" encoding="UTF-8"?>\n'
             '<container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">\n'
             f'  <rootfiles><rootfile full-path="{OPF}" media-type="application/oebps-package+xml"/></rootfiles>\n'
             '</container>\n')
COVER_TYPES = {"image/jpeg": "jpg", "image/png": "png", "image/gif": "gif"}
_NOT_XML = re.compile("[^\t\n\r -\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _text(value: str) -> str:
    """Text as it may stand in XML: no tags of ours, tidied, characters XML forbids dropped, escaped."""
    return html.escape(_NOT_XML.sub("", cleanup(strip_tags(value or ""))), quote=False)


def _attr(value: str) -> str:
    return html.escape(_NOT_XML.sub("", value or ""), quote=True)


@dataclass
class _File:
    """An XHTML file being written: its bytes so far, and the runs of text put in it."""

    parts: list[bytes] = field(default_factory=list)
    size: int = 0
    elements: int = 0

    def add(self, text: str) -> int:
        data = text.encode("utf-8")
        self.parts.append(data)
        self.size += len(data)
        return self.size - len(data)

    def run(self, tag: str, raw: str, path: str) -> Optional[TextSource]:
        """`<tag>raw</tag>` -> the source of its text (None when there is no text)."""
        self.elements += 1
        self.add(f"<{tag}>")
        start = self.add(raw)
        self.add(f"</{tag}>\n")
        if not raw.strip():
            return None
        return TextSource(path, (TextRun(start, start + len(raw.encode("utf-8")), self.elements, raw),))


def generate_epub(doc: Document, chapters: Sequence[tuple[str, list]], language: str, title: str,
                  author: Optional[str]) -> tuple[bytes, EpubPackage, dict]:
    """The EPUB of the job's `chapters` ([(title, segments)], the document's chapter of each in its segments'
    metadata `chapter_index`) -> (its bytes, its map, {(chapter_index, paragraph_index or None for the title):
    TextSource})."""
    lang = _attr(language or "und")
    files: dict[str, bytes] = {}
    sources: dict[tuple, TextSource] = {}
    heads: dict[str, int] = {}
    toc = []
    for n, (ch_title, segs) in enumerate(chapters, 1):
        ci = next((s.metadata.get("chapter_index") for s in segs if s.metadata.get("chapter_index") is not None), None)
        path, name = f"OEBPS/text/c{n:03d}.xhtml", _text(ch_title) or f"Chapter {n}"
        f = _File()
        f.add('<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE html>\n'
              f'<html xmlns="http://www.w3.org/1999/xhtml" xmlns:epub="http://www.idpf.org/2007/ops" '
              f'xml:lang="{lang}" lang="{lang}">\n<head>\n<meta charset="utf-8"/>\n<title>{name}</title>\n')
        heads[path] = f.add("</head>\n")
        f.add(f'<body>\n<section epub:type="chapter" role="doc-chapter" id="c{n:03d}">\n')
        title_source = f.run("h1", name, path)
        if ci is not None and title_source is not None:
            sources[(ci, None)] = title_source
        for pi, para in enumerate(doc.chapters[ci].paragraphs if ci is not None else []):
            found = f.run("p", _text(para), path)
            if found is not None:
                sources[(ci, pi)] = found
        f.add("</section>\n</body>\n</html>\n")
        files[path] = b"".join(f.parts)
        toc.append((path, name))
    cover = COVER_TYPES.get(doc.cover_mime or "") if doc.cover else None
    if cover:
        files[f"OEBPS/images/cover.{cover}"] = doc.cover
    files["OEBPS/nav.xhtml"] = _nav(toc, lang)
    opf, package = _opf(toc, lang, _text(title) or "Untitled", _text(author or ""), doc.cover_mime if cover else None)
    files[OPF] = opf
    package.heads = heads
    data = _zip(files)
    package.sha256 = hashlib.sha256(data).hexdigest()
    return data, package, sources


def _nav(toc: list[tuple[str, str]], lang: str) -> bytes:
    items = "".join(f'<li><a href="{path.removeprefix("OEBPS/")}">{name}</a></li>\n' for path, name in toc)
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE html>\n'
            '<html xmlns="http://www.w3.org/1999/xhtml" xmlns:epub="http://www.idpf.org/2007/ops" '
            f'xml:lang="{lang}" lang="{lang}">\n<head>\n<meta charset="utf-8"/>\n<title>Contents</title>\n</head>\n'
            '<body>\n<nav epub:type="toc" role="doc-toc" id="toc">\n'
            f'<h1>Contents</h1>\n<ol>\n{items}</ol>\n</nav>\n</body>\n</html>\n'
            ).encode("utf-8")


def _opf(toc: list[tuple[str, str]], lang: str, title: str, author: str,
         cover_mime: Optional[str]) -> tuple[bytes, EpubPackage]:
    modified = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    head = ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="uid" xml:lang="{lang}">\n'
            '  <metadata xmlns:dc="http://purl.org/dc/elements/1.1/">\n'
            f'    <dc:identifier id="uid">urn:uuid:{uuid.uuid4()}</dc:identifier>\n'
            f'    <dc:title>{title}</dc:title>\n' + (f'    <dc:creator>{author}</dc:creator>\n' if author else "")
            + f'    <dc:language>{lang}</dc:language>\n'
            f'    <meta property="dcterms:modified">{modified}</meta>\n')
    out = io.StringIO()
    out.write(head)
    package = EpubPackage(opf=OPF, prefix=PREFIX, accessibility={})  # it declares none: the narration adds them
    marks = {"metadata_end": out.tell()}
    out.write("  </metadata>\n  <manifest>\n"
              '    <item id="nav" href="nav.xhtml" media-type="application/xhtml+xml" properties="nav"/>\n')
    if cover_mime:
        out.write(f'    <item id="cover" href="images/cover.{COVER_TYPES[cover_mime]}" media-type="{cover_mime}" '
                  'properties="cover-image"/>\n')
    items = {}
    for n, (path, _) in enumerate(toc, 1):
        out.write(f'    <item id="c{n:03d}" href="{path.removeprefix("OEBPS/")}" media-type="application/xhtml+xml"')
        items[path] = out.tell()
        out.write("/>\n")
    marks["manifest_end"] = out.tell()
    spine = "".join(f'    <itemref idref="c{n:03d}"/>\n' for n in range(1, len(toc) + 1))
    out.write(f"  </manifest>\n  <spine>\n{spine}  </spine>\n</package>\n")
    text = out.getvalue()
    size = {k: len(text[:v].encode("utf-8")) for k, v in {**marks, **items}.items()}
    package.metadata_end, package.manifest_end = size["metadata_end"], size["manifest_end"]
    package.items = {path: size[path] for path in items}
    return text.encode("utf-8"), package


def _zip(files: dict[str, bytes]) -> bytes:
    """An EPUB container: `mimetype` first and stored, then META-INF/container.xml and `files`."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        z.writestr("META-INF/container.xml", CONTAINER, compress_type=zipfile.ZIP_DEFLATED)
        for name, data in files.items():
            z.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED)
    return buf.getvalue()
