"""Inline tags in a document's text: voices per passage and explicit pauses.

    [voice=ryan]Spoken by ryan.[/voice] Back to the job's voice. [pause=1.5] After a 1.5 s pause.

`[voice=NAME]` switches the voice until its `[/voice]` (tags nest: a closing tag returns to the voice
before it; an unclosed one lasts to the end of the document). `[pause=SECONDS]` ends the segment there
and puts that much silence after it (in place of the pause segmentation would have put; pauses in a
row add up). Tag names are case-insensitive. Tags are taken out of the text: the model never reads
them. Other square brackets are ordinary text.

Voices also come per chapter from a job's `chapter_voices` ({chapter number: voice}); inline tags win.
`check_job_voices` rejects, before anything is queued, a voice the engine does not know.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

log = logging.getLogger(__name__)

TAG = re.compile(r"\[\s*(?:(?P<open>voice)\s*=(?P<voice>[^\]]*)|(?P<close>/\s*voice)|(?P<pause>pause)\s*=(?P<secs>[^\]]*))\]",
                 re.IGNORECASE)
MAX_PAUSE_S = 60.0


class TagError(ValueError):
    """A malformed tag (the message quotes it and shows the right form)."""


@dataclass
class Piece:
    """A run of text spoken with one voice; `pause_ms`: an explicit pause after it (None: the usual one)."""

    text: str
    voice: Optional[str]
    pause_ms: Optional[int] = None


@dataclass
class TagState:
    """Open voice tags, carried from one paragraph to the next."""

    voices: list = field(default_factory=list)

    @property
    def voice(self) -> Optional[str]:
        return self.voices[-1] if self.voices else None


def _pause_ms(raw: str, tag: str) -> int:
    value = raw.strip().lower().removesuffix("s").strip()
    try:
        secs = float(value)
    except ValueError:
        secs = -1.0
    if not 0 <= secs <= MAX_PAUSE_S:
        raise TagError(f"bad tag {tag!r}: a pause is a number of seconds from 0 to {MAX_PAUSE_S:g}, e.g. [pause=1.5]")
    return int(round(secs * 1000))


def split_tags(text: str, state: TagState) -> list[Piece]:
    """Split one paragraph at its tags into pieces (updating `state` for the next paragraph).
    A piece may have empty text: a pause at the start of the paragraph (or right after a voice switch)."""
    pieces: list[Piece] = []
    cur = Piece("", state.voice)
    pos = 0
    for m in TAG.finditer(text):
        cur.text += text[pos:m.start()]
        pos = m.end()
        if m.group("pause"):
            ms = _pause_ms(m.group("secs"), m.group(0))
            cur.pause_ms = (cur.pause_ms or 0) + ms
            pieces.append(cur)
            cur = Piece("", state.voice)
            continue
        if m.group("open"):
            name = m.group("voice").strip()
            if not name:
                raise TagError(f"bad tag {m.group(0)!r}: name the voice, e.g. [voice=ryan]")
            state.voices.append(name)
        elif not state.voices:
            raise TagError("a [/voice] tag closes no [voice=NAME] tag; remove it or open the voice before it")
        else:
            state.voices.pop()
        if cur.text.strip():
            pieces.append(cur)
        cur = Piece("", state.voice)
    cur.text += text[pos:]
    if cur.text.strip():
        pieces.append(cur)
    return _merge_pauses(pieces)


def _merge_pauses(pieces: list[Piece]) -> list[Piece]:
    """A textless piece's pause joins the piece before it (pauses in a row add up)."""
    out: list[Piece] = []
    for p in pieces:
        if not p.text.strip() and out:
            out[-1].pause_ms = (out[-1].pause_ms or 0) + (p.pause_ms or 0)
        else:
            out.append(p)
    return out


def strip_tags(text: str) -> str:
    """The text without any tag (for titles and other text that is read but not segmented by voice)."""
    return TAG.sub("", text or "")


def job_voices(chapters: Sequence[tuple[str, list]], spec) -> set[str]:
    """Every voice a job names: its own, its chapter voices and its inline tags (segment metadata)."""
    names = {s.metadata.get("voice") for _, segs in chapters for s in segs}
    names.update((spec.chapter_voices or {}).values())
    names.add(spec.voice)
    return {n for n in names if n}


def unknown_voices(chapters: Sequence[tuple[str, list]], spec, known: Optional[Sequence[str]]) -> list[str]:
    """The voices a job names (job_voices) that are neither among `known` (the engine's voices) nor a voice
    file, sorted. `known` None or empty: nothing to check against, none."""
    if not known:
        return []
    return [name for name in sorted(job_voices(chapters, spec)) if name not in known and not Path(name).is_file()]


def check_job_voices(chapters: Sequence[tuple[str, list]], spec, known: Optional[Sequence[str]]) -> None:
    """Raise TagError naming the first unknown voice of the job (unknown_voices); the worker checks again."""
    for name in unknown_voices(chapters, spec, known)[:1]:
        raise TagError(f"unknown voice {name!r} (in the text's [voice=...] tags, chapter_voices or --voice); "
                       f"available: {', '.join(sorted(known))}")


def apply_chapter_voices(chapters: list[tuple[str, list]], numbers: Sequence[int], spec) -> None:
    """Give the segments of chapter number `numbers[i]` (as `preview` numbers them) the voice
    `spec.chapter_voices` names for it, where no inline tag chose one."""
    voices = spec.chapter_voices or {}
    unknown = sorted(set(voices) - {str(n) for n in numbers}, key=lambda k: (len(k), k))
    if unknown:
        log.warning("chapter_voices names chapters %s that the job does not include", ", ".join(unknown))
    for number, (_, segs) in zip(numbers, chapters):
        voice = voices.get(str(number))
        if voice:
            for s in segs:
                s.metadata.setdefault("voice", voice)
