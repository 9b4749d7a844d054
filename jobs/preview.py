"""What a document will become before it is queued: its chapters, their size and estimated length,
and the selection of chapters by number (`chapters: "1,3-5"` of a job spec).

Chapters are numbered from 1 in the order `jobs.submit.document_chapters` finds them (chapters
without any text to speak are left out, as they are from the book); `tts-appliance preview` shows
these numbers and a job's `chapters` and `chapter_voices` use them.

Estimates: audio length = the segments' non-space characters at the speaking rates of
`engines.model.text` (CHARS_PER_S, 15 a second; CJK_CHARS_PER_S, 5 a second for Chinese, Japanese and
Korean characters), plus the pauses segmentation puts between segments, divided by the job's speed. Synthesis time = audio length / the rate of this
machine in audio seconds per second: `jobs.synth_rate` of the config when set, else measured from
the segments this spool folder's queue (SQLite or PostgreSQL) has synthesized (`measured_rate`), else unknown.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Optional, Sequence

log = logging.getLogger(__name__)

MIN_MEASURED_AUDIO_S = 10.0  # less history than this says too little about the machine's speed

_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def check_chapter_ranges(text: str) -> str:
    """Validate the syntax of a chapter selection such as "1,3-5"; returns it with spaces removed.
    Raises ValueError saying what is wrong and how to write one."""
    parts = str(text).split(",")
    for part in parts:
        m = _RANGE.match(part)
        if not m:
            raise ValueError(f"bad chapter selection {text!r}: {part.strip()!r} is not a chapter number or a "
                             "range; write numbers and ranges separated by commas, e.g. 1,3-5")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if lo < 1 or hi < lo:
            raise ValueError(f"bad chapter selection {text!r}: {part.strip()!r} is empty or starts below 1 "
                             "(chapters are numbered from 1; a range is low-high, e.g. 3-5)")
    return "".join(text.split())


def select_chapters(text: Optional[str], count: int) -> list[int]:
    """0-based indices of the chapters a selection names (None: all), in document order.
    Raises ValueError when it names a chapter the document does not have."""
    if text is None:
        return list(range(count))
    chosen: set[int] = set()
    for part in check_chapter_ranges(text).split(","):
        lo, _, hi = part.partition("-")
        lo, hi = int(lo), int(hi or lo)
        if hi > count:
            raise ValueError(f"chapter selection {text!r} names chapter {hi}, but the document has {count} "
                             f"chapter{'s' if count != 1 else ''} (see `tts-appliance preview FILE`)")
        chosen.update(range(lo - 1, hi))
    return sorted(chosen)


def measured_rate(location: str | Path, recent: int = 2000) -> Optional[tuple[float, float]]:
    """(audio seconds per second, audio seconds measured) over the `recent` last syntheses of the queue at
    `location` (read only), or None without enough history. Overlapping syntheses (batches) count their
    wall time once."""
    from jobs.queue import Queue, QueueError, QueueUnavailable

    try:
        with Queue.reading(location) as queue:  # None: no queue there yet
            rows = queue.recent_syntheses(recent) if queue else []
    except (QueueError, QueueUnavailable) as exc:  # not readable by this user, or a server away
        log.info("no synthesis history: %s", exc)
        return None
    audio = sum(r["audio_s"] for r in rows)
    busy, end = 0.0, None
    for start, finish in sorted((r["started_at"], r["finished_at"]) for r in rows):
        if end is None or start > end:
            busy += finish - start
            end = finish
        elif finish > end:
            busy += finish - end
            end = finish
    if audio < MIN_MEASURED_AUDIO_S or busy <= 0:
        return None
    return audio / busy, audio


def preview_chapters(chapters: Sequence[tuple[str, list]], speed: float = 1.0,
                     selection: Optional[str] = None) -> list[dict]:
    """Per chapter (as `document_chapters` gives them, unselected): number, title, segments, characters,
    estimated audio seconds and whether `selection` keeps it."""
    from engines.model.text import expected_seconds

    keep = set(select_chapters(selection, len(chapters)))
    out = []
    for i, (title, segs) in enumerate(chapters):
        chars = sum(len(s.text) for s in segs)
        spoken = sum(expected_seconds(s.text) for s in segs) + sum(s.pause_after_ms for s in segs) / 1000
        out.append({"number": i + 1, "title": title, "segments": len(segs), "characters": chars,
                    "audio_s": round(spoken / speed, 1), "selected": i in keep})
    return out


def estimate(chapters: list[dict], configured_rate: Optional[float], queue: Optional[str | Path]) -> dict:
    """Totals of the selected chapters and the synthesis time on this machine, saying where the rate
    came from ("configured", "measured" from the `queue` at that location, or None when unknown)."""
    chosen = [c for c in chapters if c["selected"]]
    audio_s = sum(c["audio_s"] for c in chosen)
    rate, source, basis = None, None, None
    if configured_rate:
        rate, source = float(configured_rate), "configured"
    else:
        got = measured_rate(queue) if queue else None
        if got:
            rate, basis = got
            source = "measured"
    return {"chapters": len(chosen), "segments": sum(c["segments"] for c in chosen),
            "characters": sum(c["characters"] for c in chosen), "audio_s": round(audio_s, 1),
            "rate": round(rate, 3) if rate else None, "rate_source": source,
            "measured_audio_s": round(basis, 1) if basis else None,
            "synthesis_s": round(audio_s / rate, 1) if rate else None}
