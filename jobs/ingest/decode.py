"""Bytes -> text: BOMs, binary sniffing and legacy-encoding detection (charset-normalizer)."""
from __future__ import annotations

import codecs
import logging
import unicodedata
from typing import Optional

from jobs.errors import IngestError, NotText
from text.normalize.cleanup import strip_ansi

log = logging.getLogger(__name__)

MAGIC = [
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"%PDF-", "a PDF"),
    (b"PK\x03\x04", "a zip archive"),
    (b"\x7fELF", "an executable"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"BZh", "a bzip2 archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7z archive"),
    (b"Rar!\x1a\x07", "a RAR archive"),
    (b"OggS", "an Ogg audio file"),
    (b"fLaC", "a FLAC audio file"),
    (b"ID3", "an MP3 file"),
    (b"RIFF", "a RIFF (WAV/AVI/WebP) file"),
    (b"SQLite format 3\x00", "an SQLite database"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an old Microsoft Office (.doc) file"),
]

BOMS = [
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
]

# Non-ASCII characters that plain Western-European text in cp1252 commonly contains.
WESTERN = set("àâäçéèêëîïôöùûüÿñæœßÀÂÄÇÉÈÊËÎÏÔÖÙÛÜŸÑÆŒáíóúýÁÍÓÚÝãõÃÕåÅøØìòÌÒ“”‘’–—…•€£¥©®°«»¡¿·§")


def sniff_binary(data: bytes) -> Optional[str]:
    """Return a description like "a PNG image" if ``data`` is clearly not text, else None."""
    for magic, what in MAGIC:
        if data.startswith(magic):
            return what
    return None


def _utf16_without_bom(data: bytes) -> Optional[str]:
    """Detect BOM-less UTF-16 (NULs on every other byte) and return the codec name."""
    sample = data[:4096]
    if len(sample) < 4:
        return None
    even = sample[0::2].count(0)
    odd = sample[1::2].count(0)
    half = len(sample) / 2
    if odd > 0.3 * half and even == 0:
        return "utf-16-le"
    if even > 0.3 * half and odd == 0:
        return "utf-16-be"
    return None


def _prefer_cp1252(data: bytes, detected: str) -> bool:
    """charset-normalizer often mislabels short Western text (cp1250/cp1257/...); check cp1252."""
    if detected.replace("_", "").lower() in ("cp1252", "windows1252") or len(data) > 2_000_000:
        return False
    try:
        text = data.decode("cp1252")
    except UnicodeDecodeError:
        return False
    letters = [c for c in text if c.isalpha()]
    non_ascii = [c for c in text if ord(c) > 127]
    if not letters or not non_ascii:
        return False
    high_letters = sum(1 for c in letters if ord(c) > 127)
    return high_letters < 0.3 * len(letters) and all(c in WESTERN for c in non_ascii)


def _check_text(text: str) -> None:
    if not text.strip():
        raise IngestError("The file contains no text (it is empty or only whitespace).")
    sample = strip_ansi(text[:200_000])  # colour codes of a captured console log are not binary noise
    bad = sum(
        1
        for c in sample
        if c == "\ufffd" or (unicodedata.category(c) == "Cc" and c not in "\t\n\r\f\v")
    )
    if bad > max(3, 0.02 * len(sample)):
        raise NotText("The file looks like a binary file (too many control characters), not text.")


def decode_bytes(data: bytes, encoding: Optional[str] = None) -> str:
    """Decode a text file's bytes; raise IngestError for empty, binary or undecodable input."""
    if not data:
        raise IngestError("The file is empty.")
    if encoding:
        try:
            text = data.decode(encoding)
        except (LookupError, UnicodeDecodeError) as exc:
            raise IngestError(f"The file could not be decoded as {encoding}: {exc}") from None
        _check_text(text)
        return text
    for bom, codec in BOMS:
        if data.startswith(bom):
            try:
                text = data.decode(codec)
            except UnicodeDecodeError:
                raise IngestError(f"The file starts with a {codec} byte-order mark but is not valid {codec}.") from None
            _check_text(text.lstrip("\ufeff"))
            return text.lstrip("\ufeff")
    what = sniff_binary(data)
    if what:
        raise NotText(f"The file looks like a binary file ({what}), not text.")
    if b"\x00" in data[:65536]:
        codec = _utf16_without_bom(data)
        if codec is None:
            raise NotText("The file looks like a binary file (it contains NUL bytes), not text.")
        try:
            text = data.decode(codec)
        except UnicodeDecodeError:
            raise NotText("The file looks like a binary file (it contains NUL bytes), not text.") from None
        _check_text(text)
        return text
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = _detect_legacy(data)
    _check_text(text)
    return text


def _detect_legacy(data: bytes) -> str:
    from charset_normalizer import from_bytes

    best = from_bytes(data).best()
    if best is None:
        raise NotText(
            "The file's text encoding could not be detected (no encoding fits its bytes); "
            "save it as UTF-8 and try again."
        )
    enc = best.encoding
    if _prefer_cp1252(data, enc):
        enc = "cp1252"
    log.info("detected text encoding %s", enc)
    return data.decode(enc, errors="replace")
