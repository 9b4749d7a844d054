"""A small writer of Kindle books for the tests (no sample can be downloaded here), written from the format's
public description: a Palm database whose record 0 holds the PalmDOC header, a MOBI header and EXTH
metadata, then text records.

What it covers: old MOBI (version 6, HTML-like markup with <mbp:pagebreak/>) and KF8 (version 8: XHTML
skeletons and fragments one after another in the first flow, a CSS flow after it, both listed by an FDST
record), alone (.azw3) or joined (kindlegen's .mobi: the old part, a BOUNDARY record, the KF8 part, EXTH 121
pointing at it); text records of 4096 bytes stored plainly, PalmDOC-compressed (literals, runs of escaped
bytes, space pairs and back references) or HUFF/CDIC-compressed (codes of 8 and of 9 bits, so both the
final and the longer-code lookups are used, and a phrase that is itself compressed); trailing entries (the
multibyte overlap of a UTF-8 character cut by the record boundary, and an indexing entry) after each
record; EXTH title, author, language and cover; an encryption type for DRM. It does not write INDX records
(the NCX, skeleton and fragment indexes), which the reader does not use.
"""
from __future__ import annotations

import struct

RECORD = 4096
NULL = 0xFFFFFFFF
JPEG = b"\xff\xd8\xff\xe0" + bytes(64)


def palmdoc_compress(data: bytes) -> bytes:
    """Greedy LZ77 in PalmDOC's codes (back references of 3-10 bytes up to 2047 back)."""
    out = bytearray()
    i = 0
    while i < len(data):
        best, best_at = 0, 0
        for at in range(max(0, i - 2047), i):
            n = 0
            while n < 10 and i + n < len(data) and data[at + n] == data[i + n]:
                n += 1
            if n > best:
                best, best_at = n, at
        c = data[i]
        if best >= 3:
            pair = ((i - best_at) << 3) | (best - 3)
            out += bytes((0x80 | (pair >> 8), pair & 0xFF))
            i += best
        elif c == 0x20 and i + 1 < len(data) and 0x40 <= data[i + 1] < 0x80:
            out.append(data[i + 1] ^ 0x80)
            i += 2
        elif c == 0 or 0x09 <= c < 0x80:
            out.append(c)
            i += 1
        else:  # bytes 1-8 and 128-255 go in an escaped run
            j = i
            while j < len(data) and j - i < 8 and not (data[j] == 0 or 0x09 <= data[j] < 0x80):
                j += 1
            out.append(j - i)
            out += data[i:j]
            i = j
    return bytes(out)


class Huffman:
    """A HUFF/CDIC code: phrases 0-255 are the single bytes (9-bit codes), phrases 256+ the given words
    (8-bit codes); the last word is stored compressed (made of the other phrases)."""

    def __init__(self, words: list[bytes]):
        self.words = words[:128]
        self.phrases = [(bytes([b]), True) for b in range(256)] + [(w, True) for w in self.words]
        last = len(self.phrases) - 1
        self.phrases[last] = (self._encode(self.words[-1], use_words=False), False)

    def _code(self, number: int) -> tuple[int, int]:
        return (511 - number, 9) if number < 256 else (383 - number, 8)

    def _encode(self, data: bytes, use_words: bool = True) -> bytes:
        bits, count, i = 0, 0, 0
        while i < len(data):
            for k, w in enumerate(self.words if use_words else []):
                if data.startswith(w, i):
                    code, n, i = *self._code(256 + k), i + len(w)
                    break
            else:
                code, n, i = *self._code(data[i]), i + 1
            bits, count = (bits << n) | code, count + n
        pad = -count % 8
        return ((bits << pad) | ((1 << pad) - 1)).to_bytes((count + pad) // 8, "big")

    def compress(self, data: bytes) -> bytes:
        return self._encode(data)

    def records(self) -> list[bytes]:
        # by a code's first byte: 0-127 start 8-bit codes (final; the largest is 383's), 128-255 9-bit ones
        # (not final: the tables by length decide)
        cache = [(383 << 8) | 0x80 | 8] * 128 + [9] * 128
        base = [0] * 64
        base[2 * 8], base[2 * 8 + 1] = 256, 511  # length 9: codes 256..511
        huff = b"HUFF" + struct.pack(">LLL", 24, 24, 24 + 1024) + bytes(8)
        huff = huff[:24] + struct.pack(">256L", *cache) + struct.pack(">64L", *base)
        body, offsets = b"", []
        for data, literal in self.phrases:
            offsets.append(2 * len(self.phrases) + len(body))
            body += struct.pack(">H", len(data) | (0x8000 if literal else 0)) + data
        cdic = b"CDIC" + struct.pack(">LLL", 16, len(self.phrases), 12) + struct.pack(
            f">{len(offsets)}H", *offsets) + body
        return [huff, cdic]


def _trailing(chunk: bytes, following: bytes, flags: int) -> bytes:
    out = b""
    if flags & 1:  # the bytes that complete a UTF-8 character cut at the record's end
        need = 0
        for back in range(1, 4):
            if back <= len(chunk) and chunk[-back] & 0xC0 == 0xC0:
                need = max(0, (2 if chunk[-back] < 0xE0 else 3 if chunk[-back] < 0xF0 else 4) - back)
                break
        out += following[:need] + bytes([need])
    if flags & 2:
        out += b"\x12\x34\x83"  # an indexing entry: two bytes of data and its size, 3, backward-encoded
    return out


def text_records(text: bytes, compression: int, flags: int, huffman: Huffman | None = None) -> list[bytes]:
    chunks = [text[i:i + RECORD] for i in range(0, len(text), RECORD)]
    encode = {1: bytes, 2: palmdoc_compress, 17480: huffman.compress if huffman else None}[compression]
    return [encode(c) + _trailing(c, text[(k + 1) * RECORD:], flags) for k, c in enumerate(chunks)]


def exth(title: str, author: str, language: str, cover: bool, boundary: int | None) -> bytes:
    items = [(503, title.encode()), (100, author.encode()), (524, language.encode())]
    items += [(201, struct.pack(">L", 0))] if cover else []
    items += [(121, struct.pack(">L", boundary))] if boundary is not None else []
    body = b"".join(struct.pack(">LL", kind, 8 + len(v)) + v for kind, v in items)
    data = b"EXTH" + struct.pack(">LL", 12 + len(body), len(items)) + body
    return data + bytes(-len(data) % 4)


def header_record(text_len: int, n_text: int, version: int, compression: int = 2, encryption: int = 0,
                  flags: int = 3, first_image: int = NULL, huff: tuple = (NULL, 0), fdst: tuple = (NULL, 0),
                  meta: bytes = b"", name: bytes = b"Full Name") -> bytes:
    length = 264 if version >= 8 else 232
    head = struct.pack(">HHLHHHH", compression, 0, text_len, n_text, RECORD, encryption, 0)
    mobi = bytearray(length)
    struct.pack_into(">4sLLLLL", mobi, 0, b"MOBI", length, 2, 65001, 1234, version)
    mobi[24:64] = b"\xff" * 40
    name_at = 16 + length + len(meta)
    struct.pack_into(">LLLL", mobi, 64, n_text + 1, name_at, len(name), 9)
    struct.pack_into(">LLLL", mobi, 92, first_image, huff[0], huff[1], 0)
    struct.pack_into(">L", mobi, 112, 0x50 if meta else 0)
    struct.pack_into(">LL", mobi, 176, *fdst)
    struct.pack_into(">L", mobi, 224, flags)
    return head + bytes(mobi) + meta + name + bytes(4)


def palmdb(records: list[bytes], name: bytes = b"Test_Book", kind: bytes = b"BOOKMOBI") -> bytes:
    head = name[:31].ljust(32, b"\0") + bytes(28) + kind + struct.pack(">LLH", 0, 0, len(records))
    at = len(head) + 8 * len(records) + 2
    table = b""
    for i, rec in enumerate(records):
        table += struct.pack(">LL", at, 2 * i)
        at += len(rec)
    return head + table + b"\0\0" + b"".join(records)


def mobi_book(html: str, version: int = 6, compression: int = 2, encryption: int = 0, flags: int = 3,
              title: str = "Zoë's Kindle Book", author: str = "Ann Author", language: str = "de",
              css: str = "", joint_with: str | None = None) -> bytes:
    """A whole book: `html` as version 6 or 8 (with `css` as KF8's second flow); `joint_with`: the old
    MOBI part's markup before a BOUNDARY record, `html` then being the KF8 part."""
    records: list[bytes] = [b""]
    if joint_with is not None:
        old = joint_with.encode()
        old_texts = text_records(old, compression, flags)
        records += old_texts + [JPEG, b"BOUNDARY"]
        boundary = len(records)
        records[0] = header_record(len(old), len(old_texts), 6, compression, encryption, flags,
                                   first_image=boundary - 2, meta=exth(title, author, language, True, boundary))
        records.append(b"")
    else:
        boundary = 0
    body = html.encode()
    text = body + css.encode()
    huffman = Huffman([b"the ", b"and ", b"<p>", b"</p>", b"Chapter ", b"the and "]) if compression == 17480 else None
    texts = text_records(text, compression, flags, huffman)
    base = boundary
    records += texts
    first_image = NULL
    huff = (NULL, 0)
    if huffman:
        huff = (len(records) - base, 2)
        records += huffman.records()
    if joint_with is None:
        first_image = len(records) - base
        records.append(JPEG)
    fdst = (NULL, 0)
    if version >= 8:
        fdst = (len(records) - base, 2)
        records.append(b"FDST" + struct.pack(">LL", 12, 2) + struct.pack(">4L", 0, len(body), len(body), len(text)))
    records.append(b"\xe9\x8e\r\n")
    meta = exth(title, author, language, joint_with is None, None)
    records[base] = header_record(len(text), len(texts), version, compression, encryption, flags, first_image,
                                  huff, fdst, meta)
    return palmdb(records)
