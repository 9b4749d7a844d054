"""What the queue keeps for listeners and their library, on SQLite and PostgreSQL alike: where the listener
stopped in each book (schema step 9, jobs.queue.positions), and what a job summary's length and time left are
read from (jobs.queue.progress, jobs.report)."""
from __future__ import annotations

import json
import time

import pytest

from jobs.document import SegmentText
from jobs.queue import Queue
from jobs.report import job_summary
from jobs.settings import JobSpec


@pytest.fixture
def q(location):
    queue = Queue(location)
    yield queue
    queue.close()


def _book(q, speed=1.0, meta=None) -> str:
    chapters = [("One", [SegmentText("First sentence here.", "First sentence here.", 300),
                         SegmentText("Second one.", "Second one.", 0)]),
                ("Two", [SegmentText("Third and last.", "Third and last.", 500)])]
    return q.add_job(JobSpec(speed=speed, author="A. Writer", title="Book"), chapters, meta=meta)


def _finish(q, rows, seconds):
    for r, s in zip(rows, seconds):
        assert q.complete(r["id"], f"k{r['id']}", f"/nowhere/{r['id']}.wav", 24000, int(s * 24000), 1)


def test_a_books_place_is_kept_and_replaced(q):
    job, other = _book(q), _book(q)
    assert q.position(job) is None
    before = time.time()
    saved = q.set_position(job, 12.5, 1)
    assert saved["position_s"] == 12.5 and saved["chapter"] == 1 and saved["updated_at"] >= before
    assert q.position(job) == saved
    q.set_position(job, 3.25)  # another player went back: the latest place counts
    got = q.position(job)
    assert got["position_s"] == 3.25 and got["chapter"] is None and got["updated_at"] >= saved["updated_at"]
    assert q.position(other) is None  # one place per book


def test_the_place_is_read_by_another_connection_and_forgotten(q):
    job = _book(q)
    q.set_position(job, 40.0, 0)
    other = Queue(q.path)
    try:
        assert other.position(job)["position_s"] == 40.0  # stored on the appliance, not in one process
        other.forget_position(job)
    finally:
        other.close()
    assert q.position(job) is None


def test_totals_and_finishes_of_a_job(q):
    """(what a library reads of every job every few seconds: from an index, not the segments' text)"""
    job = _book(q, speed=2.0)
    rows = q.claim("w", 10, lease_s=60)
    totals = q.segment_totals(job)
    assert totals == {"leased": {"segments": 3, "audio_s": 0.0, "pause_ms": 800}}
    assert q.text_chars(job, ("queued", "leased")) == 46
    _finish(q, rows[:2], [2.0, 1.0])
    assert [c for _, c in q.finishes(job)] == [20, 11]
    times = [t for t, _ in q.finishes(job)]
    assert times == sorted(times) and times[-1] <= time.time()
    totals = q.segment_totals(job)
    assert totals["done"] == {"segments": 2, "audio_s": pytest.approx(3.0), "pause_ms": 300}
    assert q.text_chars(job, ("queued", "leased")) == 15 and q.text_chars(job, ("done",)) == 31
    s = job_summary(q, job)
    assert s["author"] == "A. Writer" and s["cover"] is False
    assert s["progress"] == {"done": 2, "total": 3, "queued": 0, "leased": 1, "failed": 0, "cancelled": 0}
    assert s["length"] == {"seconds": pytest.approx(46 / 15 / 2 + 0.8, abs=0.05), "measured": False}
    _finish(q, rows[2:], [4.0])
    q.finish_job(job, "done")
    # the book's audio: each segment at the job's speed, the pauses as they are
    assert job_summary(q, job)["length"] == {"seconds": pytest.approx((2 + 1 + 4) / 2 + 0.8), "measured": True}


def test_the_estimate_made_at_submit_is_the_length_until_the_book_is_made(q):
    job = _book(q, meta={"audio_estimate_s": 123.4})
    assert job_summary(q, job)["length"] == {"seconds": 123.4, "measured": False}
    assert json.loads(q.job(job)["meta"])["audio_estimate_s"] == 123.4
