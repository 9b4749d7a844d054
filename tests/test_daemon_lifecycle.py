"""Daemon lifecycle as a subprocess: SIGTERM mid-book then a restart finishes the book; sd_notify
messages (READY, STATUS, WATCHDOG, RELOADING, STOPPING) arrive on a temp NOTIFY_SOCKET."""
from __future__ import annotations

import json
import signal
import socket
import time

from daemon_util import Daemon, base_config, book_text, needs_daemon
from test_daemon_e2e import submit

pytestmark = needs_daemon


class NotifyListener:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[str] = []

    def drain(self):
        while True:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except (socket.timeout, BlockingIOError):
                return self.messages

    def wait_for(self, needle: str, timeout: float = 300.0) -> str:  # (a failure guard)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in self.drain():
                if needle in m:
                    return m
        raise AssertionError(f"no {needle!r} among {self.messages}")


def test_sigterm_mid_book_then_restart_finishes_it_with_sd_notify(tmp_path):
    import tempfile
    from pathlib import Path

    note = Path(tempfile.mkdtemp(prefix="tts-n-")) / "notify"
    listener = NotifyListener(note)
    cfg = base_config(tmp_path, jobs={"watch": False, "batch_size": 2}, service={"stop_timeout_s": 15.0})
    d = Daemon(tmp_path, cfg, env={"NOTIFY_SOCKET": str(note), "WATCHDOG_USEC": "2000000"}).start()
    ready = listener.wait_for("READY=1")
    assert "STATUS=ok;" in ready
    job_id = submit(d, book_text(40), tokens=10)
    listener.wait_for("WATCHDOG=1")
    listener.wait_for("segments")  # STATUS= carries segment progress
    d.proc.send_signal(signal.SIGHUP)
    listener.wait_for("RELOADING=1")
    deadline = time.monotonic() + 300  # (a failure guard)
    while d.get(f"/v1/jobs/{job_id}")[1]["progress"]["done"] < 2:
        assert time.monotonic() < deadline, d.log_text()[-3000:]
        time.sleep(0.05)
    assert d.stop() == 0
    listener.wait_for("STOPPING=1")
    from jobs.queue import Queue

    q = Queue(d.home / "queue.db")
    counts = q.counts(job_id)
    assert counts["leased"] == 0, counts  # in-flight segments finished or went back to the queue
    assert 0 < counts["done"] < 40 and q.job(job_id)["state"] == "running", counts  # it stopped mid-book
    done_before = {s["idx"]: s["audio_path"] for s in q.segments(job_id) if s["state"] == "done"}
    assert not (d.home / "daemon.json").exists() and not Path(d.socket).exists()
    d2 = Daemon(tmp_path, cfg, name="config2.yaml").start()
    try:
        s = d2.wait_job(job_id)
        assert s["state"] == "done" and s["progress"]["done"] == 40
        after = {x["idx"]: x["audio_path"] for x in q.segments(job_id)}
        assert all(after[i] == p for i, p in done_before.items())
        manifest = json.loads((d.home / "output" / job_id / "manifest.json").read_text())
        assert manifest
    finally:
        assert d2.stop() == 0
        q.close()


def test_reload_keeps_the_queue_it_has_and_says_a_restart_changes_it(tmp_path):
    """SIGHUP with another jobs.queue: the daemon says the key needs a restart and keeps working on the queue it
    opened (it used to say "configuration reloaded" alone and go on with the old one without a word)."""
    import yaml

    cfg = base_config(tmp_path)
    d = Daemon(tmp_path, cfg).start()
    try:
        other = tmp_path / "other" / "queue.db"
        cfg["jobs"]["queue"] = str(other)
        d.path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 300  # (a failure guard)
        while "configuration reloaded" not in d.log_text():
            assert time.monotonic() < deadline, d.log_text()[-3000:]
            time.sleep(0.2)
        line = next(x for x in d.log_text().splitlines() if "configuration reloaded" in x)
        assert "needs a restart to change: jobs.queue" in line, line
        job = submit(d, "One short sentence.\n")
        assert d.wait_job(job)["state"] == "done"
        assert not other.exists() and (d.home / "queue.db").is_file()
    finally:
        assert d.stop() == 0


def test_sigterm_to_the_whole_group_still_lets_in_flight_segments_finish(tmp_path):
    """A SIGTERM that reaches every process of the daemon (systemd's default KillMode, Ctrl-C in a terminal)
    used to kill the engine process at once: the daemon promised the in-flight segments their drain time and
    in the same instant they failed, to be synthesized again after the restart. The engine process leaves
    the signal to the daemon, which stops it once the work has drained."""
    import os

    from jobs.queue import Queue

    cfg = base_config(tmp_path, runtime={"engine_process": True}, jobs={"watch": False, "batch_size": 2},
                      service={"stop_timeout_s": 300.0})  # the drain's limit: a guard, not a time relied on
    d = Daemon(tmp_path, cfg).start(start_new_session=True)
    job_id = submit(d, book_text(12), tokens=30)
    q = Queue(d.home / "queue.db")
    try:
        deadline = time.monotonic() + 300  # (a failure guard)
        leased = []
        while not leased and time.monotonic() < deadline:
            leased = [s["idx"] for s in q.segments(job_id) if s["state"] == "leased"]
            time.sleep(0.05)
        assert leased, "no segment was leased"
        os.killpg(d.proc.pid, signal.SIGTERM)
        assert d.proc.wait(400) == 0, d.log_text()[-3000:]
        log = d.log_text()
        assert "in flight failed" not in log and "killed by" not in log, log[-3000:]
        state = {s["idx"]: s["state"] for s in q.segments(job_id)}
        assert all(state[i] == "done" for i in leased), (leased, state, log[-3000:])
    finally:
        q.close()
        d.stop()
