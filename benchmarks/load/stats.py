"""Arithmetic of the open-loop load benchmark (benchmarks/load.py): arrival schedules, percentiles,
the playback-underrun check and the per-rate summary. Plain Python, no I/O, unit-tested.
"""
from __future__ import annotations

import math
import random
from collections import Counter
from typing import Iterator, Optional, Sequence

SAMPLE_RATE = 24000  # pcm from /v1/audio/speech: 24 kHz mono s16le
SAMPLES_PER_FRAME = 1920  # 80 ms at 12.5 frames per second
BYTES_PER_SAMPLE = 2


def arrivals(rate: float, mode: str = "poisson", seed: int = 0) -> Iterator[float]:
    """Send times in seconds from the start of a level, endless: a Poisson process of `rate` per
    second (exponential gaps from a seeded generator) or, with mode 'constant', one every 1/rate s
    starting at 0."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s, got {rate}")
    if mode == "constant":
        k = 0
        while True:
            yield k / rate
            k += 1
    if mode != "poisson":
        raise ValueError(f"unknown arrival mode {mode!r}; choose poisson or constant")
    rng, t = random.Random(seed), 0.0
    while True:
        t += rng.expovariate(rate)
        yield t


def arrivals_until(rate: float, duration: float, mode: str = "poisson", seed: int = 0) -> list[float]:
    """The send times of `arrivals` that fall before `duration` seconds."""
    out = []
    for t in arrivals(rate, mode, seed):
        if t >= duration:
            return out
        out.append(t)


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """Nearest-rank percentile (q in [0, 1]): the smallest value with at least q of the values at or
    below it; None for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def playback_deficit(events: Sequence[tuple[float, int]], bytes_per_s: float) -> float:
    """How far a real-time player falls behind the audio it has received, in seconds (<= 0: never).

    `events` are the client's reads of one response in order: (time, total audio bytes received so
    far), starting with the first read that carried audio and ending with the read that completed the
    response (which may carry no audio). The player starts at the first audio and plays in real time
    without a buffer; just before read k it has played `t_k - t_0` seconds and holds `bytes_{k-1} /
    bytes_per_s` seconds, so it ran dry if the first exceeds the second at any k. The result is the
    largest such excess: the start-up buffer the client would have needed.
    """
    if len(events) < 2:
        return 0.0 if events else math.nan
    t0 = events[0][0]
    worst = -math.inf
    for (_, held), (t, _) in zip(events, events[1:]):
        worst = max(worst, (t - t0) - held / bytes_per_s)
    return worst


def underran(events: Sequence[tuple[float, int]], bytes_per_s: float) -> bool:
    """Whether a player starting at the first audio with no buffer ran out before the response ended."""
    return playback_deficit(events, bytes_per_s) > 0.0


def ms(x: Optional[float]) -> Optional[float]:
    """Seconds as milliseconds rounded to 0.01 (None stays None)."""
    return None if x is None else round(1e3 * x, 2)


def rounded(x: Optional[float], nd: int = 3) -> Optional[float]:
    return None if x is None else round(x, nd)


def summarize(records: list[dict], window_s: float, expect_samples: Optional[int]) -> dict:
    """One rate's figures from its measured requests (dicts written by benchmarks.load.client).

    A request is `completed` when it got HTTP 200 and the whole chunked body; TTFA, E2E, underruns
    and length checks are over completed requests. Errors are counted by kind (HTTP status such as
    '503', or 'timeout', 'connect', 'truncated', 'protocol'); requests still running when the
    drain timeout ran out count as 'incomplete'.
    """
    n = len(records)
    done = [r for r in records if r["completed"]]
    ttfa = [r["ttfa_s"] for r in done if r["ttfa_s"] is not None]
    e2e = [r["e2e_s"] for r in done]
    under = sum(1 for r in done if r["underrun"])
    deficits = [max(0.0, r["deficit_s"]) for r in done if r["deficit_s"] is not None and not math.isnan(r["deficit_s"])]
    errors = Counter(r["error"] for r in records if not r["completed"] and r["error"] not in (None, "incomplete"))
    incomplete = sum(1 for r in records if r["error"] == "incomplete")
    lengths = Counter(r["samples"] for r in done)
    mismatch = sum(1 for r in done if expect_samples is not None and r["samples"] != expect_samples)
    lags = [r["send_lag_s"] for r in records]
    return {
        "measured": n,
        "achieved_rate": rounded(n / window_s if window_s > 0 else None),
        "completed": len(done),
        "completed_share": rounded(len(done) / n if n else None, 4),
        "incomplete": incomplete,
        "errors": dict(sorted(errors.items())),
        "ttfa_ms": {"p50": ms(percentile(ttfa, 0.50)), "p95": ms(percentile(ttfa, 0.95)),
                    "p99": ms(percentile(ttfa, 0.99)), "max": ms(max(ttfa) if ttfa else None),
                    "n": len(ttfa)},
        "silent": len(done) - len(ttfa),  # completed without any sample above the silence threshold
        "e2e_s": {"p50": rounded(percentile(e2e, 0.50)), "p95": rounded(percentile(e2e, 0.95)),
                  "max": rounded(max(e2e) if e2e else None)},
        "underruns": under,
        "underrun_share": rounded(under / len(done) if done else None, 4),
        "buffer_needed_ms": {"p95": ms(percentile(deficits, 0.95)), "max": ms(max(deficits) if deficits else None)},
        "length_mismatches": mismatch,
        "lengths_samples": {str(k): v for k, v in sorted(lengths.items())} if len(lengths) <= 20 else
                           {"min": min(lengths), "max": max(lengths), "distinct": len(lengths)},
        "send_lag_ms": {"p99": ms(percentile(lags, 0.99)), "max": ms(max(lags) if lags else None)},
    }
