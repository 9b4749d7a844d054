"""Runaway/silence guard: is a segment's audio plausible for its text?"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from engines.model import text as text_facts

log = logging.getLogger(__name__)


@dataclass
class GuardSettings:
    """Runaway/silence guard: audio length must be within [min_ratio, max_ratio] x the estimate
    (characters / chars-per-second; CJK characters count separately) and RMS above `silence_rms`."""

    enabled: bool = True
    min_ratio: float = 0.3
    max_ratio: float = 3.0
    chars_per_s: float = text_facts.CHARS_PER_S
    cjk_chars_per_s: float = text_facts.CJK_CHARS_PER_S
    per_language: dict = field(default_factory=dict)  # e.g. {"german": 13.0}: overrides chars_per_s
    min_expected_s: float = 1.0
    silence_rms: float = 0.003


def guard_for(enabled: bool, engine=None) -> GuardSettings:
    """The guard of a worker on `engine` (a TTSEngine; None: not known), on when `enabled` (jobs.guard).
    A test model (`engine.test_model`: random weights) makes noise of any length: the guard would fail
    every segment of it, so the plausibility check is skipped for it, said once in the log."""
    why = getattr(engine, "test_model", "") if engine is not None else ""
    if enabled and why:
        log.warning("jobs guard: no plausibility check of the audio: the model is a test model (%s)", why)
        return GuardSettings(enabled=False)
    return GuardSettings(enabled=enabled)


def expected_seconds(text: str, language: str, guard: GuardSettings) -> float:
    """Rough spoken duration of `text` at the guard's rates (per-language override), at least `min_expected_s`."""
    cps = guard.per_language.get((language or "").lower(), guard.chars_per_s)
    return max(guard.min_expected_s, text_facts.expected_seconds(text, cps, guard.cjk_chars_per_s))


def check_audio(audio: np.ndarray, sample_rate: int, text: str, language: str, guard: GuardSettings) -> Optional[str]:
    """None when the audio is plausible for the text, else the reason it is not."""
    if not guard.enabled:
        return None
    dur = audio.size / float(sample_rate)
    est = expected_seconds(text, language, guard)
    if dur < guard.min_ratio * est or dur > guard.max_ratio * est:
        return f"runaway/truncated audio: {dur:.1f} s for text expected ~{est:.1f} s"
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64)))) if audio.size else 0.0
    if rms < guard.silence_rms:
        return f"silent audio (RMS {rms:.4f} < {guard.silence_rms})"
    return None


def attempt_seed(seed: int, guard_failures: int) -> int:
    """The seed of the next try: the segment's seed, then a different one after each guard failure."""
    return seed if guard_failures == 0 else (seed + 1_000_003 * guard_failures) % (2**31 - 1)

