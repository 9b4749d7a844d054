"""Notes that lost their markup on the way: a format without footnotes (plain text, RTF, FB2 or PDF written by
calibre, a KF8 book made from an EPUB 2) keeps a note as a paragraph ending with its back-link, "↩︎" (pandoc's,
which calibre keeps), and its reference as a number glued to the word or punctuation before it ("on the
bench.1 It said"). Such a paragraph is a note; the references are the numbers up to the count of notes, only in
a document that has such notes.
"""
from __future__ import annotations

import re
from typing import Collection, Optional

BACKLINK_RE = re.compile(r"\s*[↩⤴][\ufe0e\ufe0f]?\s*$")  # a note's back-link glyph at the end of its paragraph
GLUED_RE = re.compile(r"(?<=\S)(\d{1,3})(?=\s|$)")
PUNCTUATION = ".,;:!?\"'”’)]»"
NOTE_NUMBER_RE = re.compile(r"^\s*\[?(\d{1,3})[.)\]]?\s")


def is_backlinked_note(paragraph: str) -> bool:
    """True when `paragraph` ends with a note's back-link glyph ("The bench was green.↩︎")."""
    return bool(BACKLINK_RE.search(paragraph))


def without_backlink(paragraph: str) -> str:
    """`paragraph` without a trailing back-link glyph (a note kept when notes are read)."""
    return BACKLINK_RE.sub("", paragraph)


def _glued(match: re.Match, highest: int, only: Optional[Collection[int]]) -> str:
    """A reference number glued to a word of three or more lower-case letters ("grandfather1"), or to
    punctuation after a word ("bench.1"), when it can be a note's; else as is ("mp3", "2.1", "10:30")."""
    number = int(match.group(1))
    if not 0 < number <= highest or (only is not None and number not in only):
        return match.group(0)
    before = match.string[max(0, match.start() - 4):match.start()]
    if before[-1:] in PUNCTUATION:
        before = before[:-1].rstrip(PUNCTUATION)
        ok = before[-1:].isalpha() or before[-1:] in "\"'”’)]»"
    else:
        ok = len(before) >= 3 and before[-3:].isalpha() and before[-3:].islower()
    return "" if ok else match.group(0)


def strip_glued_references(text: str, highest: int, only: Optional[Collection[int]] = None) -> str:
    """`text` without note references 1..`highest` (`only`: those of them) glued to the word before them
    ("bench.1 It" -> "bench. It")."""
    return GLUED_RE.sub(lambda m: _glued(m, highest, only), text) if highest > 0 else text


def note_number(line: str) -> int:
    """The number a note's line starts with ("1 The bench", "2. Prices", "[3] Text"), else 0."""
    m = NOTE_NUMBER_RE.match(line)
    return int(m.group(1)) if m else 0
