"""MOBI / AZW / AZW3 (KF8) / PRC books without DRM, with our own PalmDB reader (no converter, no temp files).

A Kindle book is a Palm database: record 0 holds the PalmDOC header (compression, text length, text
record count, encryption), the MOBI header and its EXTH metadata (title, author, language, cover, where a
KF8 part begins); the text records follow, each with trailing entries and compressed by PalmDOC or
HUFF/CDIC (`jobs.ingest.mobi_compress`). A joint file (kindlegen's .mobi, many .azw) holds an old MOBI part
and a KF8 part after a BOUNDARY record: the KF8 part is read. KF8's text is XHTML (its first flow, cut out
by the FDST record; the skeleton and fragments of each part follow one another in reading order); old
MOBI's is HTML-like markup with <mbp:pagebreak/> between sections. Both are read by `jobs.ingest.html`;
chapters come from their headings, else from chapter words ("Chapter 3") at the start of a section.
An encrypted book (encryption type not 0) is refused as DRM-protected, as EPUB's reader does.
"""
from __future__ import annotations

import logging
import re
from html import escape
import struct
from dataclasses import dataclass
from typing import Optional

from jobs.document import Document
from jobs.errors import IngestError
from jobs.ingest.blocks import PATTERN_LEVEL, Block, _key, build_chapters
from jobs.ingest.html import html_to_blocks
from jobs.ingest.mobi_compress import HuffCdic, damaged, palmdoc, strip_trailing
from jobs.ingest.mobi_links import CHAPTER_RE, drop_link_lists, old_mobi_markup
from jobs.ingest.text import chapter_heading

log = logging.getLogger(__name__)

DRM_MESSAGE = ("MOBI/AZW e-book is DRM-protected (encrypted); remove the DRM with the tool of your store/library "
               "and submit again")
NULL = 0xFFFFFFFF
PAGEBREAK = re.compile(r"<mbp:pagebreak\s*/?>", re.I)
IMAGE_MIME = ((b"\xff\xd8\xff", "image/jpeg"), (b"\x89PNG\r\n\x1a\n", "image/png"), (b"GIF8", "image/gif"))
OTHER_KINDS = ((b"TPZ", "a Kindle Topaz book"), (b"\xeaDRMION\xee", "a DRM-protected Kindle KFX book"),
               (b"CONT\x02\x00", "a Kindle KFX book"))


def _records(data: bytes) -> list[bytes]:
    """The Palm database's records (the file's structure checked: a cut file is named as one)."""
    kind = next((what for magic, what in OTHER_KINDS if data.startswith(magic)), None)
    if kind:
        drm = "DRM-protected" in kind
        raise IngestError(f"The file is {kind}, not MOBI/AZW3; " + (
            "remove the DRM with the tool of your store/library and submit again" if drm
            else "convert it to AZW3, EPUB or DOCX and submit that"))
    if len(data) < 78 or data[60:68] not in (b"BOOKMOBI", b"TEXtREAd"):
        raise IngestError("The file is not a MOBI/AZW3 e-book (no Mobipocket or PalmDOC header); it is damaged "
                          "or another format: submit it with the ending of its real format.")
    (count,) = struct.unpack_from(">H", data, 76)
    if len(data) < 78 + 8 * count:
        raise IngestError("The MOBI/AZW3 file is truncated (its record list is cut short); get a complete copy.")
    starts = [struct.unpack_from(">L", data, 78 + 8 * i)[0] for i in range(count)] + [len(data)]
    if any(b < a for a, b in zip(starts, starts[1:])) or (count and starts[0] < 78 + 8 * count):
        raise IngestError("The MOBI/AZW3 file is truncated or damaged (its records lie outside the file); "
                          "get a complete copy.")
    return [data[a:b] for a, b in zip(starts, starts[1:])]


@dataclass
class _Header:
    """What record 0 (or a KF8 part's header record) says; record numbers are absolute."""

    base: int
    compression: int
    text_length: int
    text_records: int
    encryption: int
    version: int = 0
    encoding: int = 1252
    first_image: int = NULL
    huff: tuple[int, int] = (NULL, 0)
    extra_flags: int = 0
    fdst: int = NULL
    exth: Optional[dict] = None
    full_name: str = ""


def _header(records: list[bytes], base: int) -> _Header:
    rec = records[base]
    if len(rec) < 16:
        raise IngestError("The MOBI/AZW3 file is truncated (its header record is cut short); get a complete copy.")
    compression, text_length, text_records, _, encryption = struct.unpack_from(">HxxLHHH", rec, 0)
    h = _Header(base, compression, text_length, text_records, encryption)
    if rec[16:20] != b"MOBI":
        h.encryption = 0  # a plain PalmDOC book: those two bytes are its reading position
        return h
    length, _, h.encoding, _, h.version = struct.unpack_from(">LLLLL", rec, 20)
    if len(rec) < 16 + length:
        raise IngestError("The MOBI/AZW3 file is truncated (its MOBI header is cut short); get a complete copy.")

    def field(at: int, fmt: str, default):
        """A header field at offset `at` of the record, where the header is long enough to hold it."""
        return struct.unpack_from(fmt, rec, at) if at + struct.calcsize(fmt) <= 16 + length else default

    def rel(n: int) -> int:  # record numbers in the header count from the header's own record
        return n if n == NULL else n + base

    name_at, name_len = field(84, ">LL", (0, 0))
    h.full_name = rec[name_at:name_at + name_len].decode(_codec(h.encoding), "replace")
    h.first_image = rel(field(108, ">L", (NULL,))[0])
    huff, huff_count = field(112, ">LL", (NULL, 0))
    h.huff = (rel(huff), huff_count)
    h.extra_flags = field(240, ">L", (0,))[0] & 0xFFFF
    fdst, fdst_count = field(192, ">LL", (NULL, 0)) if h.version >= 8 else (NULL, 0)
    h.fdst = rel(fdst) if fdst_count > 1 else NULL
    if field(128, ">L", (0,))[0] & 0x40:
        h.exth = _exth(rec[16 + length:])
    return h


def _exth(data: bytes) -> dict:
    """EXTH records by type (a type given several times: its values in order)."""
    found: dict[int, list[bytes]] = {}
    if data[:4] != b"EXTH" or len(data) < 12:
        return found
    _, count = struct.unpack_from(">LL", data, 4)
    pos = 12
    for _ in range(count):
        if pos + 8 > len(data):
            break
        kind, size = struct.unpack_from(">LL", data, pos)
        if size < 8:
            break
        found.setdefault(kind, []).append(data[pos + 8:pos + size])
        pos += size
    return found


def _codec(encoding: int) -> str:
    return "utf-8" if encoding == 65001 else "cp1252"


def _text(records: list[bytes], h: _Header, limit: int) -> bytes:
    """The book's text records, trailing entries removed, decompressed and joined."""
    last = h.base + h.text_records
    if last >= len(records):
        raise IngestError("The MOBI/AZW3 file is truncated (some of its text records are missing); "
                          "get a complete copy.")
    if h.compression == 1:
        decode = bytes
    elif h.compression == 2:
        decode = palmdoc
    elif h.compression == 17480:
        first, count = h.huff
        if first == NULL or first + count > len(records) or count < 1:
            raise damaged("its HUFF/CDIC records are missing")
        decode = HuffCdic(records[first], records[first + 1:first + count]).unpack
    else:
        raise IngestError(f"The MOBI/AZW3 file uses an unknown compression ({h.compression}); convert it to EPUB.")
    out = bytearray()
    for rec in records[h.base + 1:last + 1]:
        out += decode(strip_trailing(rec, h.extra_flags))
        if len(out) > limit:
            raise IngestError(f"The MOBI/AZW3 file's text would expand beyond {limit >> 20} MB; refusing to read it.")
    return bytes(out[:h.text_length])


def _first_flow(records: list[bytes], h: _Header, text: bytes) -> bytes:
    """KF8: the text's first flow (the XHTML; later flows are CSS and SVG), by the FDST record."""
    if h.fdst == NULL or h.fdst >= len(records) or records[h.fdst][:4] != b"FDST":
        return text
    rec = records[h.fdst]
    at, count = struct.unpack_from(">LL", rec, 4)
    if count < 1 or at + 8 > len(rec):
        return text
    start, end = struct.unpack_from(">LL", rec, at)
    return text[start:end]


def _kf8_part(records: list[bytes], h: _Header) -> _Header:
    """The KF8 part of a joint file (after its BOUNDARY record), else `h` itself."""
    boundary = (h.exth or {}).get(121)
    if h.version >= 8 or not boundary or len(boundary[0]) < 4:
        return h
    (at,) = struct.unpack(">L", boundary[0][:4])
    if 0 < at < len(records) and records[at - 1][:8] == b"BOUNDARY":
        kf8 = _header(records, at)
        if kf8.encryption:
            raise IngestError(DRM_MESSAGE)
        return kf8
    return h


def _blocks(html: str, skip_footnotes: bool, titles: list[str]) -> list[Block]:
    """The book's blocks (old MOBI's sections between page breaks one after another). Where the book's table
    of contents said a chapter starts (a `CHAPTER_RE` marker, its title in `titles`), it starts, its first
    paragraph taken as its heading when it says the title. In a book without either, a short paragraph of
    chapter words ("Chapter 3", "Epilogue") starts a chapter."""
    if titles:
        pieces = CHAPTER_RE.split(html)  # text, chapter number, text, ...
        out = _blocks(pieces[0], skip_footnotes, []) if pieces[0].strip() else []
        for number, part in zip(pieces[1::2], pieces[2::2]):
            found = _blocks(part, skip_footnotes, [])
            title = titles[int(number)]
            if found and found[0].kind in ("para", "heading") and _key(found[0].text) == _key(title):
                found = found[1:]
            out += [Block("heading", title, PATTERN_LEVEL)] + [b if b.kind != "heading" else
                                                               Block("para", b.text) for b in found]
        return out
    sections = [html_to_blocks(part, skip_footnotes)[0] for part in PAGEBREAK.split(html)]
    if any(b.kind == "heading" for s in sections for b in s):
        return [b for s in sections for b in s]
    out: list[Block] = []
    for section in sections:
        for b in section:
            if b.kind == "para" and len(b.text) < 90 and chapter_heading(b.text):
                b = Block("heading", b.text, PATTERN_LEVEL)
            out.append(b)
    return out


def _meta(h: _Header, records: list[bytes]) -> dict:
    exth, codec = h.exth or {}, _codec(h.encoding)

    def text(kind: int) -> Optional[str]:
        return next((v.decode(codec, "replace").strip() for v in exth.get(kind, [])), None) or None

    authors = [v.decode(codec, "replace").strip() for v in exth.get(100, [])]
    meta = {"title": text(503) or h.full_name.strip() or None, "author": "; ".join(a for a in authors if a) or None,
            "language": text(524), "cover": None, "cover_mime": None}
    cover = exth.get(201, [b""])[0]
    if len(cover) == 4 and h.first_image != NULL:
        at = h.first_image + struct.unpack(">L", cover)[0]
        image = records[at] if at < len(records) else b""
        meta["cover_mime"] = next((mime for magic, mime in IMAGE_MIME if image.startswith(magic)), None)
        meta["cover"] = image if meta["cover_mime"] else None
    return meta


def load_mobi(data: bytes, options) -> Document:
    """Read a MOBI/AZW/AZW3/PRC book held in memory into a Document."""
    records = _records(data)
    if not records:
        raise IngestError("The MOBI/AZW3 file holds no records; it is damaged or empty.")
    first = _header(records, 0)
    if first.encryption:
        raise IngestError(DRM_MESSAGE)
    h = _kf8_part(records, first)
    text = _text(records, h, options.max_uncompressed_bytes)
    kf8 = h.version >= 8
    if kf8:
        text = _first_flow(records, h, text)
    titles: list[str] = []
    if not kf8 and data[60:68] != b"TEXtREAd":
        text, titles = old_mobi_markup(text, _codec(h.encoding))
    markup = text.decode(_codec(h.encoding), "replace")
    if data[60:68] == b"TEXtREAd":  # plain PalmDOC: text, not markup
        markup = "".join(f"<p>{escape(part)}</p>" for part in re.split(r"\n\s*\n", markup))
    if kf8:
        markup = drop_link_lists(markup)
    _, chapters = build_chapters(_blocks(markup, options.skip_footnotes, titles), options, promote_title=False)
    if not chapters:
        raise IngestError("The MOBI/AZW3 book contains no readable text.")
    meta = _meta(h, records)
    if meta["cover"] is None and h is not first:  # a joint file's images may belong to its old part
        old = _meta(first, records)
        meta["cover"], meta["cover_mime"] = old["cover"], old["cover_mime"]
    return Document(chapters, title=meta["title"] or data[:32].split(b"\0")[0].decode("latin-1") or None,
                    author=meta["author"], language=meta["language"], cover=meta["cover"],
                    cover_mime=meta["cover_mime"], source_format="azw3" if kf8 else "mobi")
