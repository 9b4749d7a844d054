"""What killed writers leave in the spool is removed (jobs.leftovers): a worker's start removes the temp
files of writers that are gone (really killed here, with SIGKILL) and, once a job has ended, every temp
file of it; a home that only followed a book another home assembled keeps nothing of it; a live writer's
file, a finished output and a user's file are never touched."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_queue import ToneEngine, _chapters

from jobs.queue import Queue
from jobs.settings import JobSpec, resolve_home
from jobs.tempnames import is_temp
from jobs.worker import Worker

ROOT = Path(__file__).resolve().parents[1]
WRITER = """
import sys, time
import numpy as np
from jobs.assemble import StreamedFile
f = StreamedFile(sys.argv[1], 24000, sys.argv[1].rsplit(".", 1)[1])
f.write(np.full(24000, 0.1, np.float32))
print(f.tmp, flush=True)
time.sleep(3600)
"""
FOLLOWER = """
import sys, time
from jobs.queue import Queue
from jobs.settings import resolve_home
from jobs.worker import Worker
from test_queue import ToneEngine
paths = resolve_home(sys.argv[1], queue=sys.argv[2]).ensure()
q = Queue(paths.db)
w = Worker(q, ToneEngine(), paths, batch_size=2)
w.assemble_ready = lambda: 0  # this home only follows the book: another one finishes it
job = sys.argv[3]
while q.counts(job)["queued"] or q.counts(job)["leased"]:
    w.run_once()
w.shelf.advance([job], every_s=0)
w.shelf._books[job]._last.result()  # every chapter written, and added to the book file (not closed)
print("followed", flush=True)
time.sleep(3600)
"""


def _child(script: str, *args) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    proc = subprocess.Popen([sys.executable, "-c", script, *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    assert line, f"the child said nothing (exit status {proc.poll()})"
    return proc, line


def _killed(script: str, *args) -> str:
    """Run a child until it says its line, then SIGKILL it -> the line."""
    proc, line = _child(script, *args)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    return line


def _wait_gone(path: Path, timeout: float = 300.0) -> bool:  # (a failure guard)
    deadline = time.monotonic() + timeout
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not path.exists()


def _work(worker: Worker, q: Queue, job: str) -> None:
    while q.job(job)["state"] in ("queued", "running"):
        worker.run_once(0.05)


def test_a_start_removes_what_killed_writers_left_and_an_ended_job_everything_left(tmp_path):
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(paths.db)
    running = q.add_job(JobSpec(format="flac", title="Running"), _chapters(1, 2))
    ended = q.add_job(JobSpec(format="flac", title="Ended"), _chapters(1, 1))
    run_out, end_out = paths.output / running, paths.output / ended
    finished = {end_out / "Ended.flac": b"book", end_out / "manifest.json": b"{}",
                end_out / "chapters" / "01 - One.flac": b"chapter", paths.inbox / "mine.txt": b"user's"}
    for f, data in finished.items():
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
    q.finish_job(ended, "done", output_dir=str(end_out))
    dead = Path(_killed(WRITER, run_out / "Running.flac"))  # a book being written when its process was killed
    dead_audio = Path(_killed(WRITER, paths.audio / "ab" / "abcdef.wav"))
    live_proc, live = _child(WRITER, run_out / "chapters" / "01 - One.flac")
    try:
        unnamed = run_out / ".Running.0123abcd.tmp.flac"  # an older version's name: its writer is unknown
        unnamed.write_bytes(b"partial")
        of_ended = [Path(_killed(WRITER, end_out / "Ended.flac")), end_out / ".Ended.89abcdef.tmp.flac"]
        of_ended[1].write_bytes(b"partial")
        assert dead.is_file() and dead_audio.is_file() and is_temp(dead.name) and is_temp(Path(live).name)
        worker = Worker(q, ToneEngine(), paths, batch_size=4)  # a (re)start
        assert _wait_gone(dead) and _wait_gone(dead_audio) and all(_wait_gone(f) for f in of_ended)
        assert Path(live).is_file() and unnamed.is_file()  # a live writer's; an unknown writer's, job running
        assert all(f.read_bytes() == data for f, data in finished.items())  # outputs and input untouched
        _work(worker, q, running)  # the job ends: what is left of it goes, but a live writer's file
        worker.close()
        assert q.job(running)["state"] == "done" and (run_out / "Running.flac").is_file()
        assert not unnamed.exists() and Path(live).is_file()
        assert sorted(f.name for f in run_out.rglob(".*")) == [Path(live).name]
    finally:
        live_proc.kill()
        live_proc.wait(10)
    q.close()


def _two_homes(tmp_path):
    """(queue, job, home X's paths, home Y's paths): two homes (wrongly) sharing one queue."""
    db = tmp_path / "queue.db"
    q = Queue(db)
    job = q.add_job(JobSpec(format="flac", title="Shared"), _chapters(3, 2))
    return q, job, resolve_home(tmp_path / "x", queue=str(db)).ensure(), resolve_home(tmp_path / "y", queue=str(db)).ensure()


def _assembled_by_y(q, job, y) -> set:
    """Home Y finishes the job -> the files of its output folder."""
    worker = Worker(q, ToneEngine(), y, batch_size=2)
    try:
        _work(worker, q, job)
    finally:
        worker.close()
    assert q.job(job)["state"] == "done" and q.job(job)["output_dir"] == str(y.output / job)
    return {p: p.read_bytes() for p in (y.output / job).rglob("*") if p.is_file()}


def test_a_home_whose_follower_was_killed_keeps_nothing_of_a_book_assembled_elsewhere(tmp_path):
    q, job, x, y = _two_homes(tmp_path)
    assert _killed(FOLLOWER, x.home, q.path, job) == "followed"
    left = sorted(p.name for p in (x.output / job).rglob("*") if p.is_file())
    assert len([n for n in left if n.startswith("0")]) == 3 and any(is_temp(n) for n in left), left
    outputs = _assembled_by_y(q, job, y)
    worker = Worker(q, ToneEngine(), x)  # home X's daemon starts again
    try:
        assert _wait_gone(x.output / job), sorted((x.output / job).rglob("*"))
    finally:
        worker.close()
    assert outputs and all(p.read_bytes() == data for p, data in outputs.items())  # Y's book untouched
    q.close()


def test_a_follower_that_runs_on_lets_go_of_a_book_assembled_elsewhere(tmp_path):
    q, job, x, y = _two_homes(tmp_path)
    follower = Worker(q, ToneEngine(), x, batch_size=2)
    follower.assemble_ready = lambda: 0  # home X only follows the book
    try:
        while q.counts(job)["queued"] or q.counts(job)["leased"]:
            follower.run_once(0.05)
        follower.shelf.advance([job], every_s=0)
        follower.shelf._books[job]._last.result()  # its chapters written
        assert (x.output / job / "chapters").is_dir() and any(is_temp(p.name) for p in (x.output / job).iterdir())
        outputs = _assembled_by_y(q, job, y)
        follower.shelf.look(every_s=0)  # it notices the job ended without it
        assert not (x.output / job).exists() and follower.books() == {}
    finally:
        follower.close()
    assert all(p.read_bytes() == data for p, data in outputs.items())
    q.close()
