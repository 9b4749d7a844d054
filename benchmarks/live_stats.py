"""Arithmetic of the live-text benchmark (benchmarks/live.py): how its text is sent and where the server
splits it, a real-time player's waits, one level's figures. Plain Python, no I/O, unit-tested.
"""
from __future__ import annotations

from collections import Counter
from typing import Optional, Sequence

from benchmarks.load.stats import SAMPLE_RATE, ms, percentile, rounded
from text.split import split_streamed


def word_pieces(text: str) -> list[str]:
    """The text as it is sent: each word with the space after it, the last word without one."""
    words = text.split()
    return [w + " " for w in words[:-1]] + words[-1:]


def sentence_plan(pieces: Sequence[str], lang: str = "en") -> tuple[Optional[int], int]:
    """How the server splits text arriving in these pieces (text.split.split_streamed, as the
    live route does): (index of the piece after which the first sentence is complete, or None when
    none is before input_text.end; the number of sentences spoken, the rest at the end included)."""
    first, count, rest = None, 0, ""
    for i, piece in enumerate(pieces):
        sentences, rest = split_streamed(rest + piece, lang)
        if sentences and first is None:
            first = i
        count += len(sentences)
    return first, count + (1 if rest.strip() else 0)


def playback_gaps(events: Sequence[tuple[float, int]], bytes_per_s: float) -> list[tuple[float, float]]:
    """The waits of a player that starts at the first audio, plays in real time without a buffer and,
    when it runs dry, waits for more: (when it ran dry, when audio came again) for each wait that more
    audio ended (running out at the very end is no gap).

    `events`: the reads of one session in order, (time, total audio bytes received so far). With no
    waits, benchmarks.load.stats.playback_deficit of the same reads is <= 0.
    """
    gaps: list[tuple[float, float]] = []
    if not events:
        return gaps
    t0, prev = events[0]
    dry_at = t0 + prev / bytes_per_s
    for t, total in events[1:]:
        if total <= prev:
            continue
        if t > dry_at:
            gaps.append((dry_at, t))
            dry_at = t
        dry_at += (total - prev) / bytes_per_s
        prev = total
    return gaps


def split_gaps(gaps: Sequence[tuple[float, float]], t_end: float) -> tuple[list, list]:
    """(gaps that began before t_end, gaps that began at or after it)."""
    return [g for g in gaps if g[0] < t_end], [g for g in gaps if g[0] >= t_end]


def spread(values: Sequence[float]) -> dict:
    """p50 / p95 / max in milliseconds of values in seconds, and how many there were."""
    return {"p50": ms(percentile(values, 0.50)), "p95": ms(percentile(values, 0.95)),
            "max": ms(max(values) if values else None), "n": len(values)}


def summarize(records: list[dict], window_s: float) -> dict:
    """One level's figures from its measured sessions (records of `live_session`).

    A session is `completed` when `done` came; the timings, underruns and lengths are over completed
    sessions. Errors are counted by kind; sessions cancelled after the drain timeout are 'incomplete'.
    """
    n = len(records)
    done = [r for r in records if r["completed"]]
    first = [r["first_audio_s"] for r in done if r["first_audio_s"] is not None]
    under = [r for r in done if r["underrun"]]
    gap_after = [r["gap_after_end_s"] for r in under]
    errors = Counter(r["error"] for r in records if not r["completed"] and r["error"] not in (None, "incomplete"))
    audio = [r["samples"] / SAMPLE_RATE for r in done]
    return {
        "measured": n,
        "sessions_per_s": rounded(n / window_s if window_s > 0 else None),
        "completed": len(done),
        "completed_share": rounded(len(done) / n if n else None, 4),
        "incomplete": sum(1 for r in records if r["error"] == "incomplete"),
        "errors": dict(sorted(errors.items())),
        "first_audio_ms": spread(first),
        "sentence_to_audio_ms": spread([r["sentence_audio_s"] for r in done if r["sentence_audio_s"] is not None]),
        "end_to_done_ms": spread([r["end_done_s"] for r in done]),
        "silent": len(done) - len(first),  # completed without any sample above the silence threshold
        "underruns": len(under),
        "underrun_share": rounded(len(under) / len(done) if done else None, 4),
        "gap_after_end_ms": {"p95": ms(percentile(gap_after, 0.95)), "max": ms(max(gap_after) if gap_after else None)},
        "gaps_while_text_arrived": sum(1 for r in done if r["gaps_before_end"]),
        "audio_s_per_session": {"mean": rounded(sum(audio) / len(audio) if audio else None),
                                "min": rounded(min(audio) if audio else None)},
        "length_mismatches": sum(1 for r in done if r["expect_samples"] is not None
                                 and r["samples"] != r["expect_samples"]),
        # the server's done.audio_seconds against the audio received (rounded to 1 ms by the server)
        "audio_seconds_mismatches": sum(1 for r in done if r["audio_seconds"] is None
                                        or abs(r["audio_seconds"] - r["samples"] / SAMPLE_RATE) > 0.0015),
        "connect_ms": spread([r["connect_s"] for r in records if r["connect_s"] is not None]),
        "send_lag_ms": {"p99": ms(percentile([r["send_lag_s"] for r in records], 0.99)),
                        "max": ms(max((r["send_lag_s"] for r in records), default=None))},
        "unknown_events": sum(r["unknown_events"] for r in records),
    }
