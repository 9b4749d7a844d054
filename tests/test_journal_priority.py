"""Errors reach the journal at priority err: under systemd every output line needs its own `<N>` prefix
(journald files a line without one at info), tracebacks and `daemon --check`'s config errors included.

The journal is stood in for by a file whose device and inode $JOURNAL_STREAM names, as systemd sets it
for a service's stdout and stderr; the live systemd test reads the real journal (`journalctl -p err`).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PREFIX = re.compile(r"^<(\d)>")

LOGS = r"""
import logging, threading
from appliance.logs import setup_logging
setup_logging("info")
log = logging.getLogger("tts_appliance.test")
log.info("hello")
try:
    raise ValueError("first line\nsecond line")
except ValueError:
    log.exception("it failed")
t = threading.Thread(target=lambda: 1 / 0, name="worker-x")
t.start(); t.join()
raise RuntimeError("the main thread dies")
"""


def journal_run(args, tmp_path: Path, stream: str = "stdout") -> tuple[int, str]:
    out = tmp_path / "journal.txt"
    with open(out, "w") as f:
        st = os.fstat(f.fileno())
        env = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        other = subprocess.DEVNULL
        r = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, timeout=300,
                           stdout=f if stream == "stdout" else other, stderr=f if stream == "stderr" else other)
    return r.returncode, out.read_text()


def test_every_line_of_a_record_carries_its_priority(tmp_path):
    code, text = journal_run(["-c", LOGS], tmp_path)
    lines = text.splitlines()
    assert code == 1 and lines, text
    assert all(PREFIX.match(line) for line in lines), [line for line in lines if not PREFIX.match(line)]
    assert any(line.startswith("<6>") and "hello" in line for line in lines)
    # log.exception: the message and every line of its traceback at err
    failed = [line for line in lines if line.startswith("<3>")]
    assert any("it failed" in line for line in failed) and any("second line" in line for line in failed), text
    # an uncaught exception, in a thread and in the main thread: logged (critical), every line prefixed
    crit = "\n".join(line for line in lines if line.startswith("<2>"))
    assert "worker-x" in crit and "ZeroDivisionError" in crit and "the main thread dies" in crit, text


def test_a_terminal_gets_no_prefixes(tmp_path):
    r = subprocess.run([sys.executable, "-c", LOGS], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"})
    assert "it failed" in r.stdout and not any(PREFIX.match(line) for line in r.stdout.splitlines()), r.stdout


def test_a_config_error_of_check_is_an_error_in_the_journal(tmp_path):
    bad = tmp_path / "config.yaml"
    bad.write_text("model: {threads: many}\n")
    code, text = journal_run(["-m", "appliance.cli", "daemon", "--config", str(bad), "--check"], tmp_path,
                             stream="stderr")
    assert code == 78, text
    assert text.startswith("<3>config error:") and "threads" in text, text


def test_a_failed_job_is_an_error_in_the_journal(tmp_path):
    """A job that ends failed (here: its book cannot be written, as on a full disk or a folder the service may not
    write) is logged at priority err, so `journalctl -p err` shows it; the rest of the daemon's lines keep theirs."""
    import shutil

    from daemon_util import Daemon, base_config, book_text, skip_reason

    if skip_reason():
        pytest.skip(skip_reason())
    (tmp_path / "allowed").mkdir()
    book = tmp_path / "allowed" / "b.txt"
    book.write_text(book_text(2))
    log = tmp_path / "daemon.log"
    log.touch()  # the daemon appends to it: its stdout is "the journal's" ($JOURNAL_STREAM names it)
    st = log.stat()
    cfg = base_config(tmp_path, jobs={"allowed_dirs": [str(tmp_path / "allowed")], "watch": False})
    d = Daemon(tmp_path, cfg, env={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}).start()
    try:
        shutil.rmtree(d.home / "output")
        (d.home / "output").write_text("not a folder")  # no book can be written under it
        status, s, _ = d.post("/v1/jobs", {"path": str(book), "spec": {"voice": "ryan", "format": "wav",
                                                                       "sampling": {"max_new_tokens": 4}}})
        assert status == 201, s
        assert d.wait_job(s["id"])["state"] == "failed"
    finally:
        assert d.stop() == 0
    lines = d.log_text().splitlines()
    failed = [x for x in lines if f"job {s['id']} failed" in x]
    assert failed and all(x.startswith("<3>") for x in failed), failed or lines[-20:]
    assert any(x.startswith("<6>") and "ready: http" in x for x in lines)
