"""The queue database goes away under a running daemon (a real PostgreSQL server stopped; a SQLite
queue file swapped for something that is not a database): the status line says so once in the log and
goes on, /metrics answers with the engine's metrics and `tts_queue_up 0`, /health answers 200 with
`"queue": {"ok": false, "error": ...}`, speech is still served; when the queue is back all of it says so."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from daemon_util import Daemon, base_config, needs_daemon
from pg_util import pg_server
from test_daemon_lifecycle import NotifyListener

pytestmark = needs_daemon


def gauge(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def scrape(d: Daemon) -> str:
    status, body, headers = d.get("/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain"), body
    return body.decode()


def wait_queue_up(d: Daemon, up: int, timeout: float = 30.0) -> str:
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
    time.sleep(2.5)  # five status ticks (status_interval_s 0.5) during the outage
    line = listener.wait_for("queue unreachable")
    assert line.startswith("STATUS=ok; streams") and needle in line, line

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
    assert len(outage) == 1 and "WARNING" in outage[0] and needle in outage[0], outage  # once, not per tick
    assert len([ln for ln in log.splitlines() if "queue reachable again" in ln]) == 1


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
