"""Inbox hardening: links are never followed, lock/temp/hidden files ignored (logged once), every
file in processing/ ends as a job or in failed/ (also after a crash or stop mid-ingest), parsing limits,
and an ingest failure shows in `tts-appliance list`."""
from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from inbox_util import LIMIT_S, inbox_env, ticks_until

from jobs.ingest.isolate import IngestLimits
from jobs.queue import Queue
from jobs.settings import resolve_home
from jobs.watch import RECOVERED, InboxWatcher

BOOK = "Chapter One\n\nThe first chapter has a sentence.\n\nChapter Two\n\nThe end is near.\n"
OTHER = "Another book.\n\nIt is taken in the same scans as the files left alone.\n"


@pytest.fixture
def env(tmp_path):
    paths, q, w = inbox_env(tmp_path, quiet_s=0.3, closed_quiet_s=0.1)
    yield paths, q, w
    q.close()


def _deep_html(n=300_000) -> str:
    return "<html><body>" + "<div>x " * n


def test_links_are_never_followed(env, tmp_path, caplog):
    paths, q, w = env
    secret = tmp_path / "passwd"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    (paths.inbox / "passwd.txt").symlink_to(secret)
    (paths.inbox / "inner.txt").symlink_to(paths.home / "queue.db")
    (paths.inbox / "sub").mkdir()
    (paths.inbox / "sub" / "book.txt").write_text(BOOK)
    (paths.inbox / "other.txt").write_text(OTHER)  # a plain file beside them, taken: the watcher looked at all
    with caplog.at_level(logging.INFO, logger="jobs.watch"):
        ticks_until(w, lambda: q.jobs())
    assert len(q.jobs()) == 1 and list(paths.processing.iterdir()) == [paths.processing / "other.txt"]
    assert (paths.inbox / "passwd.txt").is_symlink() and (paths.inbox / "sub" / "book.txt").exists()
    told = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
    assert sorted(m.split(":")[1].strip() for m in told) == ["ignoring inner.txt", "ignoring passwd.txt",
                                                           "ignoring sub"]  # once each, over many ticks
    assert all("symbolic link" in m for m in told if ".txt" in m)


def test_a_file_swapped_for_a_link_after_the_scan_is_not_taken(env, tmp_path):
    paths, q, w = env
    secret = tmp_path / "secret.txt"
    secret.write_text(BOOK)
    book = paths.inbox / "book.txt"
    book.write_text(BOOK)
    book.unlink()
    book.symlink_to(secret)
    assert w.take(book) is None and q.jobs() == [] and book.is_symlink()


def test_lock_temp_and_hidden_files_ignored_and_logged_once(env, caplog):
    paths, q, w = env
    names = ["~$novel.docx", ".~lock.novel.odt#", "book.txt.part", "x.tmp", "y.epub.crdownload", ".book.txt.swp",
             "draft.txt~", ".hidden.txt", "#autosave.txt#"]
    for name in names:
        (paths.inbox / name).write_text(BOOK)
    (paths.inbox / "other.txt").write_text(OTHER)  # a plain file beside them, taken: the watcher looked at all
    with caplog.at_level(logging.INFO, logger="jobs.watch"):
        ticks_until(w, lambda: q.jobs())
    assert len(q.jobs()) == 1 and sorted(p.name for p in paths.inbox.iterdir()) == sorted(names)
    told = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
    assert len(told) == len(names)
    assert sum("office lock file" in m for m in told) == 2


def test_files_left_in_processing_are_taken_again_at_start(env):
    """A crash after the move (no row) or mid-ingest (row `ingesting`): recover() makes them jobs."""
    paths, q, w = env
    (paths.processing / "norow.txt").write_text(BOOK)
    (paths.processing / "mid.txt").write_text(BOOK + "Mid.\n")
    w._record("d1", paths.processing / "mid.txt", None, "ingesting", None)
    w.recover()
    jobs = {json.loads(j["sources"])[0].split("/")[-1]: j for j in q.jobs()}
    assert sorted(jobs) == ["mid.txt", "norow.txt"] and all(j["state"] == "queued" for j in jobs.values())
    rows = {r["name"]: r for r in q.inbox_files()}
    assert rows["mid.txt"]["state"] == rows["norow.txt"]["state"] == "processing"
    w.recover()  # nothing twice
    assert len(q.jobs()) == 2


def test_recover_attaches_a_job_made_just_before_a_crash(env):
    from jobs.submit import submit_file
    from jobs.settings import JobSpec

    paths, q, w = env
    src = paths.processing / "made.txt"
    src.write_text(BOOK)
    w._record("d2", src, None, "ingesting", None)
    job_id, err = submit_file(q, paths, src, JobSpec())  # the crash came right after this
    assert err is None
    w.recover()
    assert [j["id"] for j in q.jobs()] == [job_id]
    assert [(r["job_id"], r["state"]) for r in q.inbox_files() if r["name"] == "made.txt"] == [(job_id, "processing")]


def test_the_inbox_on_either_queue(tmp_path, location, caplog):
    """Taking a file, the same content again, recovery and filing the results: SQLite or PostgreSQL."""
    from jobs.settings import JobSpec
    from jobs.submit import submit_file
    from jobs.watch_files import sha256_file

    paths = resolve_home(tmp_path / "home", queue=str(location)).ensure()
    q = Queue(location)
    w = InboxWatcher(paths, queue=q)
    try:
        (paths.inbox / "book.txt").write_text(BOOK)
        digest = sha256_file(paths.inbox / "book.txt")
        job = w.take(paths.inbox / "book.txt")
        assert [j["id"] for j in q.jobs()] == [job] and q.inbox_file(digest)["state"] == "processing"
        (paths.inbox / "again.txt").write_text(BOOK)
        assert w.take(paths.inbox / "again.txt") is None
        assert f"already taken as job {job}" in (paths.failed / "again.txt.reason.txt").read_text()
        src = paths.processing / "Bücher.txt"  # a job made from it just before a crash
        src.write_text(BOOK + "More.\n")
        w._record("d2", src, None, "ingesting", None)
        made, _ = submit_file(q, paths, src, JobSpec())
        with caplog.at_level(logging.INFO, logger="jobs.watch"):
            w.recover()
        assert f"Bücher.txt already became job {made}" in caplog.text and q.inbox_file("d2")["job_id"] == made
        out = paths.output / job
        out.mkdir(parents=True)
        (out / "book.m4b").write_bytes(b"audio")
        q.finish_job(job, "done", output_dir=str(out))
        w.collect()
        assert (paths.done / job / "book.txt").read_text() == BOOK and (paths.done / job / "book.m4b").exists()
        assert q.inbox_file(digest)["state"] == "done" and q.inbox_files_of_ended_jobs() == []
    finally:
        w.close()
        q.close()


def test_interrupted_twice_goes_to_failed_with_reason(env):
    paths, q, w = env
    (paths.processing / "again.txt").write_text(BOOK)
    w._record("d3", paths.processing / "again.txt", None, "ingesting", RECOVERED)
    w.recover()
    assert q.jobs() == [] and (paths.failed / "again.txt").exists()
    assert "interrupted twice" in (paths.failed / "again.txt.reason.txt").read_text()


def test_file_over_the_limits_fails_with_reason(env):
    """A CPU-time limit, not a wall-clock one: a loaded machine slows a child's start-up in wall time, not
    in CPU time. The small file needs a small part of the limit (about 0.15 s of CPU, start-up included),
    the deep one many times it (about 4.5 s per 300,000 elements: the one here would need some 30 s)."""
    paths, q, w = env
    w.limits = IngestLimits(cpu_s=1)
    (paths.inbox / "deep.html").write_text(_deep_html(2_000_000))
    (paths.inbox / "fine.txt").write_text(BOOK)
    ticks_until(w, lambda: len(q.jobs()) == 2)
    reason = (paths.failed / "deep.html.reason.txt").read_text()
    assert "parsing deep.html used more than 1 s of CPU time; raise jobs.ingest_cpu_s or split the file" in reason
    assert (paths.failed / "deep.html").exists() and list(paths.processing.iterdir()) == [paths.processing / "fine.txt"]
    states = sorted(j["state"] for j in q.jobs())
    assert states == ["failed", "queued"]


def test_the_inbox_has_the_size_cap_of_submit_and_names_its_key(env):
    paths, q, w = env
    w.limits = IngestLimits(file_mb=1)
    (paths.inbox / "big.txt").write_text("Golf is a long book. " * 60_000)  # ~1.2 MiB
    ticks_until(w, lambda: (paths.failed / "big.txt.reason.txt").exists())
    assert "raise jobs.max_file_mb in the config" in (paths.failed / "big.txt.reason.txt").read_text()


def _until(cond, what: str) -> None:
    """Wait for `cond()` (a failure guard of LIMIT_S, not a time the test relies on)."""
    deadline = time.monotonic() + LIMIT_S
    while not cond():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def test_stopping_cancels_the_ingest_and_the_file_is_taken_at_next_start(env):
    from jobs.ingest import isolate

    paths, q, w = env
    (paths.inbox / "deep.html").write_text(_deep_html())
    stop = threading.Event()
    t = threading.Thread(target=w.run, args=(stop, 0.1), daemon=True)
    t.start()
    _until(lambda: isolate._live, "the child parsing deep.html")  # (its parse needs seconds of CPU)
    stop.set()
    t.join(LIMIT_S)
    # stopped, not waited for: the parse would have made it a job
    assert not t.is_alive() and q.jobs() == [] and (paths.processing / "deep.html").exists()
    [row] = q.inbox_files()
    assert (row["state"], row["reason"]) == ("ingesting", None)  # a clean stop is not counted as an attempt
    (paths.processing / "deep.html").write_text("<p>Now short.</p>")  # (so the retry is quick)
    w2 = InboxWatcher(paths, queue=q)
    w2.recover()
    [job] = q.jobs()
    assert job["state"] == "queued"


def test_ingest_failure_is_listed_with_file_name_and_reason(env):
    from click.testing import CliRunner

    from appliance.cli import cli

    paths, q, w = env
    (paths.inbox / "empty.txt").write_text("")
    (paths.inbox / "blank.md").write_text("\n\n   \n")
    (paths.inbox / "side.txt").write_text(BOOK)
    (paths.inbox / "side.yaml").write_text("voice: [unclosed\n")
    ticks_until(w, lambda: len(q.jobs()) == 3)
    res = CliRunner().invoke(cli, ["list", "--home", str(paths.home)], catch_exceptions=False)
    assert res.exit_code == 0
    out = res.output
    assert "empty.txt" in out and "the file is empty" in out
    assert "blank.md" in out and "contains no text" in out
    assert "side.txt" in out and "bad sidecar side.yaml" in out, out  # no job was made of it before
    assert (paths.failed / "side.txt").exists() and (paths.failed / "side.yaml").exists()


def test_daemon_streams_while_a_pathological_file_is_parsed(tmp_path):
    """A file that takes long to parse is read in a child process: a speech stream started meanwhile
    completes while the file is still being parsed, and SIGTERM kills the parse instead of waiting for it,
    leaving the file for the next start."""
    from daemon_util import Daemon, base_config, skip_reason

    if skip_reason():
        pytest.skip(skip_reason())
    cfg = base_config(tmp_path, jobs={"watch_quiet_s": 0.2, "ingest_wall_s": 120.0, "ingest_cpu_s": 120.0})
    d = Daemon(tmp_path, cfg).start()
    try:
        (d.home / "inbox" / "deep.html").write_text(_deep_html(2_000_000))  # about 30 s of CPU to parse
        _until(lambda: (d.home / "processing" / "deep.html").exists(), "deep.html taken")
        c = d.conn()
        c.request("POST", "/v1/audio/speech", headers={"Content-Type": "application/json"},
                  body=json.dumps({"input": "Hello there.", "voice": "ryan", "response_format": "pcm",
                                   "max_frames": 6, "seed": 1, "stream": True}))
        r = c.getresponse()
        data = r.read()
        c.close()
        assert r.status == 200 and len(data) > 0
        assert not (d.home / "failed" / "deep.html").exists()  # the stream ended while the file was parsed
        assert "deep.html ->" not in d.log_text()
    finally:
        assert d.stop() == 0
    log = d.log_text()
    # SIGTERM killed the parse (it did not wait for it, nor give up waiting after the stop timeout)
    assert "stopped 1 running ingest(s)" in log and "reading deep.html was stopped" in log, log[-3000:]
    assert "stop timeout" not in log and "deep.html ->" not in log, log[-3000:]
    assert (d.home / "processing" / "deep.html").exists()  # taken again at the next start


def test_several_files_are_read_at_once_within_the_limit(env):
    """jobs.ingest_parallel child processes at once; the other files wait in the inbox for a free one."""
    from jobs.ingest import isolate

    paths, q, w = env
    w.limits = IngestLimits(parallel=2, wall_s=60)
    w.stop_event = threading.Event()
    for name in ("a.html", "b.html", "c.html"):
        (paths.inbox / name).write_text(_deep_html() + name)
    deadline = time.time() + LIMIT_S  # a failure guard
    while not any(paths.processing.iterdir()) and time.time() < deadline:
        w.tick()
        time.sleep(0.1)
    assert sorted(p.name for p in paths.processing.iterdir()) == ["a.html", "b.html"]
    assert [p.name for p in paths.inbox.iterdir()] == ["c.html"]
    _until(lambda: len(isolate._live) == 2, "both children parsing at the same time")
    w.stop_event.set()  # cancels both: they stay in processing/ for the next start
    assert w.drain(10)
    w.close()
    assert sorted(r["state"] for r in q.inbox_files()) == ["ingesting", "ingesting"]
