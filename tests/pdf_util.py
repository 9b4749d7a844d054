"""A small PDF writer for the tests: pages of text lines in Helvetica, top-level bookmarks, an info dictionary;
a line given as (text, glyph) draws `glyph` inside a marked-content span whose /ActualText says `text` (what
LibreOffice and Chromium write for a glyph their font cannot map back to a character)."""
from __future__ import annotations

from typing import Union

Line = Union[str, tuple[str, str]]


def _string(text: str) -> bytes:
    return b"(" + text.encode("cp1252").replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)") + b")"


def _utf16(text: str) -> bytes:
    return b"<FEFF" + text.encode("utf-16-be").hex().upper().encode() + b">"


def _content(lines: list[Line]) -> bytes:
    out = [b"BT /F1 12 Tf 72 740 Td 16 TL"]
    for line in lines:
        if isinstance(line, tuple):
            text, glyph = line
            out.append(b"/Span <</ActualText " + _utf16(text) + b">> BDC " + _string(glyph) + b" Tj EMC T*")
        else:
            out.append(_string(line) + b" Tj T*")
    out.append(b"ET")
    return b"\n".join(out)


def pdf_bytes(pages: list[list[Line]], outline: list[tuple[str, int]], info: dict[str, str]) -> bytes:
    """A PDF of `pages` (lines each), `outline` [(title, page index)] and `info` ({"/Title": ...})."""
    n_pages = len(pages)
    first_page, first_content = 5, 5 + n_pages
    first_item = first_content + n_pages
    info_id = first_item + len(outline)
    objects: dict[int, bytes] = {
        1: b"<< /Type /Catalog /Pages 2 0 R /Outlines 4 0 R >>",
        2: b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % (first_page + i) for i in range(n_pages))
           + b"] /Count %d >>" % n_pages,
        3: b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
        4: b"<< /Type /Outlines /First %d 0 R /Last %d 0 R /Count %d >>" % (first_item, info_id - 1, len(outline)),
        info_id: b"<< " + b" ".join(k.encode() + b" " + _utf16(v) for k, v in info.items()) + b" >>",
    }
    for i, lines in enumerate(pages):
        data = _content(lines)
        objects[first_page + i] = (b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << "
                                   b"/F1 3 0 R >> >> /Contents %d 0 R >>" % (first_content + i))
        objects[first_content + i] = b"<< /Length %d >>\nstream\n" % len(data) + data + b"\nendstream"
    for k, (title, page) in enumerate(outline):
        links = b"".join((b" /Prev %d 0 R" % (first_item + k - 1) if k else b"",
                          b" /Next %d 0 R" % (first_item + k + 1) if k + 1 < len(outline) else b""))
        objects[first_item + k] = (b"<< /Title " + _utf16(title) + b" /Parent 4 0 R" + links
                                   + b" /Dest [%d 0 R /XYZ 0 740 0] >>" % (first_page + page))
    out = bytearray(b"%PDF-1.4\n")
    offsets = {}
    for number in sorted(objects):
        offsets[number] = len(out)
        out += b"%d 0 obj\n" % number + objects[number] + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offsets[n] for n in sorted(objects))
    out += b"trailer\n<< /Size %d /Root 1 0 R /Info %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1,
                                                                                         info_id, xref)
    return bytes(out)
