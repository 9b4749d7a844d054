"""The time a running job has left (jobs.eta), replayed on the finishes of a real book: the page once showed
4 minutes left and, 5 minutes later, 32, because it measured the rate from whenever it first looked (a
moment just before a few segments finished together promised far too much). The estimate measures between
the job's own finishes, so it must neither climb during the run nor stray far from the time that was left.

tests/data/eta/tiny_cpu_batch8.json: a 120-segment book on the tiny checkpoint, batches of 8, on this
project's 2-core CPU test machine (tests/fixtures/record_eta.py wrote it)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from jobs.eta import MIN_MEASURED, estimate

RECORDED = Path(__file__).parent / "data" / "eta" / "tiny_cpu_batch8.json"


def replay(finishes: list[tuple[float, int]], step: float = 0.1) -> list[tuple[float, float, float]]:
    """(now, the time left the estimate shows at `now`, the time that was really left) every `step` seconds."""
    total, end = sum(c for _, c in finishes), finishes[-1][0]
    out = []
    for i in range(int(end / step)):
        now = i * step
        seen = [f for f in finishes if f[0] <= now]
        eta = estimate(seen, total - sum(c for _, c in seen))
        if eta is not None:
            out.append((now, max(eta.finish_at - now, 0.0), end - now))
    return out


def worst_climb(shown: list[float], floor: float = 10.0) -> float:
    """The most the time shown ever grew: max of later / earlier over every pair (earlier above `floor` s)."""
    worst, low = 0.0, float("inf")
    for left in shown:  # each value against the smallest one before it
        if low < float("inf"):
            worst = max(worst, left / low)
        if left > floor:
            low = min(low, left)
    return worst


def first_look(finishes: list[tuple[float, int]], opened: float, step: float = 0.1) -> list[float]:
    """What the page before this estimator showed when opened at `opened`: the segments done since then over
    the time since then, as the rate of the segments still to do."""
    n, end = len(finishes), finishes[-1][0]
    before = sum(1 for t, _ in finishes if t <= opened)
    shown = []
    for i in range(int(opened / step) + 1, int(end / step)):
        now = i * step
        done = sum(1 for t, _ in finishes if t <= now)
        if done > before:
            shown.append((n - done) * (now - opened) / (done - before))
    return shown


@pytest.fixture(scope="module")
def recorded() -> list[tuple[float, int]]:
    return [(t, c) for t, c in json.loads(RECORDED.read_text())["finishes"]]


def test_the_recording_is_what_the_old_estimate_tripped_on(recorded):
    """On this run, the page's old estimate opened at the wrong moment climbed tenfold and more."""
    climbs = [worst_climb(first_look(recorded, opened)) for opened in range(0, 120, 2)]
    assert max(climbs) > 10, climbs


def test_the_time_left_does_not_climb_and_stays_near_the_truth(recorded):
    rows = replay(recorded)
    end = recorded[-1][0]
    assert rows and rows[0][0] < 0.15 * end  # an estimate early in the run (after MIN_MEASURED finishes)
    assert worst_climb([shown for _, shown, _ in rows]) < 1.25
    for now, shown, truth in rows:
        if truth > 30:
            assert abs(shown - truth) < 0.6 * truth, (now, shown, truth)


def test_bursts_of_a_batch_are_measured_between_bursts():
    """A batch of 8 finishing together every 30 s: the rate is exactly a batch per 30 s from the second burst
    on, and between bursts the time left only counts down."""
    finishes = [(30.0 * b + 0.01 * i, 100) for b in range(6) for i in range(8)]
    remaining = 8 * 100 * 20  # 20 more bursts
    assert estimate(finishes[:8], remaining) is None  # one burst says nothing about the pace
    eta = estimate(finishes[:16], remaining)
    assert eta.rate == pytest.approx(800 / 30, rel=0.01) and eta.left_s == pytest.approx(20 * 30, rel=0.01)
    later = estimate(finishes, remaining - 4 * 800)
    assert later.finish_at == pytest.approx(eta.finish_at, abs=1.0)  # the same end, as the pace held


def test_a_first_burst_of_cached_segments_does_not_promise_too_much():
    """A retried job: the segments whose audio was already made finish at once, the rest at the real pace."""
    finishes = [(0.001 * i, 50) for i in range(20)] + [(10.0 * k, 50) for k in range(1, 11)]
    eta = estimate(finishes, 50 * 30)
    assert eta.rate == pytest.approx(5.0, rel=0.02) and eta.left_s == pytest.approx(300, rel=0.02)


def test_nothing_to_estimate():
    assert estimate([], 1000) is None
    assert estimate([(float(i), 10) for i in range(MIN_MEASURED + 2)], 0) is None
    assert estimate([(float(i), 10) for i in range(MIN_MEASURED)], 1000) is None


def test_a_running_jobs_summary_carries_its_estimate(tmp_path, monkeypatch):
    """jobs.report.job_summary: the job's own finishes (the queue's record of them) and what remains."""
    import jobs.queue.records as records
    from jobs.document import SegmentText
    from jobs.queue import Queue
    from jobs.report import job_summary
    from jobs.settings import JobSpec

    q = Queue(tmp_path / "queue.db")
    job = q.add_job(JobSpec(), [("One", [SegmentText("x" * 30, "x" * 30) for _ in range(40)])])
    rows = q.claim("w", 40, lease_s=600)
    assert job_summary(q, job)["eta"] is None
    start = time.time() - 100
    for i, r in enumerate(rows[:20]):  # one every 5 s
        monkeypatch.setattr(records, "_now", lambda i=i: start + 5.0 * i)
        q.complete(r["id"], f"k{i}", f"/nowhere/{i}.wav", 24000, 24000, 1)
    eta = job_summary(q, job)["eta"]
    assert eta["rate"] == pytest.approx(30 / 5, rel=0.01) and eta["left_s"] == pytest.approx(20 * 5, rel=0.01)
    assert eta["at"] == pytest.approx(start + 95) and eta["finish_at"] == pytest.approx(start + 195)
    q.close()
