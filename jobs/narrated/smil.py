"""Media Overlay documents (SMIL 3.0 as EPUB 3 uses it): one per narrated XHTML file, a `par` per segment that
pairs the text (a fragment: the id of its span) with its clip of the chapter's audio.

A clip is its sentence and the pause after it: the clips of one chapter's audio tile it (`tile`): each ends
where the next begins, the first begins at 0 and the last ends where the audio does, so a reading system
plays every moment of the audio and never runs two sentences together. A clip begins where its cue in the
subtitles begins (`jobs.subtitles.milliseconds`, `clock`: the same spans, the same rounding); a segment that
is not highlighted (its text not found) is heard within the clip before it. A document's duration is the sum
of its clips, so the book's is its narrated audio's.
"""
from __future__ import annotations

import posixpath
from dataclasses import dataclass, replace
from typing import Mapping, Sequence
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


def tile(pars: Sequence[Par], ends: Mapping[str, int]) -> list[Par]:
    """`pars` (each clip its segment's own span) with their clips made to tile their audio: in each audio
    member's order of time, a clip runs from the end of the one before (0 for the first) to the begin of the
    next (`ends[audio]`, the audio's length in ms, for the last). Returned in the order given."""
    by_audio: dict[str, list[int]] = {}
    for k, p in enumerate(pars):
        by_audio.setdefault(p.audio, []).append(k)
    out = list(pars)
    for audio, ks in by_audio.items():
        ks.sort(key=lambda k: pars[k].begin_ms)
        bounds = [0] + [pars[k].begin_ms for k in ks[1:]] + [ends[audio]]
        for n, k in enumerate(ks):
            out[k] = replace(pars[k], begin_ms=bounds[n], end_ms=bounds[n + 1])
    return out


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
