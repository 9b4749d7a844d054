"""The queue database goes away under a running daemon (a real PostgreSQL server stopped; a SQLite
queue file swapped for something that is not a database): the status line says so once in the log and
goes on, /metrics answers with the engine's metrics and `tts_queue_up 0`, /health answers 200 with
`"queue": {"ok": false, "error": ...}`, speech is still served; when the queue is back all of it says so.

Under a worker (a PostgreSQL server stopped, a SQLite file held locked by another process): segments that
finish during the outage are recorded when it ends, not synthesized again; retries stay seconds apart;
the process logs one warning and one line when the queue is back."""
from __future__ import annotations

import logging
import os
import sqlite3
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from daemon_util import Daemon, base_config, needs_daemon
from jobs.queue import Queue, QueueUnavailable
from jobs.queue.outage import Outage
from jobs.settings import JobSpec, resolve_home
from jobs.worker import BACKOFF_MAX_S, Worker
from pg_util import pg_server
from test_daemon_lifecycle import NotifyListener
from test_queue import ToneEngine, _chapters


def gauge(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def scrape(d: Daemon) -> str:
    status, body, headers = d.get("/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain"), body
    return body.decode()


def wait_queue_up(d: Daemon, up: int, timeout: float = 300.0) -> str:  # (a failure guard)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = scrape(d)
        if gauge(text, "tts_queue_up") == up:
            return text
        time.sleep(0.1)
    raise AssertionError(f"tts_queue_up never became {up}:\n{text}\n{d.log_text()[-3000:]}")


def start(tmp_path: Path, queue: str | None = None) -> tuple[Daemon, NotifyListener]:
    listener = NotifyListener(Path(tempfile.mkdtemp(prefix="tts-n-")) / "notify")
    jobs = {"watch": False, **({"queue": queue} if queue else {})}
    d = Daemon(tmp_path, base_config(tmp_path, jobs=jobs), env={"NOTIFY_SOCKET": str(listener.sock.getsockname())})
    d.start()
    listener.wait_for("READY=1")
    return d, listener


def ride_out_outage(d: Daemon, listener: NotifyListener, go_away, come_back, needle: str) -> None:
    """Queue up, then away (`go_away()`) for several status ticks, then back (`come_back()`)."""
    text = scrape(d)
    assert gauge(text, "tts_queue_up") == 1 and 'tts_queue_segments{state="done"}' in text
    status, h, _ = d.get("/health")
    assert status == 200 and h["queue"] == {"ok": True}

    go_away()
    text = wait_queue_up(d, 0)
    assert "tts_queue_segments{" not in text and "tts_jobs{" not in text  # no counts it cannot know
    for name in ("tts_engine_active_slots", "tts_ttfa_seconds_count", "tts_audio_seconds_total"):
        assert gauge(text, name) is not None, name
    status, h, _ = d.get("/health")
    assert status == 200 and h["status"] == "ok" and h["queue"]["ok"] is False, h
    assert needle in h["queue"]["error"] and "secret" not in h["queue"]["error"], h
    status, audio, _ = d.post("/v1/audio/speech", {"model": "tts-1", "input": "Still here.", "voice": "ryan",
                                                   "response_format": "pcm", "max_frames": 6, "seed": 1})
    assert status == 200 and len(audio) > 0  # speech does not need the queue
    for _ in range(5):  # five more reads of the queue during the outage (each scrape reads it): logged once
        assert gauge(scrape(d), "tts_queue_up") == 0
    line = listener.wait_for("queue unreachable")  # the status line (every status_interval_s, 0.5 s) says so
    assert line.startswith("STATUS=ok; streams") and needle in line, line
    needles = (needle, "lost the queue database")

    come_back()
    text = wait_queue_up(d, 1)
    assert 'tts_queue_segments{state="done"}' in text
    status, h, _ = d.get("/health")
    assert status == 200 and h["queue"] == {"ok": True}
    listener.messages.clear()
    listener.wait_for("segments")  # the status line went on ticking and has its counts again

    assert d.stop() == 0
    log = d.log_text()
    assert "Traceback" not in log, log[-3000:]
    outage = [ln for ln in log.splitlines() if "queue unreachable" in ln]
    # once, not per tick; in the words of whoever met it first (the status probe or a worker mid-query)
    assert len(outage) == 1 and "WARNING" in outage[0] and any(n in outage[0] for n in needles), outage
    assert len([ln for ln in log.splitlines() if "queue reachable again" in ln]) == 1
    warnings = [ln for ln in log.splitlines() if " WARNING jobs." in ln]
    assert warnings == outage, warnings  # the queue workers and heartbeats add none of their own


@needs_daemon
def test_daemon_rides_out_a_postgresql_outage(tmp_path):
    pg = pg_server()
    try:
        d, listener = start(tmp_path, pg.url("tts"))
        try:
            ride_out_outage(d, listener, pg.halt, pg.start, "cannot connect to the queue database")
        finally:
            d.stop()
    finally:
        pg.stop()


@needs_daemon
@pytest.mark.parametrize("swap", ["directory", "garbage"])
def test_daemon_rides_out_an_unreadable_sqlite_queue(tmp_path, swap):
    d, listener = start(tmp_path)
    db = d.home / "queue.db"
    aside = tmp_path / "queue.db.aside"

    def go_away():  # the daemon's own connections keep the file they opened; new ones find this
        os.rename(db, aside)
        if swap == "directory":
            db.mkdir()
        else:
            db.write_bytes(b"not a database\n" * 512)

    def come_back():
        db.rmdir() if swap == "directory" else db.unlink()
        os.rename(aside, db)

    try:
        ride_out_outage(d, listener, go_away, come_back, "cannot open the queue database")
    finally:
        d.stop()


# -- under a worker --------------------------------------------------------------------------------

class Away:
    """A queue that can be taken away and brought back: a PostgreSQL server halted, or a SQLite file held
    locked by another connection past the worker's busy timeout."""

    def __init__(self, kind: str, tmp_path: Path, request):
        self.kind = kind
        if kind == "sqlite":
            self.location, self.worker_kw = tmp_path / "queue.db", {"busy_timeout_s": 0.2}
        else:
            self.server = request.getfixturevalue("pg")
            self.location, self.worker_kw = self.server.url(f"t{uuid.uuid4().hex[:12]}"), {}
        self.locker = None

    def go(self) -> None:
        if self.kind == "sqlite":
            self.locker = sqlite3.connect(str(self.location), isolation_level=None)
            self.locker.execute("BEGIN EXCLUSIVE")  # a backup, an admin's shell
        else:
            self.server.halt()

    def back(self) -> None:
        if self.kind == "sqlite":
            self.locker.execute("ROLLBACK")
            self.locker.close()
        else:
            self.server.start()


@pytest.fixture(params=["sqlite", "postgresql"])
def away(request, tmp_path, monkeypatch):
    monkeypatch.setattr("jobs.worker.OUTAGE", Outage(), raising=False)  # this test's own view of the outage
    return Away(request.param, tmp_path, request)


class Handle:
    def __init__(self, request):
        self.request, self.done, self.on_done, self._result = request, False, None, None

    def finish(self, result) -> None:
        self._result, self.done = result, True
        if self.on_done is not None:
            self.on_done(self)

    def result(self):
        return self._result


class GatedEngine(ToneEngine):
    """A continuously fed engine double (`running`, `submit`): what is submitted finishes when `finish_all()`."""

    running = True

    def __init__(self):
        super().__init__()
        self.handles: list[Handle] = []

    def submit(self, request, priority):
        self.handles.append(Handle(request))
        return self.handles[-1]

    def finish_all(self) -> None:
        for h in self.handles:
            if not h.done:
                h.finish(self.synthesize([h.request])[0])


def test_segments_finished_during_an_outage_are_recorded_when_it_ends(away, tmp_path):
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(away.location)
    job = q.add_job(JobSpec(format="wav"), _chapters(1, 4))
    q.close()
    engine = GatedEngine()
    worker = Worker(Queue(away.location, **away.worker_kw), engine, paths, batch_size=4, lease_s=60, heartbeat_s=30)
    assert worker.run_once(wait_s=0) == 4  # claimed, and in the engine
    away.go()
    engine.finish_all()  # the segments end while the database is away
    with pytest.raises(QueueUnavailable):
        worker.run_once(wait_s=0)
    assert len(list(paths.audio.rglob("*.flac"))) == 4  # their audio is on disk already
    assert len(worker.heartbeat._held) == 4  # their leases are still this worker's: the heartbeat renews them
    away.back()
    worker.run_once(wait_s=0)
    worker.close()
    q = Queue(away.location)
    segs = q.segments(job)
    assert [s["state"] for s in segs] == ["done"] * 4, segs
    assert all(s["attempts"] == 1 and s["lost"] == 0 for s in segs)  # recorded by their worker, no lease lost
    assert len(engine.calls) == 4  # nothing synthesized twice
    assert len(q._rows("SELECT * FROM synth_log WHERE finished_at IS NOT NULL")) == 4
    assert q.job(job)["state"] == "done" and not worker.heartbeat._held
    q.close()


class Script(threading.Event):
    """The stop event of `run_forever` as a script: `wait()` records how long the worker would wait and
    returns after a moment; at the `back_at`-th wait the queue comes back, at the `stop_at`-th the worker stops."""

    def __init__(self, back, back_at: int, stop_at: int):
        super().__init__()
        self.back, self.back_at, self.stop_at, self.waits = back, back_at, stop_at, []

    def wait(self, timeout=None) -> bool:
        self.waits.append(timeout)
        if len(self.waits) == self.back_at:
            self.back()
        if len(self.waits) >= self.stop_at:
            self.set()
        time.sleep(0.02)
        return self.is_set()


def test_an_outage_is_one_warning_one_line_back_and_prompt_retries(away, tmp_path, caplog):
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(away.location)
    job = q.add_job(JobSpec(format="wav"), _chapters(1, 3))
    q.close()
    worker = Worker(Queue(away.location, **away.worker_kw), ToneEngine(), paths, batch_size=2, heartbeat_s=0.02)
    away.go()
    script = Script(away.back, back_at=10, stop_at=14)
    with caplog.at_level(logging.INFO):
        worker.run_forever(script, idle_sleep_s=1.0)
    retries = script.waits[:9]
    assert retries == sorted(retries) and max(retries) == BACKOFF_MAX_S <= 5.0, script.waits  # capped low
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("jobs")]
    warnings = [m for level, m in logged if level != "INFO"]
    assert len(warnings) == 1 and warnings[0].startswith("queue unreachable: "), logged
    assert [m for _, m in logged].count("queue reachable again") == 1, logged
    assert Queue(away.location).job(job)["state"] == "done"


def test_the_inbox_rides_out_a_postgresql_outage(pg, tmp_path, monkeypatch, caplog):
    """The watcher files finished jobs every tick: a database that goes away must not end its thread."""
    from jobs.watch import InboxWatcher

    monkeypatch.setattr("jobs.watch.OUTAGE", Outage(), raising=False)
    url = pg.url(f"t{uuid.uuid4().hex[:12]}")
    paths = resolve_home(tmp_path / "home").ensure()
    watcher = InboxWatcher(paths, quiet_s=0.2, closed_quiet_s=0.1, queue=Queue(url))
    stop = threading.Event()
    t = threading.Thread(target=watcher.run, args=(stop, 0.1), daemon=True)
    q = Queue(url)

    def until(cond, what: str) -> None:
        deadline = time.monotonic() + 300  # (a failure guard)
        while not cond():
            assert time.monotonic() < deadline, f"never: {what}"
            time.sleep(0.1)

    def taken(n: int) -> None:
        until(lambda: len(q.jobs()) >= n, f"{n} files taken")
        assert len(q.jobs()) == n

    with caplog.at_level(logging.INFO):
        t.start()
        (paths.inbox / "before.txt").write_text("Before the outage.\n")
        taken(1)  # the watcher is at work
        q.close()
        pg.halt()
        until(lambda: any(m.startswith("queue unreachable: ") for m in caplog.messages), "a tick without it")
        assert t.is_alive()
        pg.start()
        q = Queue(url)
        (paths.inbox / "after.txt").write_text("Back again.\n")
        taken(2)
        stop.set()
        t.join(10)
    assert (paths.processing / "after.txt").exists()
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("jobs")]
    assert [m for level, m in logged if level not in ("INFO", "DEBUG")] == [
        m for _, m in logged if m.startswith("queue unreachable: ")] and len(logged) >= 2, logged
    assert [m for _, m in logged].count("queue reachable again") == 1, logged
    q.close()
