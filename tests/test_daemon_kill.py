"""A daemon killed with SIGKILL and started again: the book moves again after READY, the segments it had in
flight included (the dead daemon's leases are taken back because its process is gone, not after they expire:
the queue says which), nothing is lost and nothing but the segments in flight is synthesized twice; a kill while the book file is written leaves no temp file once
the job is done."""
from __future__ import annotations

import json
import re
import signal
import tempfile
import time
from pathlib import Path

import soundfile as sf
from daemon_util import Daemon, base_config, book_text, needs_daemon
from test_daemon_e2e import submit
from test_daemon_lifecycle import NotifyListener

from jobs.queue import Queue
from jobs.tempnames import is_temp

pytestmark = needs_daemon

LEASE_S = 3600.0  # the dead daemon's leases: they must come back without running out
SLOW_FINISH = """
import os, sys, time
from pathlib import Path
from jobs.assemble import BookWriter
def finish(self):  # the book file takes long to close (a long m4b): the daemon is killed meanwhile
    Path(os.environ["TTS_TEST_CLOSING"]).write_text(str(self.out_dir))
    time.sleep(3600)
BookWriter.finish = finish
from appliance.cli import cli
cli(prog_name="tts-appliance")
"""


def _wait(cond, timeout: float, what: str, d: Daemon) -> float:
    """Wait for `cond()`; returns when it held (monotonic), or fails naming `what`."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout} s:\n{d.log_text()[-3000:]}")
        time.sleep(0.02)
    return time.monotonic()


def _kill(d: Daemon) -> None:
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(30)
    d.logf.close()


def test_a_book_moves_again_right_after_ready_and_nothing_is_done_twice(tmp_path):
    cfg = base_config(tmp_path, jobs={"watch": False, "batch_size": 4, "lease_s": LEASE_S})
    d = Daemon(tmp_path, cfg).start()
    q = Queue(d.home / "queue.db")
    try:
        job = submit(d, book_text(40), tokens=10)
        _wait(lambda: q.counts(job)["done"] >= 4 and q.counts(job)["leased"] > 0, 600, "segments in flight", d)
        _kill(d)
        counts = q.counts(job)
        held = {s["id"] for s in q.segments(job, state="leased")}  # in flight when it died
        assert held and counts["done"] < 40, counts
        listener = NotifyListener(Path(tempfile.mkdtemp(prefix="tts-n-")) / "notify")
        d = Daemon(tmp_path, cfg, env={"NOTIFY_SOCKET": listener.sock.getsockname()}, name="again.yaml")
        d.start(wait=False)
        listener.wait_for("READY=1", 300)
        listener.sock.close()  # (a notify socket nobody reads would block the daemon's sends once full)
        _wait(lambda: held <= {s["id"] for s in q.segments(job, state="done")}, 600,
              "the segments in flight at the kill finished after READY", d)  # (a failure guard)
        # taken back because their holder died (its leases last an hour, longer than the wait above allows)
        back = [int(n) for n in re.findall(r"is gone: (\d+) segment lease\(s\) given back", d.log_text())]
        assert sum(back) == len(held) and "its lease expired" not in d.log_text(), d.log_text()[-3000:]
        assert all(s["lost"] == 1 for s in q.segments(job) if s["id"] in held)
        assert d.wait_job(job)["state"] == "done"
    finally:
        d.stop()
    segs = q.segments(job)
    assert len(segs) == 40 and all(s["state"] == "done" for s in segs)
    assert max(s["attempts"] for s in segs) == 1  # the kill used up no attempt
    rows = q.conn.execute("SELECT key, COUNT(finished_at), COUNT(*) FROM synth_log GROUP BY key").fetchall()
    assert {r[0] for r in rows} == {s["key"] for s in segs}
    assert all(r[1] == 1 for r in rows), rows  # each segment's audio recorded exactly once
    assert sum(r[2] - r[1] for r in rows) <= counts["leased"]  # started twice: only those in flight
    q.close()


def test_a_kill_while_the_book_file_is_written_leaves_no_temp_file(tmp_path):
    closing = tmp_path / "closing"
    cfg = base_config(tmp_path, jobs={"watch": False})
    d = Daemon(tmp_path, cfg, env={"TTS_TEST_CLOSING": str(closing)})
    d.start(wrap=lambda argv: [argv[0], "-c", SLOW_FINISH, *argv[3:]])
    try:
        job = submit(d, book_text(6), tokens=6, title="Killed")
        out = d.home / "output" / job
        _wait(closing.exists, 600, "the book file being closed", d)
        temps = [p.name for p in out.iterdir() if is_temp(p.name)]
        assert temps and temps[0].startswith(".Killed."), sorted(out.iterdir())  # the book so far
    finally:
        _kill(d)
    d = Daemon(tmp_path, cfg, name="again.yaml").start()
    try:
        assert d.wait_job(job)["state"] == "done"
    finally:
        assert d.stop() == 0
    assert not [p for p in out.rglob("*") if is_temp(p.name)], sorted(out.rglob("*"))
    manifest = json.loads((out / "manifest.json").read_text())
    audio, sr = sf.read(manifest["output"]["book"])
    assert Path(manifest["output"]["book"]).name == "Killed.wav" and audio.size / sr > 0.5
