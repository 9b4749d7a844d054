"""One FLAC file made of other FLAC files' frames, without encoding the audio again (a book from its chapters).

    out = FlacSplice(fileobj, sample_rate, tags)   # the head: fLaC, STREAMINFO to come, the tags, padding
    out.append(path)                               # every frame of a FLAC file -> its samples
    out.close()                                    # STREAMINFO filled in; the file object stays open

A FLAC frame carries its place in the stream in its header (the frame's number in a fixed-blocksize stream) and
two checksums: a CRC-8 of the header, a CRC-16 of the whole frame. Frames taken from several files are made
one variable-blocksize stream (RFC 9639): each header gets the blocking-strategy bit and the number of its first
sample in the new stream, its CRC-8 is computed again, and its CRC-16 is updated from the old one without
reading the rest of the frame again (CRCs are linear: crc(H' + R) = crc(H + R) ^ shift(crc(H) ^ crc(H'), |R|)).
The audio bytes are copied as they are; the decoded samples are the files' samples one after the other.

Frames are found by their sync code (0xFFF8 / 0xFFF9) and kept only when the header that follows checks out:
its CRC-8, the frame number (or first sample) the stream is at, the file's sample rate and sample size; a
file's frames must add up to its STREAMINFO's samples and its last frame's CRC-16 must hold (`SpliceError`
otherwise). Files are read in blocks:
memory does not depend on their length. Mono or any channel count, as long as every file has the book's.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO, Optional

READ_BLOCK = 1 << 22  # bytes read from a file at a time
PADDING = 1 << 14  # room left for tags written later (chapter marks): no rewrite of the audio then
VENDOR = b"tts-appliance"
_BLOCKSIZES = {1: 192, 2: 576, 3: 1152, 4: 2304, 5: 4608, **{c: 256 << (c - 8) for c in range(8, 16)}}


class SpliceError(Exception):
    """A file that cannot be spliced (not FLAC, another sample rate or layout, frames that do not add up)."""


def _table(poly: int, width: int) -> list[int]:
    top, mask = 1 << (width - 1), (1 << width) - 1
    out = []
    for byte in range(256):
        c = byte << (width - 8)
        for _ in range(8):
            c = ((c << 1) ^ poly) & mask if c & top else (c << 1) & mask
        out.append(c)
    return out


_CRC8 = _table(0x07, 8)
_CRC16 = _table(0x8005, 16)
_SHIFT: list[tuple[int, ...]] = [tuple(1 << i for i in range(16))]  # [n][i] = x^i * x^(8n) mod P


def crc8(data: bytes) -> int:
    c = 0
    for b in data:
        c = _CRC8[c ^ b]
    return c


def crc16(data: bytes) -> int:
    c = 0
    for b in data:
        c = ((c << 8) & 0xFFFF) ^ _CRC16[(c >> 8) ^ b]
    return c


def _shift16(c: int, n: int) -> int:
    """c * x^(8n) mod FLAC's CRC-16 polynomial: the CRC-16 of c's message followed by n zero bytes."""
    while len(_SHIFT) <= n:
        _SHIFT.append(tuple(((v << 8) & 0xFFFF) ^ _CRC16[v >> 8] for v in _SHIFT[-1]))
    row, out, i = _SHIFT[n], 0, 0
    while c:
        if c & 1:
            out ^= row[i]
        c >>= 1
        i += 1
    return out


def coded_number(n: int) -> bytes:
    """FLAC's UTF-8-like coding of a frame or sample number (up to 36 bits)."""
    if n < 0x80:
        return bytes((n,))
    for length, first in ((2, 0xC0), (3, 0xE0), (4, 0xF0), (5, 0xF8), (6, 0xFC), (7, 0xFE)):
        if n < 1 << (5 * length + 1 if length < 7 else 36):
            out = [0x80 | ((n >> (6 * k)) & 0x3F) for k in range(length - 1)]
            head = first | (n >> (6 * (length - 1)))
            return bytes([head] + out[::-1])
    raise SpliceError(f"sample number {n} past FLAC's 36 bits")


def _header(data, pos: int, rate_code: int, size_bits: int) -> Optional[tuple[int, int, int, bool, int]]:
    """The frame header at `pos` -> (header length with its CRC-8, samples in the frame, its coded number, variable
    blocksize?, the coded number's length) when it is one of this stream's (sync, rate, sample size, coding,
    CRC-8); None otherwise."""
    end = len(data)
    if pos + 6 > end or data[pos] != 0xFF or data[pos + 1] & 0xFE != 0xF8:
        return None
    b2, b3 = data[pos + 2], data[pos + 3]
    if b2 & 0x0F != rate_code or (b3 >> 1) & 0x07 != size_bits or b3 & 1 or (b2 >> 4) == 0:
        return None
    first, i = data[pos + 4], pos + 5
    if first < 0x80:
        number, more = first, 0
    elif first >= 0xFE:
        number, more = 0, 6
    else:
        more = 0
        while first & (0x40 >> more):
            more += 1
        if more == 0:
            return None
        number = first & (0x3F >> more)
    if i + more > end:
        return None
    for k in range(more):
        b = data[i + k]
        if b & 0xC0 != 0x80:
            return None
        number = (number << 6) | (b & 0x3F)
    i += more
    code = b2 >> 4
    if code == 6:
        if i + 1 > end:
            return None
        blocksize, i = data[i] + 1, i + 1
    elif code == 7:
        if i + 2 > end:
            return None
        blocksize, i = ((data[i] << 8) | data[i + 1]) + 1, i + 2
    else:
        blocksize = _BLOCKSIZES[code]
    i += {12: 1, 13: 2, 14: 2}.get(rate_code, 0)
    if i + 1 > end or crc8(bytes(data[pos:i])) != data[i]:
        return None
    return i + 1 - pos, blocksize, number, bool(data[pos + 1] & 1), 1 + more


def _streaminfo(head: bytes) -> dict:
    (a, b) = struct.unpack(">HH", head[:4])
    x = int.from_bytes(head[10:18], "big")
    return {"min_block": a, "max_block": b, "rate": x >> 44, "channels": ((x >> 41) & 7) + 1,
            "bits": ((x >> 36) & 31) + 1, "samples": x & ((1 << 36) - 1)}


_RATE_CODES = {88200: 1, 176400: 2, 192000: 3, 8000: 4, 16000: 5, 22050: 6, 24000: 7, 32000: 8, 44100: 9,
               48000: 10, 96000: 11}
_SIZE_BITS = {8: 1, 12: 2, 16: 4, 20: 5, 24: 6, 32: 7}


class FlacSplice:
    """Frames of FLAC files appended into one FLAC stream written to `out` (a seekable binary file object)."""

    def __init__(self, out: BinaryIO, sample_rate: int, tags: dict, channels: int = 1, bits: int = 16):
        self.out, self.sample_rate, self.channels, self.bits = out, int(sample_rate), channels, bits
        self.samples = 0  # in the stream so far
        self.min_block, self.max_block, self.min_frame, self.max_frame = 1 << 16, 0, 1 << 24, 0
        self._last_block = self._last_size = 0  # the latest frame's (it counts for the minimums once another follows)
        comments = [f"{k.upper()}={v}".encode() for k, v in tags.items() if v]
        vc = struct.pack("<I", len(VENDOR)) + VENDOR + struct.pack("<I", len(comments))
        vc += b"".join(struct.pack("<I", len(c)) + c for c in comments)
        self._info_at = out.tell() + 8
        out.write(b"fLaC" + bytes((0,)) + (34).to_bytes(3, "big") + bytes(34))  # STREAMINFO, filled by `close`
        out.write(bytes((4,)) + len(vc).to_bytes(3, "big") + vc)  # VORBIS_COMMENT
        out.write(bytes((0x80 | 1,)) + PADDING.to_bytes(3, "big") + bytes(PADDING))  # PADDING, the last block

    def append(self, path: str | Path) -> int:
        """Every frame of the FLAC file at `path`, renumbered -> the samples it added."""
        with open(path, "rb") as f:
            info = self._read_head(f, path)
            if (info["rate"], info["channels"], info["bits"]) != (self.sample_rate, self.channels, self.bits):
                raise SpliceError(f"{Path(path).name}: {info['rate']} Hz, {info['channels']} channel(s), "
                                  f"{info['bits']} bits; the stream is {self.sample_rate} Hz, {self.channels}, "
                                  f"{self.bits}")
            added = self._frames(f, path, info)
        if added != info["samples"]:
            raise SpliceError(f"{Path(path).name}: its frames hold {added} samples, its STREAMINFO says "
                              f"{info['samples']}")
        return added

    def _read_head(self, f, path) -> dict:
        if f.read(4) != b"fLaC":
            raise SpliceError(f"{Path(path).name} is not a FLAC file")
        info, last = None, False
        while not last:
            h = f.read(4)
            if len(h) < 4:
                raise SpliceError(f"{Path(path).name}: its metadata ends early")
            last, kind, n = bool(h[0] & 0x80), h[0] & 0x7F, int.from_bytes(h[1:], "big")
            body = f.read(n)
            if kind == 0:
                info = _streaminfo(body)
        if info is None:
            raise SpliceError(f"{Path(path).name}: no STREAMINFO")
        return info

    def _frames(self, f, path, info: dict) -> int:
        rate_code = _RATE_CODES.get(self.sample_rate, 0)
        size_bits = _SIZE_BITS.get(self.bits, 0)
        data = bytearray(f.read(READ_BLOCK))
        eof = len(data) < READ_BLOCK
        pos, want, added, out = 0, 0, 0, bytearray()
        head = _header(data, pos, rate_code, size_bits) if data else None
        if data and head is None:
            raise SpliceError(f"{Path(path).name}: no FLAC frame where its audio begins")
        sync = bytes(data[:2])
        while head is not None:
            hlen, blocksize, number, variable, nlen = head
            if number != (added if variable else want):
                raise SpliceError(f"{Path(path).name}: frame {want} is numbered {number}")
            nxt, nhead = self._next(data, pos + hlen, sync, rate_code, size_bits, want + 1, added + blocksize)
            while nxt is None and not eof:  # the frame runs past what was read: read on
                more = f.read(READ_BLOCK)
                eof = len(more) < READ_BLOCK
                del data[:pos]
                pos = 0
                data += more
                nxt, nhead = self._next(data, hlen, sync, rate_code, size_bits, want + 1, added + blocksize)
            end = nxt if nxt is not None else len(data)
            if nxt is None and crc16(bytes(data[pos:end - 2])) != int.from_bytes(data[end - 2:end], "big"):
                raise SpliceError(f"{Path(path).name}: its last frame is cut short (or followed by other bytes)")
            self._put(out, data, pos, end, hlen, nlen, blocksize)
            added += blocksize
            want += 1
            pos, head = end, nhead
            if len(out) >= READ_BLOCK:
                self.out.write(out)
                out = bytearray()
        self.out.write(out)
        return added

    @staticmethod
    def _next(data, start: int, sync: bytes, rate_code: int, size_bits: int, frame: int, sample: int):
        """The next frame's start after `start` (its sync code `sync`: the file's blocking strategy) and its
        header, numbered `frame` (or `sample`, variable blocksize); (None, None) when none is in `data`."""
        i = start
        while True:
            i = data.find(sync, i)
            if i < 0:
                return None, None
            head = _header(data, i, rate_code, size_bits)
            if head is not None and head[2] == (sample if head[3] else frame):
                return i, head
            i += 1

    def _put(self, out: bytearray, data, start: int, end: int, hlen: int, nlen: int, blocksize: int) -> None:
        """The frame data[start:end] (its header `hlen` bytes, its number `nlen` of them) renumbered as a
        variable-blocksize frame at `self.samples`, onto `out`."""
        if end - start < hlen + 2:
            raise SpliceError("a FLAC frame shorter than its header")
        old = bytes(data[start:start + hlen])
        rest_head = old[4 + nlen:hlen - 1]  # the blocksize and rate bytes that follow the number
        new = bytes((0xFF, 0xF9, old[2], old[3])) + coded_number(self.samples) + rest_head
        new += bytes((crc8(new),))
        body = end - start - hlen - 2  # the frame's bytes after its header, before its CRC-16
        crc = (data[end - 2] << 8) | data[end - 1]
        crc ^= _shift16(crc16(old) ^ crc16(new), body)
        out += new
        out += data[start + hlen:end - 2]
        out += crc.to_bytes(2, "big")
        size = len(new) + body + 2
        if self._last_block:  # (the last frame's blocksize and size do not count for the minimum)
            self.min_block = min(self.min_block, self._last_block)
            self.min_frame = min(self.min_frame, self._last_size)
        self._last_block, self._last_size = blocksize, size
        self.max_block, self.max_frame = max(self.max_block, blocksize), max(self.max_frame, size)
        self.samples += blocksize

    def close(self) -> None:
        """Fill in STREAMINFO (the MD5 of the audio left at zero: not computed)."""
        end = self.out.tell()
        min_block = self.min_block if self.min_block < 1 << 16 else self._last_block
        min_frame = self.min_frame if self.min_frame < 1 << 24 else self._last_size
        x = (self.sample_rate << 44) | ((self.channels - 1) << 41) | ((self.bits - 1) << 36) | self.samples
        info = struct.pack(">HH", min_block, self.max_block)
        info += min_frame.to_bytes(3, "big") + self.max_frame.to_bytes(3, "big") + x.to_bytes(8, "big") + bytes(16)
        self.out.seek(self._info_at)
        self.out.write(info)
        self.out.seek(end)


class FlacSpliceFile:
    """A `FlacSplice` onto a new file at `path`, with an encoder's ending (`close(chapters)` -> codec, `abort`)
    for `jobs.assemble.StreamedFile`; the chapter marks are written after it (jobs.chapter_tags)."""

    def __init__(self, path: str | Path, sample_rate: int, tags: dict):
        self.f = open(path, "wb")
        self.splice = FlacSplice(self.f, sample_rate, tags)

    def append(self, path: str | Path) -> int:
        return self.splice.append(path)

    def close(self, chapters=()) -> str:
        try:
            self.splice.close()
        finally:
            self.f.close()
        return f"PCM_{self.splice.bits}"

    def abort(self) -> None:
        self.f.close()
