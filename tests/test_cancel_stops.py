"""A cancelled (or deleted) job's segments stop in the engine (jobs.inflight): their requests are cancelled
there, they leave the worker's count at once so a priority-10 job gets the room, and a shutdown does not wait
for them. The engine double here is fed continuously like the real one (`running`, `submit` -> handle) and
never ends a request by itself: only a test or a cancel does, as a long segment in a busy engine."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from daemon_util import Daemon, base_config, book_text, skip_reason
from test_queue import _chapters

from appliance.client import DaemonClient

from jobs.queue import Queue
from jobs.settings import JobSpec, resolve_home
from jobs.worker import Worker


class Handle:
    def __init__(self, request):
        self.request, self.done, self.cancelled, self.on_done = request, False, False, None

    def cancel(self):
        self.cancelled = True  # the engine frees its slot at its next step; the worker must not wait for it

    def end(self):
        from engines.api import SynthesisResult

        n = 24000 * max(1, len(self.request.text) // 15)
        self.audio = (0.3 * np.sin(np.arange(n) * 0.05)).astype(np.float32)
        self.result = lambda: SynthesisResult(self.audio, 24000, np.zeros((1, 16), np.int64), True)
        self.done = True
        if self.on_done:
            self.on_done(self)


class SlowEngine:
    """Takes requests at once, ends them only when `finish` is called."""

    sample_rate, voices, languages, model_id, running = 24000, ["tone"], ["auto"], "slow-double", True

    def __init__(self):
        self.handles: list[Handle] = []
        self.lock = threading.Lock()

    def submit(self, request, priority=0):
        h = Handle(request)
        with self.lock:
            self.handles.append(h)
        return h

    def of(self, word: str) -> list[Handle]:
        with self.lock:
            return [h for h in self.handles if word in h.request.text]

    def finish(self, word: str) -> None:
        for h in self.of(word):
            if not h.done and not h.cancelled:
                h.end()


def _until(cond, what: str, worker=None, timeout: float = 300.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"never: {what}"
        if worker is not None:
            worker.run_once(wait_s=0.05)
        else:
            time.sleep(0.02)


def _setup(tmp_path):
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(paths.db)
    book = q.add_job(JobSpec(format="wav", title="Book"), _chapters(2, 4, prefix="Bookword"))
    engine = SlowEngine()
    worker = Worker(Queue(paths.db), engine, paths, batch_size=4, heartbeat_s=0.2)
    return paths, q, book, engine, worker


def test_a_cancelled_jobs_segments_stop_in_the_engine_and_a_priority_job_gets_the_room(tmp_path):
    paths, q, book, engine, worker = _setup(tmp_path)
    worker.run_once(wait_s=0.01)
    assert len(engine.of("Bookword")) == 4  # the book fills the batch
    urgent = q.add_job(JobSpec(format="wav", title="Urgent", priority=10), _chapters(1, 2, prefix="Urgentword"))
    worker.run_once(wait_s=0.01)
    assert engine.of("Urgentword") == []  # no room while the book's segments run
    q.cancel(book)  # from another connection (the CLI, another host): the worker learns it from the queue
    _until(lambda: len(engine.of("Urgentword")) == 2, "the priority job's segments reached the engine", worker)
    assert all(h.cancelled for h in engine.of("Bookword")), "the cancelled book's requests still run in the engine"
    assert not worker.heartbeat._held & {s["id"] for s in q.segments(book)}
    engine.finish("Urgentword")
    _until(lambda: q.job(urgent)["state"] == "done", "the priority job done", worker)
    assert q.job(book)["state"] == "cancelled" and q.counts(book)["done"] == 0
    worker.close()
    q.close()


def test_the_daemon_tells_the_worker_at_once(tmp_path):
    """`Worker.job_ended` (the daemon's cancel and delete routes): the next iteration stops the job's requests,
    without asking the queue."""
    paths, q, book, engine, worker = _setup(tmp_path)
    worker.run_once(wait_s=0.01)
    q.cancel(book)
    worker._inflight._checked = time.monotonic() + 3600  # the queue is not asked again for an hour
    worker.job_ended(book)
    worker.run_once(wait_s=0.01)
    assert all(h.cancelled for h in engine.of("Bookword")) and not worker._inflight
    worker.close()
    q.close()


def test_a_shutdown_does_not_wait_for_a_cancelled_jobs_segments(tmp_path):
    paths, q, book, engine, worker = _setup(tmp_path)
    stop = threading.Event()
    t = threading.Thread(target=worker.run_forever, args=(stop, 0.05), daemon=True)
    t.start()
    _until(lambda: len(engine.of("Bookword")) == 4, "the book's segments in the engine")
    q.cancel(book)
    worker.job_ended(book)
    stop.set()
    t.join(60)
    assert not t.is_alive(), "the shutdown waited for the cancelled job's segments"
    assert all(h.cancelled for h in engine.of("Bookword"))
    q.close()


def test_a_segment_shared_with_a_running_job_goes_on_for_it(tmp_path):
    """Two jobs with the same words share one request (same audio key): cancelling one leaves it running."""
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(paths.db)
    one = q.add_job(JobSpec(format="wav", title="One"), _chapters(1, 1, prefix="Sameword"))
    two = q.add_job(JobSpec(format="wav", title="Two"), _chapters(1, 1, prefix="Sameword"))
    engine = SlowEngine()
    worker = Worker(Queue(paths.db), engine, paths, batch_size=4, heartbeat_s=0.2)
    worker.run_once(wait_s=0.01)
    assert len(engine.of("Sameword")) == 1
    q.cancel(one)
    worker.job_ended(one)
    worker.run_once(wait_s=0.01)
    assert not engine.of("Sameword")[0].cancelled
    engine.finish("Sameword")
    _until(lambda: q.job(two)["state"] == "done", "the other job done", worker)
    worker.close()
    q.close()


@pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
def test_in_the_daemon_a_cancelled_book_leaves_the_engine_to_a_priority_job_and_the_stop_does_not_wait(tmp_path):
    """The real thing: an engine process, a book of long segments (2000 frames each, no early end) filling the
    worker's 4 slots, a priority-10 job waiting behind it. `cancel` frees the engine's slots (its requests are
    cancelled there), the priority job is synthesized, and a stop right after a second cancel neither waits
    for the cancelled segments nor gives anything "back to the queue"."""
    cfg = base_config(tmp_path, jobs={"batch_size": 4}, runtime={"max_slots": 4, "max_context": 2100},
                      service={"stop_timeout_s": 600.0})
    daemon = Daemon(tmp_path, cfg).start()
    long = {"voice": "ryan", "sampling": {"max_new_tokens": 2000, "min_new_tokens": 2000}}
    try:
        book = tmp_path / "book.txt"
        book.write_text(book_text(8))
        client = DaemonClient(daemon.socket)
        job_id, err = client.submit_file(book, JobSpec(**long))
        assert err is None
        _until(lambda: daemon.get("/health")[1]["engine"]["active_slots"] == 4, "the book in the engine's 4 slots")
        urgent = tmp_path / "urgent.txt"
        urgent.write_text(book_text(2).replace("Alpha", "Urgent"))
        urgent_id, err = client.submit_file(urgent, JobSpec(voice="ryan", priority=10, sampling={"max_new_tokens": 4}))
        assert err is None
        assert daemon.post(f"/v1/jobs/{job_id}/cancel", {})[0] == 200
        assert daemon.wait_job(urgent_id, timeout=300)["state"] == "done"
        s = daemon.get(f"/v1/jobs/{job_id}")[1]
        assert s["state"] == "cancelled" and s["progress"]["done"] == 0, s  # none of its long segments ran out

        again = tmp_path / "again.txt"
        again.write_text(book_text(8).replace("Alpha", "Again"))
        job2, err = client.submit_file(again, JobSpec(**long))
        _until(lambda: daemon.get("/health")[1]["engine"]["active_slots"] == 4, "the second book in the engine")
        assert daemon.post(f"/v1/jobs/{job2}/cancel", {})[0] == 200
    finally:
        code = daemon.stop(timeout=120)
    log = daemon.log_text()
    assert code == 0, log[-3000:]
    assert "back to the queue" not in log and "stop timeout" not in log, log[-3000:]
    assert "segment(s) stopped in the engine" in log
