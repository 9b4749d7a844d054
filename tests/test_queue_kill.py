"""Dead workers: a restarted worker takes back a dead worker's leases at once (not after the lease),
the lost attempt does not count, and a book survives 20 SIGKILLs of real `tts-appliance work`
processes with every segment recorded exactly once and none of their temp files left."""
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


def _engine_missing() -> str | None:
    if not (MODEL / "model.safetensors").is_file():
        return f"tiny checkpoint missing: {MODEL} (build it with tests/fixtures/build_fixtures.py)"
    return None


ZYGOTE = """
import os, signal, sys, traceback
from appliance.cli import cli
import appliance.engine_host  # the slow imports (torch), done once
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.dup2(fd, 1), os.dup2(fd, 2)
        code = 0
        try:
            cli.main(args=line.split(), prog_name="tts-appliance", standalone_mode=False)
        except SystemExit as exc:
            code = exc.code or 0
        except BaseException:
            traceback.print_exc()
            code = 1
        print("worker", os.getpid(), "exit", code, flush=True)
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)
    print(pid, flush=True)
"""


class Workers:
    """Starts `tts-appliance work` processes: each runs the real CLI command in a process of its own,
    forked from one that has done the slow imports already (20 cold starts would take minutes here)."""

    def __init__(self, home: Path, log: Path):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        self.args = ["work", "--home", str(home), "--model", str(MODEL), "--device", "cpu", "--batch-size", "4",
                     "--no-guard", "--until-idle", "--lease-seconds", "3600"]  # only the dead-worker check is fast
        self.zygote = subprocess.Popen([sys.executable, "-c", ZYGOTE, str(log)], cwd=ROOT, env=env, text=True,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def start(self) -> int:
        self.zygote.stdin.write(" ".join(self.args) + "\n")
        self.zygote.stdin.flush()
        return int(self.zygote.stdout.readline())

    def close(self) -> None:
        self.zygote.stdin.close()
        self.zygote.wait(10)


def _running(pid: int) -> bool:
    return holders.alive(pid, None)


def _tail(tmp_path) -> str:
    return (tmp_path / "workers.log").read_text()[-3000:]


def _registered(q: Queue, pid: int) -> bool:
    return bool(q._rows("SELECT 1 FROM workers WHERE pid = ?", [pid]))


STALL_S = 300.0  # a failure guard: this long without the book moving (a loaded machine is slow, not stuck)


class Progress:
    """Fails once the book has not moved (a segment finished, its state changed) for STALL_S seconds: a
    limit that starts again with every step, however slow the machine, instead of one for the whole book."""

    def __init__(self, q: Queue, job: str, tmp_path: Path):
        self.q, self.job, self.tmp_path = q, job, tmp_path
        self.last, self.since = None, time.monotonic()

    def check(self, what: str) -> None:
        now = (self.q.counts(self.job).get("done", 0), self.q.job(self.job)["state"])
        if now != self.last:
            self.last, self.since = now, time.monotonic()
        assert time.monotonic() - self.since < STALL_S, (
            f"{what}: the book did not move in {STALL_S:g} s ({self.q.counts(self.job)}):\n{_tail(self.tmp_path)}")


@pytest.mark.skipif(_engine_missing() is not None, reason=str(_engine_missing()))
@pytest.mark.timeout(3600)  # (about 4 minutes on 2 busy cores; the guard that counts is STALL_S, per step)
def test_book_survives_20_sigkills(tmp_path):
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(paths.db)
    spec = JobSpec(voice="ryan", language="english", format="wav", seed=3, sampling={"max_new_tokens": 3},
                   model=str(MODEL.resolve()))
    chapters = [(f"Chapter {c}", [SegmentText(f"Part {c} line {i}.", f"Part {c} line {i}.", 0) for i in range(30)])
                for c in range(10)]
    job = q.add_job(spec, chapters)
    rng = random.Random(14)
    workers = Workers(paths.home, tmp_path / "workers.log")
    progress = Progress(q, job, tmp_path)
    pids, kills, hits = [], 0, 0
    try:
        while kills < 20:
            pids = [p for p in pids if _running(p)]
            while len(pids) < 2:
                pids.append(workers.start())
            victim = rng.choice(pids)
            started = time.monotonic()
            while not _registered(q, victim) and _running(victim):  # killed once it holds segments, at a
                assert time.monotonic() - started < STALL_S, f"worker {victim} never claimed:\n{_tail(tmp_path)}"
                time.sleep(0.02)  # random moment of its work
            time.sleep(rng.uniform(0.0, 0.5))
            hits += bool(q._rows("SELECT 1 FROM segments s JOIN workers w ON w.id = s.worker_id "
                                 "WHERE w.pid = ? AND s.state = 'leased'", [victim]))
            if not _running(victim):
                raise AssertionError(f"worker {victim} ended by itself after {kills} kills:\n{_tail(tmp_path)}")
            os.kill(victim, signal.SIGKILL)
            kills += 1
            pids.remove(victim)
            while _running(victim):
                time.sleep(0.01)
        pids = [p for p in pids if _running(p)]
        while len(pids) < 2:  # two drain the rest, as two took the kills
            pids.append(workers.start())
        while any(_running(p) for p in pids):  # the workers end once the book is done (--until-idle)
            progress.check("after 20 kills")
            time.sleep(0.1)
    finally:
        for p in pids:
            if _running(p):
                os.kill(p, signal.SIGKILL)
        workers.close()
    tail = (tmp_path / "workers.log").read_text()[-3000:]
    assert hits >= 10, f"only {hits} kills found segments in flight\n{tail}"

    segs = q.segments(job)
    assert len(segs) == 300 and all(s["state"] == "done" for s in segs), (q.counts(job), tail)
    assert max(s["attempts"] for s in segs) == 1  # kills never used up an attempt
    assert sum(s["lost"] for s in segs) >= hits
    recorded = q._rows("SELECT segment_id, COUNT(*) AS n FROM synth_log WHERE finished_at IS NOT NULL "
                       "GROUP BY segment_id")
    assert sorted(r["segment_id"] for r in recorded) == sorted(s["id"] for s in segs)
    assert all(r["n"] == 1 for r in recorded)  # each segment's audio recorded exactly once
    j = q.job(job)
    assert j["state"] == "done", (j, tail)
    assert (Path(j["output_dir"]) / "manifest.json").is_file()
    left = [p.name for p in paths.home.rglob(".*") if p.is_file() and p.name != ".gitignore"]
    assert not [n for n in left if ".tmp" in n], left  # nothing the killed workers were writing is left
    q.close()


def test_a_holder_hidden_by_proc_keeps_its_leases(tmp_path, monkeypatch):
    """Where /proc hides another user's processes (hidepid=invisible; the service runs with
    ProtectProc=invisible), a live holder there must not pass for a dead one: its leases stay; once it
    is gone for the kernel too they come back at once."""
    db = tmp_path / "q.db"
    q = Queue(db)
    q.add_job(JobSpec(), _segments(3))
    other = _holder(db, "other-user-w", 2)
    stat = holders._stat
    monkeypatch.setattr(holders, "_stat", lambda pid: None if pid == other.pid else stat(pid))
    try:
        assert [r["idx"] for r in q.claim("service-w", 3, lease_s=60)] == [2]  # not the hidden holder's
    finally:
        other.kill()
        other.wait(10)
    assert sorted(r["idx"] for r in q.claim("service-w", 3, lease_s=60)) == [0, 1]
    q.close()
