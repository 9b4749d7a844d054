"""The queue's own tables behind its methods, one behaviour on SQLite and PostgreSQL: the inbox's files
(jobs.watch), idempotent submit claims (jobs.submit), jobs by source file, the synthesis history
(preview's measured rate) and reading a queue for a report without creating or changing it (info)."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from jobs.document import SegmentText
from jobs.queue import Queue
from jobs.queue.submissions import holder
from jobs.settings import JobSpec


def _chapters():
    return [("One", [SegmentText("A sentence is spoken here.", "A sentence.", 200)])]


@pytest.fixture
def q(location):
    queue = Queue(location)
    yield queue
    queue.close()


def test_inbox_files_are_recorded_found_and_filed(q, tmp_path):
    src = str(tmp_path / "processing" / "book.txt")
    q.record_inbox_file("d1", "book.txt", None, "ingesting", src)
    assert q.inbox_file("d1")["state"] == "ingesting" and q.inbox_file("other") is None
    job = q.add_job(JobSpec(), _chapters(), [src])
    q.record_inbox_file("d1", "book.txt", job, "processing", src, src + ".yaml")  # the same content: one row
    [row] = q.inbox_files()
    assert (row["job_id"], row["state"], row["sidecar"], row["reason"]) == (job, "processing", src + ".yaml", None)
    assert q.inbox_files_of_ended_jobs() == []  # its job still runs
    q.finish_job(job, "done", output_dir="/out/book")
    [ended] = q.inbox_files_of_ended_jobs()
    assert (ended["sha256"], ended["job_state"], ended["job_error"], ended["out"]) == ("d1", "done", None, "/out/book")
    q.inbox_file_filed("d1", "done")
    assert q.inbox_files_of_ended_jobs() == [] and q.inbox_file("d1")["state"] == "done"
    assert q.inbox_file("d1")["finished_at"] >= row["taken_at"]


def test_submission_claims(q):
    job_id, mine = q.claim_submission("k")
    assert mine and q.claim_submission("k") == (job_id, False)  # a second submit: the first one's job id
    assert q.wait_for_job(job_id, 0.0) is None  # not queued yet
    q.add_job(JobSpec(), _chapters(), job_id=job_id)
    assert q.wait_for_job(job_id, 0.0)["id"] == job_id and q.claim_submission("k") == (job_id, False)
    q.fail_job(job_id, "bad voice")
    renewed, mine = q.claim_submission("k")  # a failed job's key is claimed anew
    assert mine and renewed != job_id
    q.release_submission("k", renewed)  # the submit raised before queuing: the claim goes
    again, mine = q.claim_submission("k")
    assert mine and again != renewed


def test_a_dead_holders_claim_is_taken_over(q):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with q.tx() as c:
        c.execute("INSERT INTO submissions (key, job_id, holder, claimed_at) VALUES (?, ?, ?, ?)",
                  ("k", "abandoned123", holder(dead.pid), time.time()))
    assert q.claim_submission("k") == ("abandoned123", True)
    assert q.claim_submission("k") == ("abandoned123", False)  # held by this live process now


def test_job_from_source(q, tmp_path):
    src = str(tmp_path / "processing" / "Bücher über Straßen.txt")  # stored escaped in the job's sources
    since = time.time() - 1
    job = q.add_job(JobSpec(), _chapters(), [str(tmp_path / "other.txt"), src])
    assert q.job_from_source(src, since)["id"] == job
    assert q.job_from_source(src, time.time() + 60) is None  # made before the file was taken
    assert q.job_from_source(str(tmp_path / "processing" / "Bücher.txt"), since) is None


def test_reading_creates_nothing_and_changes_nothing(location):
    with Queue.reading(location) as none:
        assert none is None  # no queue there yet
    with Queue.reading(location) as none:
        assert none is None  # and reading made none
    made = Queue(location)
    job = made.add_job(JobSpec(), _chapters())
    with Queue.reading(location) as q:
        assert q.job_counts() == {"queued": 1}
        with pytest.raises(Exception, match="read-only|readonly"):  # each database in its words
            q.event(job, "a report writes nothing")
    assert [e["message"] for e in made.events(job)] == ["submitted: 1 segments in 1 chapters"]
    made.close()
