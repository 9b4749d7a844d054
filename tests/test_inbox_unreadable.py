"""A file in the inbox that the service may not read (another user's, mode 0600): it stays where it is,
one error line and one failed job say why (not a traceback at every poll), and once it is made readable
it is taken like any other file.

The watcher runs in a child process as a user who really cannot open the file: as root, the child drops
to uid 65534 (nobody) after its imports (the interpreter may live where nobody may not look) on a home
that user owns, the file root's with mode 0600; otherwise the file gets mode 000 (its owner cannot read
it either). Each run ticks the watcher until the file was handled (reported, or taken and read), then many
times more (every 0.1 s): however slow the machine, what is said once is said once over many polls."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from jobs.queue import Queue

ROOT = Path(__file__).resolve().parents[1]
BOOK = "Chapter One\n\nThe first chapter has a sentence.\n\nChapter Two\n\nThe end is near.\n"
NOBODY = 65534

WATCH = """
import json, logging, os, sys, time
from pathlib import Path
from jobs.queue import Queue
from jobs.settings import JobSpec, resolve_home
from jobs.watch import InboxWatcher
import jobs.ingest.isolate, jobs.submit  # what the watcher imports when it reads a file
JobSpec(title="x")  # (and what a job's settings import when first checked)
if sys.argv[3] == "drop":
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
paths = resolve_home(Path(sys.argv[1])).ensure()
q = Queue(paths.db)
w = InboxWatcher(paths, quiet_s=0.1, closed_quiet_s=0.1, queue=q)
book = paths.inbox / "book.txt"
end, more = time.time() + 300, int(sys.argv[2])  # (a failure guard)
while more > 0:
    assert time.time() < end, "the watcher never handled book.txt"
    w.tick()
    assert w.drain(300)
    if w.problems() or not book.exists():  # reported, or taken and read
        more -= 1
    time.sleep(0.1)
print(json.dumps(w.problems()))
w.close()
q.close()
"""


@pytest.fixture
def home():
    """A home the watcher's user owns (as root: nobody's, in a folder nobody may enter)."""
    base = Path(tempfile.mkdtemp(prefix="tts-unreadable-"))
    os.chmod(base, 0o755)
    home = base / "home"
    (home / "inbox").mkdir(parents=True)
    if os.geteuid() == 0:
        for p in (home, home / "inbox"):
            os.chown(p, NOBODY, NOBODY)
    yield home
    shutil.rmtree(base)


def _watch(home: Path, polls: int, reader: bool = False) -> tuple[str, dict]:
    """Run the watcher as the user who cannot read the file (`reader`: as this process's user, who can once it
    is readable; as root the file's ingest child needs the interpreter) until it handled book.txt, then for
    `polls` more ticks -> (its log, its problems())."""
    drop = "drop" if os.geteuid() == 0 and not reader else "keep"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", WATCH, str(home), str(polls), drop], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stderr, json.loads(res.stdout.strip().splitlines()[-1])


def _unreadable(path: Path) -> None:
    path.write_text(BOOK)
    os.chmod(path, 0o600 if os.geteuid() == 0 else 0o000)  # as root: the child is not the owner


def test_an_unreadable_file_is_reported_once_kept_and_taken_once_readable(home):
    book = home / "inbox" / "book.txt"
    _unreadable(book)
    log, problems = _watch(home, 20)
    told = [line for line in log.splitlines() if "cannot read book.txt" in line]
    assert len(told) == 1 and told[0].startswith("ERROR"), log[-3000:]  # not once per poll
    assert "Traceback" not in log, log[-3000:]
    assert "Permission denied" in told[0] and "it stays in the inbox" in told[0]
    assert problems == {"unreadable": ["book.txt"]}  # what /health shows of the inbox
    assert book.exists() and sorted(p.name for p in (home / "inbox").iterdir()) == ["book.txt"]
    q = Queue(home / "queue.db")
    try:
        [job] = q.jobs()
        assert job["state"] == "failed" and job["title"] == "book.txt"
        assert "cannot read book.txt: Permission denied" in job["error"] and "chmod" in job["error"]
        assert json.loads(job["sources"]) == [str(book.resolve())]

        log, _ = _watch(home, 10)  # a restart, the file unchanged: no second failed job
        assert len(q.jobs()) == 1 and book.exists()

        os.chmod(book, 0o644)  # made readable: taken like any other file
        log, problems = _watch(home, 1, reader=True)
        assert problems == {} and not book.exists() and (home / "processing" / "book.txt").exists(), log[-3000:]
        jobs = {j["state"]: j for j in q.jobs()}
        assert sorted(jobs) == ["failed", "queued"] and q.segments(jobs["queued"]["id"])
    finally:
        q.close()


def test_an_unreadable_sidecar_keeps_its_book_in_the_inbox(home):
    book, side = home / "inbox" / "book.txt", home / "inbox" / "book.yaml"
    book.write_text(BOOK)
    os.chmod(book, 0o644)
    side.write_text("voice: vivian\n")
    os.chmod(side, 0o600 if os.geteuid() == 0 else 0o000)
    log, problems = _watch(home, 10)
    assert [line for line in log.splitlines() if "cannot read book.yaml" in line], log[-3000:]
    assert "Traceback" not in log and problems == {"unreadable": ["book.txt"]}
    assert book.exists() and side.exists()
    os.chmod(side, 0o644)
    _watch(home, 1, reader=True)
    assert (home / "processing" / "book.txt").exists() and (home / "processing" / "book.yaml").exists()
