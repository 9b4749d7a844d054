"""An XML file's markup by position, without a tree: every tag and every run of character data with its
offsets in the text, each run knowing the element that holds it.

This is what lets the narrated EPUB wrap a sentence of the ORIGINAL file in a span by inserting two tags at
known offsets, nothing else changed. Only what is plainly well-formed is scanned: a tag out of place, a stray
`<`, or a DOCTYPE with an internal subset (entities that could expand to markup) give None, and that file is
then read without positions. Nothing is fetched and no entity is expanded here.
"""
from __future__ import annotations

import html
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Optional

_MARKUP = re.compile(r"""
    (?P<comment><!--.*?-->)
  | (?P<cdata><!\[CDATA\[.*?\]\]>)
  | (?P<pi><\?.*?\?>)
  | (?P<doctype><!DOCTYPE[^\[>]*>)
  | </(?P<end>[^\s<>/=]+)\s*>
  | <(?P<start>[^\s<>/=!?]+)(?P<attrs>(?:\s+[^\s<>/=]+\s*=\s*(?:"[^"<]*"|'[^'<]*'))*)\s*(?P<empty>/?)>
""", re.S | re.X)
SPACE = " \t\r\n"  # XML's white space
_ATTR = re.compile(r"""([^\s=]+)\s*=\s*(?:"([^"]*)"|'([^']*)')""")


@dataclass(frozen=True)
class Tag:
    """A start tag (`end` False; `empty` for `<x/>`) or an end tag: its name as written, attributes (values
    unescaped), offsets [start, stop) in the text and `attrs_end`, where a new attribute may be inserted."""

    name: str
    attrs: dict
    start: int
    stop: int
    attrs_end: int
    end: bool = False
    empty: bool = False

    @property
    def local(self) -> str:
        """The name without its namespace prefix, lower case."""
        return self.name.rsplit(":", 1)[-1].lower()


@dataclass
class Scan:
    """The tags and the runs of character data of one file: runs are (start, stop, parent) with `parent` the
    number of the innermost open element (0: none), so runs of the same parent are siblings. `elements`:
    number -> [its parent's number, where its start tag begins, where its end tag ends, where its first
    character that is not a space begins and its last ends (-1, -1: none), all character offsets; its local
    name, lower case]."""

    tags: list[Tag]
    runs: list[tuple[int, int, int]]
    elements: dict[int, list] = field(default_factory=dict)

    def run_at(self, offset: int) -> Optional[int]:
        """The index of the run that holds character offset `offset`, or None."""
        i = bisect_right(self._starts, offset) - 1
        return i if i >= 0 and offset < self.runs[i][1] else None

    def __post_init__(self):
        self._starts = [r[0] for r in self.runs]


def scan(text: str) -> Optional[Scan]:
    """Scan `text` (a whole XML file); None where it is not plainly well-formed (see the module docstring)."""
    tags: list[Tag] = []
    runs: list[tuple[int, int, int]] = []
    stack: list[tuple[str, int]] = []
    elements: dict[int, list] = {}
    count, pos, seen_root, last_text = 0, 0, False, -1
    while True:
        lt = text.find("<", pos)
        stop = len(text) if lt < 0 else lt
        if stop > pos:
            if stack:
                runs.append((pos, stop, stack[-1][1]))
                last_text = _text_seen(text, pos, stop, stack, elements, last_text)
            elif text[pos:stop].strip(" \t\r\n\ufeff"):
                return None  # text outside the root element
        if lt < 0:
            break
        m = _MARKUP.match(text, lt)
        if m is None:
            return None
        pos = m.end()
        if m.group("end"):
            if not stack or stack[-1][0] != m.group("end"):
                return None
            element = elements[stack.pop()[1]]
            element[2], element[4] = pos, last_text if element[3] >= 0 else -1
            tags.append(Tag(m.group("end"), {}, lt, pos, lt, end=True))
        elif m.group("start"):
            if not stack and seen_root:
                return None
            seen_root = True
            attrs = {a.group(1): html.unescape(a.group(2) if a.group(2) is not None else a.group(3))
                     for a in _ATTR.finditer(m.group("attrs"))}
            empty = bool(m.group("empty"))
            tags.append(Tag(m.group("start"), attrs, lt, pos, m.end("attrs"), empty=empty))
            if not empty:
                count += 1
                elements[count] = [stack[-1][1] if stack else 0, lt, -1, -1, -1, tags[-1].local]
                stack.append((m.group("start"), count))
        elif m.group("cdata") and stack:
            runs.append((lt, pos, -1))  # no span goes into a CDATA section: a parent of its own
            last_text = _text_seen(text, lt, pos, stack, elements, last_text)
    return None if stack or not seen_root else Scan(tags, runs, elements)


def _text_seen(text: str, start: int, stop: int, stack, elements, last_text: int) -> int:
    """Note text [start, stop) in the open elements that had none (their first character that is not a
    space; each element once, so deep nesting costs no more than flat) -> where the last such character ends."""
    piece = text[start:stop]
    lead = len(piece) - len(piece.lstrip(SPACE))
    if lead == len(piece):
        return last_text
    for _, number in reversed(stack):
        element = elements[number]
        if element[3] >= 0:
            break  # it and its ancestors have their first text already
        element[3] = start + lead
    return start + len(piece.rstrip(SPACE))


def byte_offsets(text: str, offsets) -> dict[int, int]:
    """Character offsets in `text` -> byte offsets in its UTF-8 encoding, in one pass over the text."""
    out: dict[int, int] = {}
    if text.isascii():
        return {o: o for o in offsets}
    prev = done = 0
    for o in sorted(set(offsets)):
        done += len(text[prev:o].encode("utf-8"))
        out[o] = done
        prev = o
    return out


def decode_utf8(data: bytes) -> Optional[tuple[str, int]]:
    """`data` as UTF-8 text without its byte order mark, and the mark's length in bytes; None when it is
    not UTF-8 (EPUB 3 content is UTF-8; another encoding is read without positions)."""
    bom = 3 if data.startswith(b"\xef\xbb\xbf") else 0
    try:
        return data[bom:].decode("utf-8"), bom
    except UnicodeDecodeError:
        return None
