"""Media Overlay documents (SMIL 3.0 as EPUB 3 uses it): one per narrated XHTML file, a `par` per segment that
pairs the text (a fragment: the id of its span) with its clip of the chapter's audio.

Clip times are the subtitles' times (`jobs.subtitles.milliseconds`, `clock`: the same spans, the same
rounding), so a clip and its cue agree to the millisecond; a document's duration is the sum of its clips.
"""
from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Sequence
from urllib.parse import quote

from jobs.subtitles import clock

SMIL_NS = "http://www.w3.org/ns/SMIL"
EPUB_NS = "http://www.idpf.org/2007/ops"


@dataclass(frozen=True)
class Par:
    """One segment of a narrated file: the id of its (first) span in `doc`, its chapter's audio member, its
    clip [begin_ms, end_ms) in it and the byte ranges its spans wrap."""

    doc: str
    span_id: str
    audio: str
    begin_ms: int
    end_ms: int
    ranges: tuple = ()


def href(target: str, frm: str) -> str:
    """The relative URL of zip member `target` from a file in zip member `frm`."""
    return quote(posixpath.relpath(target, posixpath.dirname(frm) or "."), safe="/")


def duration_ms(pars: Sequence[Par]) -> int:
    """A document's duration: the sum of its clips."""
    return sum(p.end_ms - p.begin_ms for p in pars)


def smil_document(path: str, doc: str, pars: Sequence[Par]) -> bytes:
    """The overlay at zip member `path` for XHTML member `doc`: its `pars`, in reading order."""
    text_href = href(doc, path)
    body = "".join(
        f'    <par id="par{n}">\n'
        f'      <text src="{text_href}#{p.span_id}"/>\n'
        f'      <audio src="{href(p.audio, path)}" clipBegin="{clock(p.begin_ms)}" clipEnd="{clock(p.end_ms)}"/>\n'
        "    </par>\n" for n, p in enumerate(pars, 1))
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<smil xmlns="{SMIL_NS}" xmlns:epub="{EPUB_NS}" version="3.0">\n'
            f'  <body>\n{body}  </body>\n</smil>\n'
            ).encode("utf-8")
