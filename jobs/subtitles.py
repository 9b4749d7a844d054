"""Subtitles for a job's audio files: SubRip (.srt) and WebVTT (.vtt), one cue per segment.

Cue times come from the assembly itself (`jobs.assemble.join` returns every segment's span in
samples of the joined audio: segment lengths plus the pauses it inserted), so they are exact to
the millisecond the formats can express. A cue's text is the segment's text as the document had
it (not the normalized form sent to the model); failed segments have no audio and no cue.

A narrated EPUB's clips (`jobs.narrated`) are these times, from the same spans and the same rounding.

Files go next to the audio: `chapters/NN - Title.srt|.vtt` beside each chapter file and
`<book>.srt|.vtt` beside the book file.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from jobs.assemble import ChapterOut, write_bytes_atomic

log = logging.getLogger(__name__)
SUBTITLE_FORMATS = ("srt", "vtt")


@dataclass(frozen=True)
class Cue:
    start_s: float
    end_s: float
    text: str


def milliseconds(seconds: float) -> int:
    """A time as the whole milliseconds the cues (and a narrated EPUB's clips) say."""
    return max(0, int(round(seconds * 1000)))


def clock(ms: int, sep: str = ".") -> str:
    """`HH:MM:SS.mmm` (`sep` between seconds and milliseconds): WebVTT's and SMIL's clock value."""
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def _stamp(seconds: float, sep: str) -> str:
    return clock(milliseconds(seconds), sep)


def _clean(text: str) -> str:
    """One cue's text: whitespace folded; a blank line or '-->' would end or break a cue."""
    return " ".join((text or "").split()).replace("-->", "->")


def to_srt(cues: Sequence[Cue]) -> str:
    """SubRip text: numbered cues, `HH:MM:SS,mmm --> HH:MM:SS,mmm`."""
    blocks = [f"{i}\n{_stamp(c.start_s, ',')} --> {_stamp(c.end_s, ',')}\n{_clean(c.text)}\n"
              for i, c in enumerate(cues, 1)]
    return "\n".join(blocks)


def to_vtt(cues: Sequence[Cue]) -> str:
    """WebVTT text: the `WEBVTT` header, then cues with `HH:MM:SS.mmm` times."""
    blocks = [f"{_stamp(c.start_s, '.')} --> {_stamp(c.end_s, '.')}\n{_clean(c.text)}\n" for c in cues]
    return "WEBVTT\n\n" + "\n".join(blocks)


def write_subtitles(audio_path: str | Path, cues: Sequence[Cue]) -> list[Path]:
    """Write `<audio stem>.srt` and `.vtt` next to `audio_path` (atomically); returns their paths."""
    audio_path = Path(audio_path)
    out = []
    for fmt, render in (("srt", to_srt), ("vtt", to_vtt)):
        path = audio_path.with_suffix(f".{fmt}")
        write_bytes_atomic(path, render(cues).encode("utf-8"))
        out.append(path)
    return out


def chapter_cues(out: ChapterOut, texts: Sequence[str], offset_s: float = 0.0) -> list[Cue]:
    """Cues of one chapter from its segment spans (None: failed segment, no cue), shifted by `offset_s`."""
    return [Cue(offset_s + span[0], offset_s + span[1], text)
            for span, text in zip(out.spans, texts) if span is not None and _clean(text)]


def write_job_subtitles(outputs: Sequence[ChapterOut], texts: Sequence[Sequence[str]],
                        book_path: Optional[Path]) -> dict:
    """Subtitles for every chapter file and the book file. `texts[i]`: chapter i's segment texts, in the
    order of `outputs[i].spans`. Returns {"book": [paths], "chapters": [[paths] or None, ...]}."""
    book_cues: list[Cue] = []
    chapters: list[Optional[list[str]]] = []
    for out, seg_texts in zip(outputs, texts):
        if out.path is None:
            chapters.append(None)
            continue
        chapters.append([str(p) for p in write_subtitles(out.path, chapter_cues(out, seg_texts))])
        book_cues += chapter_cues(out, seg_texts, out.start_s)
    book = [str(p) for p in write_subtitles(book_path, book_cues)] if book_path else []
    log.info("wrote subtitles: %d cues for the book, %d chapter files", len(book_cues),
             sum(1 for c in chapters if c))
    return {"book": book, "chapters": chapters}
