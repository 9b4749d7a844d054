"""Queue mechanics: claims, leases, heartbeat, attempts, priority, migrations, several processes.

The runner tests at the end use a deterministic tone double (only for queue/lease/guard
mechanics; the real engine is exercised in test_book_e2e.py).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from jobs.document import SegmentText
from jobs.queue import MIGRATIONS, Queue, QueueError
from jobs.queue.outage import Outage
from jobs.guard import GuardSettings, check_audio
from jobs.heartbeat import Heartbeat
from jobs.worker import Worker
from jobs.settings import JobSpec, resolve_home


def _chapters(n_chapters=2, per=3, prefix="Sentence"):
    return [(f"Chapter {c + 1}", [SegmentText(f"{prefix} {c}-{i} is spoken here.", f"{prefix} {c}-{i}.", 200)
                                  for i in range(per)]) for c in range(n_chapters)]


@pytest.fixture
def q(location):
    queue = Queue(location, max_attempts=3)
    yield queue
    queue.close()


def test_migrations_recorded_once(location):
    q1 = Queue(location)
    ids = [m["id"] for m in q1.migrations()]
    assert ids == [n for n, _, _ in MIGRATIONS]
    q1.close()
    q2 = Queue(location)
    assert [m["id"] for m in q2.migrations()] == ids
    if q2.store.dialect == "sqlite":
        assert q2.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    q2.close()


def test_schema_from_a_newer_version_is_refused(location):
    q1 = Queue(location)
    q1.event(None, "x")
    with q1.tx() as c:
        c.execute("INSERT INTO migrations (id, name, applied_at) VALUES (99, 'future', 0)")
    q1.close()
    with pytest.raises(QueueError, match="schema version 99, newer than this tts-appliance knows"):
        Queue(location)


def test_claims_are_exclusive_and_counted(q):
    job = q.add_job(JobSpec(), _chapters(1, 5))
    a = q.claim("w1", 3, lease_s=60)
    b = q.claim("w2", 3, lease_s=60)
    assert [r["idx"] for r in a] == [0, 1, 2] and [r["idx"] for r in b] == [3, 4]
    assert q.claim("w3", 3, lease_s=60) == []
    assert all(r["attempts"] == 1 and r["worker_id"] == "w1" and r["lease_expires"] > time.time() for r in a)
    assert q.job(job)["state"] == "running"
    assert q.counts(job)["leased"] == 5


def test_expired_lease_returns_to_queue(q):
    q.add_job(JobSpec(), _chapters(1, 2))
    first = q.claim("dead", 2, lease_s=0.05)
    time.sleep(0.15)
    again = q.claim("alive", 2, lease_s=60)
    assert {r["id"] for r in again} == {r["id"] for r in first}
    # the expired attempt was lost with its worker: it does not count, it is counted apart
    assert all(r["attempts"] == 1 and r["lost"] == 1 and r["worker_id"] == "alive" for r in again)
    assert all("expired" in r["last_error"] and "not counted" in r["last_error"] for r in again)


def test_leases_taken_back_from_another_host_are_logged(q, caplog):
    import logging

    q.add_job(JobSpec(), _chapters(1, 3))
    q.claim("far-worker", 2, lease_s=-1)  # a lease that has already run out
    with q.tx() as c:  # held by a worker of another host
        c.execute("UPDATE workers SET host = 'other-host', pid = 4242 WHERE id = 'far-worker'")
    with caplog.at_level(logging.INFO, logger="jobs.queue"):
        assert len(q.claim("near", 3, lease_s=60)) == 3
    assert [r.getMessage() for r in caplog.records if "took back" in r.getMessage()] == [
        "took back 2 segment lease(s) of worker far-worker (host other-host, pid 4242): its lease expired"]


def test_workers_unseen_for_a_lease_holding_nothing_are_forgotten(q):
    job = q.add_job(JobSpec(), _chapters(1, 2))
    q.claim("holder", 1, lease_s=3600)
    idle = q.claim("idle", 1, lease_s=3600)
    q.release("idle", [r["id"] for r in idle])
    q.renew("assembler", [], lease_s=3600)
    with q.tx() as c:  # "assembler" holds the right to assemble the job; all are on another host, unseen for an hour
        c.execute("UPDATE jobs SET assembly_worker = 'assembler', assembly_expires = ? WHERE id = ?",
                  (time.time() + 3600, job))
        c.execute("UPDATE workers SET host = 'other-host', seen_at = ?", (time.time() - 3600,))
    q.claim("me", 1, lease_s=60)
    assert {r["id"] for r in q._rows("SELECT id FROM workers")} == {"holder", "assembler", "me"}
    q.renew("idle", [], lease_s=60)  # a worker forgotten while cut off registers again with its heartbeat
    assert "idle" in {r["id"] for r in q._rows("SELECT id FROM workers")}


def _lease_ends(q, rows) -> list[float]:
    ids = [r["id"] for r in rows]
    return [r["lease_expires"] for r in q.segments(rows[0]["job_id"]) if r["id"] in ids]


def _until(cond, what: str, limit: float = 300.0) -> None:
    """Wait for `cond()`; `limit` is a failure guard, not a time the test relies on."""
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def test_heartbeat_keeps_lease_alive(q):
    """Past the end of the lease its claim gave, the heartbeat's renewals hold the segments; once it stops
    they run out. Each step waits for what the renewals wrote, not for the heartbeat to keep time."""
    q.add_job(JobSpec(), _chapters(1, 2))
    rows = q.claim("w1", 2, lease_s=0.5)
    claimed_until = max(_lease_ends(q, rows))
    hb = Heartbeat(q.path, "w1", lease_s=3600, interval_s=0.05)
    hb.hold([r["id"] for r in rows])
    hb.start()
    _until(lambda: min(_lease_ends(q, rows)) > claimed_until + 1000, "the heartbeat renewed the leases")
    _until(lambda: time.time() > claimed_until + 0.1, "the claim's lease over")
    assert q.claim("w2", 2, lease_s=60) == []  # still held thanks to the heartbeat
    hb.lease_s = 0.2  # its next renewals end soon after them
    _until(lambda: max(_lease_ends(q, rows)) < time.time() + 1000, "a short renewal")
    hb.stop()
    hb.join(300)
    assert not hb.is_alive()
    ended = max(_lease_ends(q, rows))  # the last renewal's: nothing renews them any more
    _until(lambda: time.time() > ended + 0.05, "the last lease over")
    assert len(q.claim("w2", 2, lease_s=60)) == 2


def test_attempts_end_in_failed_and_job_reports(q):
    job = q.add_job(JobSpec(), [("One", [SegmentText("a", "a"), SegmentText("b", "b")])])
    for _ in range(3):
        row = next(r for r in q.claim("w", 2, lease_s=60) if r["idx"] == 0)
        other = [r for r in q.segments(job) if r["idx"] == 1 and r["state"] == "leased"]
        for o in other:
            q.complete(o["id"], "k-b", "/nonexistent.wav", 24000, 24000, 0)
        state = q.fail(row["id"], "engine exploded")
    assert state == "failed"
    seg = q.segments(job)[0]
    assert seg["state"] == "failed" and "gave up after 3 attempts" in seg["last_error"]
    assert q.ready_jobs() == [job]
    q.finish_job(job, "partial", error="1 of 2 segments failed")
    assert q.job(job)["state"] == "partial"
    assert q.retry(job) == 1 and q.job(job)["state"] == "queued"


def test_lost_leases_end_failed_only_at_max_lost(location):
    q = Queue(location, max_attempts=1, max_lost=2)
    job = q.add_job(JobSpec(), [("One", [SegmentText("a", "a")])])
    q.claim("dead", 1, lease_s=0.01)
    time.sleep(0.05)
    assert len(q.claim("dead2", 1, lease_s=0.01)) == 1  # max_attempts=1, yet the lost lease did not use it up
    time.sleep(0.05)
    assert q.claim("w", 1, lease_s=60) == []
    seg = q.segments(job)[0]
    assert seg["state"] == "failed" and "expired" in seg["last_error"] and "2 workers died" in seg["last_error"]
    q.close()


def test_priority_orders_claims_and_fills_batch(q):
    low = q.add_job(JobSpec(priority=0), _chapters(1, 3, "low"))
    high = q.add_job(JobSpec(priority=5), _chapters(1, 2, "high"))
    rows = q.claim("w", 4, lease_s=60)
    assert [r["job_id"] for r in rows] == [high, high, low, low]


def test_claims_share_workers_between_jobs_of_one_priority(q):
    """A huge book queued first does not hold back a 2-segment job: each claim hands segments to the job
    with the fewest in work, then the oldest; within a job they go in order."""
    big = q.add_job(JobSpec(), _chapters(4, 50, "big"))  # 200 segments
    small = q.add_job(JobSpec(), _chapters(1, 2, "small"))
    first = q.claim("w1", 8, lease_s=60)
    assert [r["job_id"] for r in first] == [big, small, big, small, big, big, big, big]
    assert [r["idx"] for r in first if r["job_id"] == big] == [0, 1, 2, 3, 4, 5]
    assert q.counts(small)["leased"] == 2
    medium = q.add_job(JobSpec(), _chapters(1, 10, "medium"))
    rows = q.claim("w2", 8, lease_s=60)  # big has 6 in work, medium none: medium catches up first
    assert [r["job_id"] for r in rows] == [medium] * 6 + [big, medium]
    urgent = q.add_job(JobSpec(priority=5), _chapters(1, 3, "urgent"))
    assert [r["job_id"] for r in q.claim("w3", 4, lease_s=60)] == [urgent] * 3 + [big]  # 7 in work each: the older


def test_a_large_submit_lets_other_writers_in_and_hides_half_a_job(tmp_path, monkeypatch):
    """SQLite has one writer: a book of thousands of segments is written in short transactions with the job
    row last, so a worker recording audio on another connection gets in between them (instead of waiting
    for the whole book, past its busy timeout: "database is locked") and never claims half a job."""
    from jobs.queue import core

    monkeypatch.setattr(core, "INSERT_ROWS", 50, raising=False)
    db = tmp_path / "queue.db"
    adder, worker = Queue(db), Queue(db, busy_timeout_s=0.2)
    adder.add_job(JobSpec(), _chapters(1, 20, "other"))
    held = worker.claim("w", 20, lease_s=60)
    seen = []  # (segments of the big job already written, what a claim got, an error) at each transaction start

    def between(sql: str) -> None:  # runs on the adder's connection as each of its statements starts
        if not sql.lstrip().upper().startswith("BEGIN") or not held:
            return
        r = held.pop()
        try:
            assert worker.complete(r["id"], f"k{r['id']}", "/a.wav", 24000, 100, 0)
            n = worker._rows("SELECT COUNT(*) AS n FROM segments WHERE job_id = 'bigbook'")[0]["n"]
            seen.append((n, [c["job_id"] for c in worker.claim("w2", 4, lease_s=60)], None))
        except Exception as exc:  # noqa: BLE001 - recorded: an exception in a trace callback is swallowed
            seen.append((None, None, exc))

    adder.conn.set_trace_callback(between)
    adder.add_job(JobSpec(), _chapters(4, 100, "big"), job_id="bigbook")
    adder.conn.set_trace_callback(None)
    assert all(err is None for _, _, err in seen), seen
    assert any(0 < n < 400 for n, _, _ in seen), seen  # the worker wrote while the book was half written
    assert all(claimed == [] for _, claimed, _ in seen), seen  # ... and could not claim any of it
    assert [r["job_id"] for r in worker.claim("w2", 2, lease_s=60)] == ["bigbook"] * 2
    adder.close()
    worker.close()


def test_opening_and_reading_the_queue_does_not_wait_for_a_writer(tmp_path):
    """An up-to-date schema is only read at open: the status probe, /health and every API call open a queue,
    and must not wait (5 s, then "database is locked") while another connection writes."""
    import sqlite3

    db = tmp_path / "queue.db"
    Queue(db).close()
    locker = sqlite3.connect(str(db), isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    locker.execute("INSERT INTO events (job_id, ts, level, message) VALUES (NULL, 0, 'info', 'x')")
    try:
        q = Queue(db, busy_timeout_s=0.2)
        assert q.counts()["queued"] == 0 and q.job_counts() == {}
        q.close()
    finally:
        locker.execute("ROLLBACK")
        locker.close()


def test_add_job_leaves_no_half_job(q, monkeypatch):
    """A submit that fails half-way leaves no rows; rows a crashed one left are removed when its reserved
    job id is added again."""
    from jobs.queue import core

    monkeypatch.setattr(core, "INSERT_ROWS", 3, raising=False)
    chapters = _chapters(2, 4)
    chapters[1][1][2] = SegmentText(None, "broken", 0)  # NOT NULL text: the third transaction fails
    with pytest.raises(Exception):
        q.add_job(JobSpec(), chapters, job_id="half")
    assert q.segments("half") == [] and q.chapters("half") == []
    with q.tx() as c:  # what a process killed in the middle of add_job leaves behind
        c.execute("INSERT INTO chapters (job_id, idx, title) VALUES ('half', 0, 'x')")
        c.execute("INSERT INTO segments (job_id, idx, chapter_idx, text, seed) VALUES ('half', 0, 0, 'x', 0)")
    assert q.add_job(JobSpec(), _chapters(2, 4), job_id="half") == "half"
    assert len(q.segments("half")) == 8 and q.segments("half")[0]["text"] == "Sentence 0-0 is spoken here."


def test_model_filter(q):
    q.add_job(JobSpec(model="/models/a"), _chapters(1, 1))
    assert q.claim("w", 4, lease_s=60, model="/models/b") == []
    assert len(q.claim("w", 4, lease_s=60, model="/models/a")) == 1


def test_cancel_retry_redo(q):
    job = q.add_job(JobSpec(), _chapters(1, 3))
    q.cancel(job)
    assert q.job(job)["state"] == "cancelled" and q.counts(job)["cancelled"] == 3
    with pytest.raises(QueueError):
        q.cancel(job)
    assert q.retry(job) == 3
    seed = q.redo(job, 1, seed=77)
    assert seed == 77 and q.segments(job)[1]["seed"] == 77
    with pytest.raises(QueueError, match="no segment 99"):
        q.redo(job, 99)


def _drain(db, worker, out, go, both=None):
    """Claim and complete segments until none is left; `both` (a barrier of the two drainers): wait after the
    first claim until the other has one too, so that both work however late either process starts."""
    q = Queue(db)
    go.wait(300)
    mine = []
    while True:
        rows = q.claim(worker, 3, lease_s=60)
        if not rows:
            break
        if both is not None and not mine:
            both.wait(300)
        for r in rows:
            mine.append(r["id"])
            time.sleep(0.002)  # "synthesis"
            assert q.complete(r["id"], f"key-{r['id']}", f"/a/{r['id']}.wav", 24000, 100, 0)
    q.close()
    out.put((worker, mine))


def test_two_processes_drain_one_queue_without_double_work(location):
    db = location
    q = Queue(db)
    for j in range(4):
        q.add_job(JobSpec(priority=j % 2), _chapters(5, 10, f"job{j}"))
    total = len(q._rows("SELECT id FROM segments"))
    ctx = mp.get_context("spawn")
    out, go, both = ctx.Queue(), ctx.Event(), ctx.Barrier(2)
    procs = [ctx.Process(target=_drain, args=(str(db), f"w{i}", out, go, both)) for i in range(2)]
    for p in procs:
        p.start()
    go.set()
    results = dict(out.get(timeout=600) for _ in procs)  # (a failure guard)
    for p in procs:
        p.join(60)
    a, b = results["w0"], results["w1"]
    assert not set(a) & set(b), "a segment was claimed by both workers"
    assert len(a) + len(b) == total and a and b
    assert q.counts()["done"] == total
    q.close()


class ToneEngine:
    """Deterministic tone double (queue/guard mechanics only): 1 s of tone per 15 characters."""

    sample_rate = 24000
    voices = ["tone"]
    languages = ["auto"]
    model_id = "tone-double"

    def __init__(self):
        self.calls = []

    def synthesize(self, requests):
        from engines.api import SynthesisResult

        out = []
        for r in requests:
            self.calls.append((r.text, r.sampling.seed))
            n = int(self.sample_rate * max(1.0, len(r.text) / 15))
            amp = 0.0 if "SILENT" in r.text else 0.3
            audio = (amp * np.sin(np.arange(n) * 2 * np.pi * 220 / self.sample_rate)).astype(np.float32)
            out.append(SynthesisResult(audio, self.sample_rate, np.zeros((1, 16), np.int64), True))
        return out


def test_guard_rejects_silence_and_runaway():
    g = GuardSettings()
    sr = 24000
    tone = (0.3 * np.sin(np.arange(sr * 2) * 0.05)).astype(np.float32)
    assert check_audio(tone, sr, "x" * 30, "english", g) is None
    assert "silent" in check_audio(np.zeros(sr * 2, np.float32), sr, "x" * 30, "english", g)
    assert "runaway" in check_audio(np.tile(tone, 10), sr, "x" * 30, "english", g)


def test_runner_guard_retries_other_seed_then_fails(tmp_path):
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(paths.db, max_attempts=3)
    job = q.add_job(JobSpec(seed=5, format="wav"), [("One", [SegmentText("Fine words to say here.", "o", 100),
                                                             SegmentText("SILENT words here.", "s", 100)])])
    eng = ToneEngine()
    runner = Worker(q, eng, paths, batch_size=4, heartbeat_s=0.2)
    while runner.run_once():
        pass
    runner.close()
    seeds = [s for t, s in eng.calls if t.startswith("SILENT")]
    assert len(seeds) == 3 and len(set(seeds)) == 3  # each retry used another seed
    segs = q.segments(job)
    assert segs[0]["state"] == "done" and segs[1]["state"] == "failed"
    assert "silent" in segs[1]["last_error"]
    assert q.job(job)["state"] == "partial"
    manifest = json.loads((paths.output / job / "manifest.json").read_text())
    assert manifest["failed_segments"][0]["index"] == 1
    # a resubmission of the same text reuses the cached audio: no new synthesis
    n = len(eng.calls)
    job2 = q.add_job(JobSpec(seed=5, format="wav"), [("One", [SegmentText("Fine words to say here.", "o", 100)])])
    runner = Worker(q, eng, paths, batch_size=4)
    while runner.run_once():
        pass
    runner.close()
    assert len(eng.calls) == n and q.job(job2)["state"] == "done"
    q.close()


def test_job_counts_by_state(q):
    a = q.add_job(JobSpec(), _chapters(1, 1))
    q.add_job(JobSpec(), _chapters(1, 1))
    q.cancel(a)
    assert q.job_counts() == {"queued": 1, "cancelled": 1}


def test_job_spec_parse_is_strict_and_round_trips():
    spec = JobSpec(voice="ryan", format="wav", priority=-5, sampling={"max_new_tokens": 4, "temperature": 0.5})
    assert JobSpec.parse(spec.to_json()) == spec
    assert JobSpec.parse(json.loads(spec.to_json())) == spec
    assert JobSpec.parse({"voice": None, "seed": None}) == JobSpec()  # null: the default
    assert JobSpec.parse({"sampling": {"top_p": 1}}).sampling == {"top_p": 1}  # an int is a float
    for bad, needle in [({"colour": "red"}, "unknown spec key(s) 'colour'; valid keys: voice (str)"),
                        ({"priority": "5"}, "spec key 'priority' must be int, got '5'"),
                        ({"seed": True}, "spec key 'seed' must be int"),
                        ({"sampling": []}, "spec key 'sampling' must be dict"),
                        ({"sampling": {"seed": 1}}, "unknown spec.sampling key(s) 'seed'"),
                        ({"sampling": {"do_sample": 1}}, "'do_sample' must be bool"),
                        ({"format": "aiff"}, "unknown format 'aiff'"),
                        ([1], "spec must be a JSON object"),
                        ("{nope", "spec is not valid JSON")]:
        with pytest.raises(ValueError) as exc:
            JobSpec.parse(bad)
        assert needle in str(exc.value), (bad, str(exc.value))


HOLDER = """
import sys, time
from jobs.queue import Queue
q = Queue(sys.argv[1])
print(len(q.claim("doomed", 5, lease_s=3600)), flush=True)
time.sleep(3600)
"""


def test_racing_workers_with_one_sigkilled_mid_lease(location):
    """Two drainers race while a third process holding leases is SIGKILLed: nothing lost, nothing twice."""
    q = Queue(location)
    for j in range(2):
        q.add_job(JobSpec(), _chapters(3, 10, f"job{j}"))
    total = len(q._rows("SELECT id FROM segments"))
    root = str(Path(__file__).resolve().parents[1])
    doomed = subprocess.Popen([sys.executable, "-c", HOLDER, str(location)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": root})
    assert doomed.stdout.readline().strip() == "5"
    ctx = mp.get_context("spawn")
    out, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_drain, args=(str(location), f"w{i}", out, go)) for i in range(2)]
    for p in procs:
        p.start()
    go.set()
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(60)
    results = dict(out.get(timeout=600) for _ in procs)  # (a failure guard)
    for p in procs:
        p.join(60)
    a, b = results["w0"], results["w1"]
    if len(a) + len(b) < total:  # the kill landed after both had finished: one more pass takes the 5 back
        rest = [r["id"] for r in q.claim("last", total, lease_s=60)]
        assert len(rest) == 5 and all(q.complete(i, f"key-{i}", "/a.wav", 24000, 100, 0) for i in rest)
        b = b + rest
    assert not set(a) & set(b) and len(a) + len(b) == total
    segs = q._rows("SELECT * FROM segments")
    assert all(s["state"] == "done" and s["attempts"] == 1 for s in segs)
    assert sum(s["lost"] for s in segs) == 5
    q.close()


def test_postgresql_start_up_errors_are_one_line(pg):
    unreachable = f"postgresql://tts:secret@127.0.0.1:{pg.port + 1 if pg.port < 65535 else 1}/tts"
    with pytest.raises(QueueError) as exc:
        Queue(unreachable)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("cannot connect to the queue database") and "secret" not in msg
    with pytest.raises(QueueError) as exc:
        Queue(pg.url("tts", password="wrong"))
    msg = str(exc.value)
    assert "\n" not in msg and "password authentication failed" in msg and "wrong" not in msg


def test_workers_back_off_while_postgresql_is_away_and_resume(pg, tmp_path, monkeypatch):
    import threading

    url = pg.url(f"t{uuid.uuid4().hex[:12]}")
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(url)
    job = q.add_job(JobSpec(format="wav"), _chapters(2, 4))
    q.close()
    outage = Outage()
    monkeypatch.setattr("jobs.worker.OUTAGE", outage)
    worker = Worker(Queue(url), ToneEngine(), paths, batch_size=2, heartbeat_s=0.2)
    pg.halt()  # the database goes away under a running worker
    stop = threading.Event()
    t = threading.Thread(target=worker.run_forever, args=(stop, 0.1), daemon=True)
    t.start()
    _until(lambda: outage._failing, "the worker met the outage")  # (this test's Outage: no other source)
    assert t.is_alive()  # backing off, not dead
    pg.start()
    q = Queue(url)
    _until(lambda: q.job(job)["state"] == "done", "the job done after the outage")
    stop.set()
    t.join(60)
    assert q.job(job)["state"] == "done" and q.counts(job)["done"] == 8
    q.close()


def test_workers_back_off_while_sqlite_is_locked_and_resume(tmp_path, monkeypatch):
    """Another process holding the SQLite write lock past the busy timeout is an outage the worker waits out
    (as with PostgreSQL), not an error that ends its thread."""
    import sqlite3
    import threading

    paths = resolve_home(tmp_path / "home").ensure()
    db = tmp_path / "queue.db"
    q = Queue(db)
    job = q.add_job(JobSpec(format="wav"), _chapters(2, 4))
    q.close()
    outage = Outage()
    monkeypatch.setattr("jobs.worker.OUTAGE", outage)
    worker = Worker(Queue(db, busy_timeout_s=0.2), ToneEngine(), paths, batch_size=2, heartbeat_s=0.2)
    locker = sqlite3.connect(str(db), isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")  # e.g. a backup or an admin's shell holding the file
    stop = threading.Event()
    t = threading.Thread(target=worker.run_forever, args=(stop, 0.1), daemon=True)
    t.start()
    _until(lambda: outage._failing, "the worker met the outage")  # (this test's Outage: no other source)
    assert t.is_alive()  # backing off, not dead
    locker.execute("ROLLBACK")
    locker.close()
    q = Queue(db)
    _until(lambda: q.job(job)["state"] == "done", "the job done after the outage")
    stop.set()
    t.join(60)
    assert q.job(job)["state"] == "done" and q.counts(job)["done"] == 8
    q.close()


def test_the_audio_of_segments_that_end_together_is_written_at_once_on_writer_threads(tmp_path, monkeypatch):
    """Segments that end together have their audio encoded and written on the worker's writer threads at once (a
    book on two GPUs waited for one thread writing segment after segment), then recorded in order: every one
    done, its file the audio the engine made."""
    import threading

    import jobs.worker_results as wr
    from jobs.assemble import read_audio

    if wr.WRITER_THREADS < 2:
        pytest.skip("one CPU: the writer pool has one thread")
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(paths.db)
    job = q.add_job(JobSpec(format="wav"), _chapters(1, 4))
    both = threading.Barrier(2, timeout=120)  # two writes must be under way together to pass it
    seen, real = [], wr.write_segment_audio

    def write(path, audio, sr):
        seen.append(threading.current_thread().name)
        if len(seen) <= 2:
            both.wait()
        return real(path, audio, sr)

    monkeypatch.setattr(wr, "write_segment_audio", write)
    eng = ToneEngine()
    worker = Worker(q, eng, paths, batch_size=4, heartbeat_s=0.2)
    while worker.run_once():
        pass
    worker.shelf.assembler.wait(60)
    worker.close()
    assert len(seen) == 4 and all(name.startswith("segment-writer") for name in seen)
    assert worker._writers is None  # close() let the threads go
    assert q.job(job)["state"] == "done"
    for seg in q.segments(job):
        audio, sr = read_audio(seg["audio_path"])
        assert sr == eng.sample_rate and abs(audio.size / sr - seg["duration_s"]) < 1e-3 and np.abs(audio).max() > 0.2
    q.close()


def test_an_engine_is_topped_up_while_what_ended_is_written(tmp_path, monkeypatch):
    """Pipelined feeding: when segments end, the worker claims and launches their successors while their audio
    is still being written (an engine whose rows ended together stood idle through a batch of writes)."""
    import threading

    import jobs.worker_results as wr
    from test_queue_outage import GatedEngine

    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(paths.db)
    job = q.add_job(JobSpec(format="wav"), _chapters(1, 6))
    eng = GatedEngine()
    topped, submit = threading.Event(), eng.submit

    def submit_and_count(request, priority):
        handle = submit(request, priority)
        if len(eng.handles) >= 4:
            topped.set()
        return handle

    eng.submit = submit_and_count
    saw, real = [], wr.write_segment_audio

    def write(path, audio, sr):
        saw.append(topped.wait(120))  # (a failure guard: written after the top-up, this waits in vain)
        return real(path, audio, sr)

    monkeypatch.setattr(wr, "write_segment_audio", write)
    worker = Worker(q, eng, paths, batch_size=2, heartbeat_s=0.2)
    assert worker.run_once(wait_s=0) == 2 and len(eng.handles) == 2
    eng.finish_all()
    assert worker.run_once(wait_s=0) == 4  # two recorded, two more claimed
    assert saw == [True, True] and len(eng.handles) == 4
    for _ in range(2):
        eng.finish_all()
        worker.run_once(wait_s=0)
    worker.shelf.assembler.wait(60)
    worker.close()
    assert len(saw) == 6 and all(saw)
    assert q.job(job)["state"] == "done" and [s["state"] for s in q.segments(job)] == ["done"] * 6
    q.close()
