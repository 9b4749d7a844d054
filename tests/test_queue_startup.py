"""A queue that cannot be opened (jobs.queue: unreachable server, newer schema) stops the daemon and
the job commands with one line naming the problem and a non-zero status, not a traceback."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "data" / "tiny" / "cv_small"
UNREACHABLE = "postgresql://u:p@127.0.0.1:1/db"  # port 1: connection refused


def run_cli(tmp_path: Path, queue: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTS_APPLIANCE_")}
    env.update(PYTHONPATH=str(ROOT), TTS_APPLIANCE_NO_DAEMON="1", TTS_APPLIANCE_CONFIG=str(tmp_path / "none.yaml"),
               TTS_APPLIANCE_JOBS__HOME=str(tmp_path / "home"), TTS_APPLIANCE_JOBS__QUEUE=queue,
               TTS_APPLIANCE_SERVICE__RUNTIME_DIR=str(tmp_path / "run"), TTS_APPLIANCE_MODEL__DEVICE="cpu",
               TTS_APPLIANCE_MODEL__PATH=str(TINY))
    (tmp_path / "none.yaml").write_text("{}\n")
    return subprocess.run([sys.executable, "-m", "appliance.cli", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def error_lines(r: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (r.stdout + r.stderr).splitlines() if "queue database" in line]


@pytest.mark.parametrize("args", [("list",), ("work", "--until-idle"), ("submit", "BOOK")])
def test_job_commands_stop_on_an_unreachable_queue(tmp_path, args):
    pytest.importorskip("psycopg")
    book = tmp_path / "book.txt"
    book.write_text("Hello there.\n")
    r = run_cli(tmp_path, UNREACHABLE, *(str(book) if a == "BOOK" else a for a in args))
    assert r.returncode != 0
    assert "Traceback" not in r.stderr + r.stdout
    [line] = [s for s in r.stderr.splitlines() if s.startswith("error:")]
    assert "cannot connect to the queue database" in line and "127.0.0.1:1" in line
    assert ":p@" not in line  # the password is not shown


def test_daemon_stops_on_an_unreachable_queue_before_loading_the_model(tmp_path):
    pytest.importorskip("psycopg")
    r = run_cli(tmp_path, UNREACHABLE, "daemon")
    assert r.returncode == 1
    assert "Traceback" not in r.stderr + r.stdout
    [line] = error_lines(r)
    assert "cannot start: cannot connect to the queue database" in line
    assert "loading" not in r.stdout.lower()


def test_list_and_daemon_refuse_a_schema_from_a_newer_version(tmp_path):
    db = tmp_path / "queue.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE migrations (id INTEGER PRIMARY KEY, name TEXT, applied_at REAL)")
        c.execute("INSERT INTO migrations VALUES (999, 'future', 0)")
    for args in (("list",), ("daemon",)):
        r = run_cli(tmp_path, str(db), *args)
        assert r.returncode == 1, args
        assert "Traceback" not in r.stderr + r.stdout
        [line] = error_lines(r)
        assert "schema version 999, newer than this tts-appliance knows" in line


@pytest.mark.parametrize("swap", ["directory", "garbage"])
def test_list_and_daemon_stop_on_a_sqlite_queue_that_is_no_database(tmp_path, swap):
    db = tmp_path / "queue.db"
    db.mkdir() if swap == "directory" else db.write_bytes(b"not a database\n" * 512)
    for args in (("list",), ("daemon",)):
        r = run_cli(tmp_path, str(db), *args)
        assert r.returncode == 1, args
        assert "Traceback" not in r.stderr + r.stdout
        [line] = error_lines(r)
        assert f"cannot open the queue database {db}: " in line, line
        assert "loading" not in r.stdout.lower()
