"""A PDF's replacement text (/ActualText) honoured by pypdf's text extraction.

A PDF writer that draws a glyph it cannot map back to a character (a Chinese character in a font without it:
LibreOffice and Chromium, calibre's PDF engine, on a machine without CJK fonts) or one glyph for several
characters wraps it in a marked-content span `/Span <</ActualText (...)>> BDC ... EMC` that says the text. pypdf
reads the glyph's own mapping instead (every such glyph gives the same wrong character, or nothing). Here, in
memory only, each span that shows one glyph code is redrawn in a copy of its font whose ToUnicode map sends that
code to the span's text, so pypdf's extraction (spacing, lines and all) reads what the span says.
"""
from __future__ import annotations

import logging
from typing import Optional

try:
    from pypdf.generic import (ArrayObject, ByteStringObject, ContentStream, DecodedStreamObject, DictionaryObject,
                               NameObject)
except ImportError:  # only the PDF reader calls in here, and only once it has imported pypdf itself
    ArrayObject = ByteStringObject = ContentStream = DecodedStreamObject = DictionaryObject = NameObject = None

log = logging.getLogger(__name__)

SHOW = {b"Tj", b"TJ", b"'", b'"'}  # the text-showing operators
MAX_FONTS = 5000  # font copies made for one page at most (a page of distinct CJK characters has a few hundred)


def _actual_text(operands) -> Optional[str]:
    """The replacement text of a BDC's properties (an inline dictionary), else None."""
    props = operands[1] if len(operands) > 1 else None
    if not isinstance(props, DictionaryObject) or "/ActualText" not in props:
        return None
    value = props["/ActualText"]
    if isinstance(value, bytes):
        raw = bytes(value)
        return raw[2:].decode("utf-16-be", "replace") if raw.startswith(b"\xfe\xff") else raw.decode("latin-1")
    return str(value)


def _shown(operator: bytes, operands) -> Optional[bytes]:
    """The bytes a text-showing operation draws, when it is one string (a TJ of one string included)."""
    value = operands[-1] if operands else None
    if operator == b"TJ":
        strings = [v for v in value if isinstance(v, (str, bytes))] if isinstance(value, ArrayObject) else []
        value = strings[0] if len(strings) == 1 else None
    return _raw(value) if isinstance(value, (bytes, str)) else None


def _raw(value) -> bytes:
    """A string operand's bytes as the file holds them."""
    if isinstance(value, bytes):
        return bytes(value)
    return value.original_bytes if hasattr(value, "original_bytes") else value.encode("latin-1", "replace")


def _as_written(operands: list) -> list:
    """Operands with their strings as the bytes the file holds (pypdf would write a decoded string back in
    another encoding, and every glyph code would change)."""
    def raw(value):
        if isinstance(value, ArrayObject):
            return ArrayObject(raw(v) for v in value)
        if isinstance(value, str) and not isinstance(value, NameObject):
            return ByteStringObject(_raw(value))
        return value

    return [raw(v) for v in operands]


def _cmap(code: bytes, text: str) -> bytes:
    """A ToUnicode CMap that maps the one `code` to `text`."""
    hex_code, hex_text = code.hex().upper(), text.encode("utf-16-be").hex().upper()
    low, high = ("00" * len(code)), ("FF" * len(code))
    return (f"/CIDInit /ProcSet findresource begin 12 dict begin begincmap /CMapName /TTS-ActualText def "
            f"/CMapType 2 def 1 begincodespacerange <{low}> <{high}> endcodespacerange "
            f"1 beginbfchar <{hex_code}> <{hex_text}> endbfchar endcmap "
            "CMapName currentdict /CMap defineresource pop end end").encode("ascii")


class _Fonts:
    """The page's fonts and the copies made of them, one per (font, code, text)."""

    def __init__(self, fonts: DictionaryObject):
        self.fonts, self.copies = fonts, {}

    def copy(self, name: str, code: bytes, text: str) -> Optional[NameObject]:
        key = (name, code, text)
        if key in self.copies:
            return self.copies[key]
        font = self.fonts.get(name)
        font = font.get_object() if font is not None else None
        wide = font is not None and font.get("/Subtype") == "/Type0"
        if font is None or len(code) != (2 if wide else 1) or len(self.copies) >= MAX_FONTS:
            return None
        stream = DecodedStreamObject()
        stream.set_data(_cmap(code, text))
        twin = DictionaryObject(font)
        twin[NameObject("/ToUnicode")] = stream
        new = NameObject(f"/TTSActualText{len(self.copies)}")
        self.fonts[new] = twin
        self.copies[key] = new
        return new


def honour_actual_text(page, reader) -> bool:
    """Redraw `page`'s one-glyph /ActualText spans (in memory) so its extracted text is theirs; True if any."""
    contents = page.get_contents()
    if contents is None or b"/ActualText" not in contents.get_data():
        return False
    resources = page.get("/Resources")
    fonts = resources.get_object().get("/Font") if resources is not None else None
    if fonts is None:
        return False
    fonts = _Fonts(fonts.get_object())
    out: list = []
    span: Optional[list] = None  # an open ActualText span: [its text, its operations with the font of each]
    depth = 0  # marked content opened inside that span
    font, size, changed = None, None, False
    for operands, operator in ContentStream(contents, reader).operations:
        if operator == b"Tf" and len(operands) == 2:
            font, size = operands
        if span is None and operator == b"BDC" and _actual_text(operands):
            span = [_actual_text(operands), []]
            continue
        if span is not None and operator in (b"BDC", b"BMC"):
            depth += 1
        elif span is not None and operator == b"EMC":
            if depth == 0:
                changed |= _redraw(span, fonts, out)
                span = None
                continue
            depth -= 1
        (span[1] if span is not None else out).append((operands, operator, font, size))
    if span is not None:  # never closed: its operations as they were
        out.extend(span[1])
    if changed:
        new = ContentStream(None, reader)
        new.operations = [(_as_written(operands), operator) for operands, operator, _, _ in out]
        page[NameObject("/Contents")] = new
    return changed


def _redraw(span: list, fonts: _Fonts, out: list) -> bool:
    """Append a closed span to `out`: its one glyph drawn in a font copy that maps it to the span's text (True),
    or its operations as they were when it shows more than one glyph or its font is unknown (False)."""
    text, ops = span
    shows = [op for op in ops if op[1] in SHOW]
    twin = None
    if len(shows) == 1 and shows[0][2] is not None:
        operands, operator, font, size = shows[0]
        code = _shown(operator, operands)
        twin = fonts.copy(font, code, text) if code else None
    out.append(([NameObject("/Span"), DictionaryObject()], b"BDC", None, None))
    for op in ops:
        if twin is not None and op is shows[0]:
            out.append(([twin, op[3]], b"Tf", None, None))
            out.append(op)
            out.append(([op[2], op[3]], b"Tf", None, None))
        else:
            out.append(op)
    out.append(([], b"EMC", None, None))
    return twin is not None
