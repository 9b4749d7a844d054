"""The text record codecs of MOBI/AZW3 books: trailing entries, PalmDOC (LZ77) and HUFF/CDIC (Huffman).

Written from the format's public description (MobileRead's MOBI page). Every decoder here bounds what it
produces, so a damaged or hostile record cannot expand without limit or loop: it fails with
:class:`jobs.errors.IngestError` saying the book is damaged.
"""
from __future__ import annotations

import struct

from jobs.errors import IngestError

MAX_RECORD_OUT = 1 << 16  # a text record holds 4096 bytes of text; far more is a damaged record
MAX_NESTING = 32  # CDIC phrases made of phrases


def damaged(what: str) -> IngestError:
    return IngestError(f"The MOBI/AZW3 file is damaged ({what}); get a fresh copy of the book or convert it to EPUB.")


def _backward_varint(record: bytes) -> int:
    """The size at the end of a trailing entry: 7 bits a byte, the first byte of the number marked by 0x80."""
    value = 0
    for byte in record[-4:]:
        if byte & 0x80:
            value = 0
        value = (value << 7) | (byte & 0x7F)
    return value


def strip_trailing(record: bytes, flags: int) -> bytes:
    """A text record without the trailing entries its MOBI header's extra-data flags announce: entries of
    bits 1-15 (each <data><size>) at the very end, then the multibyte-overlap bytes of bit 0."""
    for bit in range(15, 0, -1):
        if flags & (1 << bit):
            size = _backward_varint(record)
            if size > len(record):
                raise damaged("a text record's trailing entry is longer than the record")
            record = record[:len(record) - size]
    if flags & 1 and record:
        overlap = (record[-1] & 3) + 1
        record = record[:len(record) - overlap]
    return record


def palmdoc(data: bytes) -> bytes:
    """PalmDOC (LZ77) decompression of one record."""
    out = bytearray()
    i, n = 0, len(data)
    while i < n:
        c = data[i]
        i += 1
        if 1 <= c <= 8:  # the next c bytes as they are
            out += data[i:i + c]
            i += c
        elif c < 0x80:  # a byte standing for itself
            out.append(c)
        elif c >= 0xC0:  # a space and a character
            out += bytes((0x20, c ^ 0x80))
        else:  # a distance (11 bits) and a length (3 bits + 3) back into what was written
            if i >= n:
                break
            pair = (c << 8) | data[i]
            i += 1
            distance, length = (pair >> 3) & 0x7FF, (pair & 7) + 3
            if distance == 0 or distance > len(out):
                raise damaged("a PalmDOC reference points before the start of its record")
            start = len(out) - distance
            for k in range(length):  # may run into the bytes it writes
                out.append(out[start + k])
        if len(out) > MAX_RECORD_OUT:
            raise damaged("a text record expands beyond any real record")
    return bytes(out)


class HuffCdic:
    """HUFF/CDIC decompression: a HUFF record (code tables) and CDIC records (the phrases codes stand for)."""

    def __init__(self, huff: bytes, cdics: list[bytes]):
        if huff[:8] != b"HUFF\x00\x00\x00\x18" or len(huff) < 24:
            raise damaged("its HUFF record is not one")
        cache_at, base_at = struct.unpack_from(">LL", huff, 8)
        try:
            cache = struct.unpack_from(">256L", huff, cache_at)
            base = struct.unpack_from(">64L", huff, base_at)
        except struct.error:
            raise damaged("its HUFF record is cut short") from None
        # per first byte of a code: (code length, whether that length is final, the largest code of it)
        self.first = [(v & 0x1F, bool(v & 0x80), (((v >> 8) + 1) << (32 - (v & 0x1F))) - 1) for v in cache]
        if any(length == 0 or (length <= 8 and not final) for length, final, _ in self.first):
            raise damaged("its HUFF code table is invalid")
        self.lowest = [0] + [base[2 * k] << (31 - k) for k in range(32)]  # by code length 1..32
        self.highest = [0] + [((base[2 * k + 1] + 1) << (31 - k)) - 1 for k in range(32)]
        self.phrases: list = []  # (bytes, decoded?) per phrase number; None while being decoded
        for cdic in cdics:
            self._add_cdic(cdic)

    def _add_cdic(self, cdic: bytes) -> None:
        if cdic[:8] != b"CDIC\x00\x00\x00\x10" or len(cdic) < 16:
            raise damaged("a CDIC record is not one")
        total, bits = struct.unpack_from(">LL", cdic, 8)
        count = min(1 << min(bits, 16), total - len(self.phrases))
        try:
            for off in struct.unpack_from(f">{max(count, 0)}H", cdic, 16):
                (head,) = struct.unpack_from(">H", cdic, 16 + off)
                self.phrases.append((cdic[18 + off:18 + off + (head & 0x7FFF)], bool(head & 0x8000)))
        except struct.error:
            raise damaged("a CDIC record is cut short") from None

    def unpack(self, data: bytes, depth: int = 0) -> bytes:
        """One record (or phrase) decompressed."""
        if depth > MAX_NESTING:
            raise damaged("its HUFF phrases nest without end")
        total = len(data) * 8
        padded = data + bytes(8)
        out = bytearray()
        pos = 0
        while True:
            at = pos >> 3
            code = (int.from_bytes(padded[at:at + 5], "big") >> (8 - (pos & 7))) & 0xFFFFFFFF  # the next 32 bits
            length, final, highest = self.first[code >> 24]
            if not final:
                while length < 32 and code < self.lowest[length]:
                    length += 1
                highest = self.highest[length]
            pos += length
            if pos > total:
                return bytes(out)
            number = (highest - code) >> (32 - length)
            if not 0 <= number < len(self.phrases) or self.phrases[number] is None:
                raise damaged("a HUFF code names no phrase")
            phrase, done = self.phrases[number]
            if not done:
                self.phrases[number] = None  # a phrase made of itself is caught above
                phrase = self.unpack(phrase, depth + 1)
                self.phrases[number] = (phrase, True)
            out += phrase
            if len(out) > MAX_RECORD_OUT:
                raise damaged("a text record expands beyond any real record")
