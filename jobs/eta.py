"""How long a running job has left, from the rate its own finished segments were made at.

A queue worker finishes segments in bursts (a batch of them at once, then nothing until the next batch),
so a rate measured from some moment up to now swings with where that moment falls: measured from just
before a burst it counts the whole burst in almost no time and promises far too little, and then climbs
for minutes as later batches come at their real pace (the page once showed 4 minutes left and, 5 minutes
later, 32). Here the rate is measured between finishes only: from the end of the first burst of a window
of recent finishes (that burst's work was done before the window opened) to the newest finish, over the
characters finished in between. The time left is counted from the newest finish (`Eta.at`), so between
bursts a reader counts down towards `finish_at` instead of seeing the estimate grow.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

WINDOW_S = 600.0  # the rate comes from the finishes of the last ten minutes ...
MIN_WINDOW = 32  # ... and at least this many of the latest finishes (slow machines: several bursts)
BURST_S = 2.0  # finishes this close after a window's first one belong to the same burst
MIN_MEASURED = 8  # finishes needed after that first burst (a batch's worth: fewer say little)


@dataclass(frozen=True)
class Eta:
    """The time a job has left as of `at` (when its newest segment finished, epoch seconds)."""

    left_s: float
    at: float
    rate: float  # characters of text made into audio a second
    measured_s: float  # the span of time the rate was measured over

    @property
    def finish_at(self) -> float:
        return self.at + self.left_s

    def to_dict(self) -> dict:
        return {"left_s": round(self.left_s, 1), "at": round(self.at, 3), "finish_at": round(self.finish_at, 3),
                "rate": round(self.rate, 3), "measured_s": round(self.measured_s, 1)}


def estimate(finishes: Sequence[tuple[float, int]], remaining_chars: int) -> Optional[Eta]:
    """The time left for `remaining_chars` characters of text, given (when, characters) of the job's finished
    segments oldest first (`Queue.finishes`); None while they are too few to measure a rate (fewer than
    MIN_MEASURED after the first burst) or nothing remains."""
    if remaining_chars <= 0 or len(finishes) < 2:
        return None
    newest = finishes[-1][0]
    start = min(newest - WINDOW_S, finishes[-min(MIN_WINDOW, len(finishes))][0])
    measured = _rate([f for f in finishes if f[0] >= start]) or _rate(finishes)
    if measured is None:
        return None
    rate, span = measured
    return Eta(left_s=remaining_chars / rate, at=newest, rate=rate, measured_s=span)


def _rate(finishes: Sequence[tuple[float, int]]) -> Optional[tuple[float, float]]:
    """(characters a second, seconds measured) between the end of the first burst and the newest finish."""
    first = finishes[0][0]
    opened = max(t for t, _ in finishes if t <= first + BURST_S)
    after = [chars for t, chars in finishes if t > opened]
    span = finishes[-1][0] - opened
    if len(after) < MIN_MEASURED or span <= 0:
        return None
    return sum(after) / span, span
