"""Unicode cleanup: control characters, odd spaces, ligatures, ellipses, dashes, whitespace."""
from __future__ import annotations

import re
import unicodedata

_TRANSLATE = {
    **{c: " " for c in (0x00A0, 0x2007, 0x202F, 0x2009, 0x200A, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2008, 0x205F, 0x1680, 0x3000)},
    0x00AD: None,  # soft hyphen
    0x200B: None, 0x200C: None, 0x200D: None, 0x2060: None, 0xFEFF: None,  # zero-width
    0x200E: None, 0x200F: None, 0x202A: None, 0x202B: None, 0x202C: None, 0x202D: None, 0x202E: None,
    0xFB00: "ff", 0xFB01: "fi", 0xFB02: "fl", 0xFB03: "ffi", 0xFB04: "ffl", 0xFB05: "st", 0xFB06: "st",
    0x2028: " ", 0x2029: " ", 0x2010: "-", 0x2011: "-", 0x2212: "-",
    0x2024: ".", 0x2025: "..", 0xFF05: "%",
}
# terminal escape sequences (colours, cursor moves, titles) as found in logs and captured console output:
# CSI (ESC [ or 0x9B ... final byte), OSC (ESC ] ... BEL or ESC \), other escapes (ESC, intermediates, final)
_ANSI_RE = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -/]*[0-~]")
_WS_RE = re.compile(r"\s+")
_ELLIPSIS_RE = re.compile(r"\.(?:\s?\.){2,}|…+")
_DOUBLE_DASH_RE = re.compile(r"\s*(?<!-)--(?!-)\s*")
_FULLWIDTH_DIGIT_RE = re.compile(r"[０-９]")


def strip_ansi(text: str) -> str:
    """Remove terminal (ANSI) escape sequences, which would otherwise be read out as "[31m"."""
    return _ANSI_RE.sub("", text) if "\x1b" in text or "\x9b" in text else text


def cleanup(text: str) -> str:
    """Make text safe and tidy for synthesis.

    Strips terminal escape sequences, NFC-normalizes, removes control and zero-width
    characters, maps exotic spaces to plain spaces, expands ligatures, turns ". . ." and
    "…" into "...", "--" into an em dash, full-width digits into ASCII, and collapses whitespace.
    Smart quotes are kept.
    """
    text = unicodedata.normalize("NFC", strip_ansi(text))
    text = text.translate(_TRANSLATE)
    text = "".join(
        " " if unicodedata.category(c) == "Cc" else c
        for c in text
    )
    text = _FULLWIDTH_DIGIT_RE.sub(lambda m: chr(ord(m.group()) - 0xFF10 + 0x30), text)
    text = _ELLIPSIS_RE.sub("...", text)
    text = _DOUBLE_DASH_RE.sub(" — ", text)
    return _WS_RE.sub(" ", text).strip()
