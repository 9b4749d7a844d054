"""Finishing a book never stops the queue (jobs.assembler): while one job's book is being written, the
worker leases and synthesizes other jobs' segments and finishes their books; a job is done only once
its book is written."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from test_queue import ToneEngine, _chapters

from jobs.assemble import BookWriter
from jobs.queue import Queue, QueueUnavailable
from jobs.settings import JobSpec, resolve_home
from jobs.worker import Worker


def _wait(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


@contextmanager
def _running(q, paths, lease_s: float = 120.0):
    """A worker on the tone double running (run_forever) on a thread for the block, on a queue connection of
    its own (`q` stays the test's) -> the worker; the thread is stopped and must end after it."""
    worker = Worker(Queue(q.path), ToneEngine(), paths, batch_size=4, lease_s=lease_s, heartbeat_s=0.2)
    stop = threading.Event()
    t = threading.Thread(target=worker.run_forever, args=(stop, 0.05), daemon=True)
    t.start()
    try:
        yield worker
    finally:
        stop.set()
        t.join(60)
    assert not t.is_alive()


def test_a_book_being_written_does_not_hold_up_other_jobs(tmp_path, monkeypatch):
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(paths.db)
    big = q.add_job(JobSpec(format="wav", title="Big"), _chapters(2, 3))
    writing, release = threading.Event(), threading.Event()
    finish = BookWriter.finish

    def slow_finish(writer):  # the big book's file takes long to close (a long m4b, a slow disk)
        if writer.out_dir.name == big:
            writing.set()
            release.wait(3600)  # (set by the test once it has seen the small job done)
        return finish(writer)

    monkeypatch.setattr(BookWriter, "finish", slow_finish)
    with _running(q, paths) as worker:
        try:
            assert writing.wait(300), "the big book's assembly never began"
            small = q.add_job(JobSpec(format="wav", title="Small"), _chapters(1, 2, prefix="Short"))
            assert _wait(lambda: q.job(small)["state"] == "done", 300), (
                f"a 2-segment job was not finished while another book was written: {q.counts(small)}, "
                f"{q.job(small)['state']}")
            assert q.job(big)["state"] == "running"  # not done before its book is written
            assert big in worker.books() and worker.books()[big]["assembling"]
        finally:
            release.set()
    assert q.job(big)["state"] == "done" and (paths.output / big / "Big.wav").is_file()
    q.close()


def test_an_assembly_that_stopped_on_an_error_is_taken_again_by_its_worker(tmp_path, monkeypatch):
    """An assembly that raised before its job ended (the queue went away as it recorded the end) leaves the
    job running with this worker's assembly lease: the same worker takes it again, not only a restart."""
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(paths.db)
    job = q.add_job(JobSpec(format="wav", title="Once"), _chapters(1, 2))
    calls = []
    finish_job = Queue.finish_job

    def flaky(self, *a, **k):
        calls.append(a)
        if len(calls) == 1:
            raise QueueUnavailable("the queue went away")
        return finish_job(self, *a, **k)

    monkeypatch.setattr(Queue, "finish_job", flaky)
    with _running(q, paths, lease_s=3600):  # (an hour: longer than the wait, a failure guard, allows)
        assert _wait(lambda: q.job(job)["state"] == "done", 300), q.job(job)
    assert len(calls) == 2
    q.close()


def test_a_worker_that_dies_does_not_wait_for_its_books_and_they_are_still_finished(tmp_path, monkeypatch):
    """A worker thread that dies of an error ends at once (the daemon starts another), while the book it was
    finishing is completed, its assembly lease renewed until then."""
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(paths.db)
    job = q.add_job(JobSpec(format="wav", title="Long"), _chapters(1, 2))
    writing, release = threading.Event(), threading.Event()
    finish = BookWriter.finish
    monkeypatch.setattr(BookWriter, "finish", lambda w: (writing.set(), release.wait(3600), finish(w))[2])
    worker = Worker(Queue(q.path), ToneEngine(), paths, batch_size=4, heartbeat_s=0.2)  # (a connection per thread)

    def work():
        try:
            worker.run_forever(threading.Event(), 0.05)
        except ZeroDivisionError:
            pass  # (the daemon's supervisor logs it and starts another worker)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    try:
        assert writing.wait(300)
        worker.run_once = lambda *a: 1 / 0  # the worker's thread dies of a bug
        t.join(300)  # (the book waits for `release`, set only after this: a thread that waited would be alive)
        assert not t.is_alive(), "the dead worker's thread waited for the book being finished"
        assert q.job(job)["state"] == "running"
    finally:
        release.set()
    assert _wait(lambda: q.job(job)["state"] == "done", 300)
    q.close()
