"""Watched inbox: complete files only, temp names ignored, no double ingest, sidecars, failures.

The watcher is ticked until what a test waits for has happened (inbox_util.ticks_until), never for a fixed
time; where a test shows that a file is NOT taken, a file that is taken in the same scans proves the watcher
looked. How long a file has been unchanged is the test's own clock where that is the point (FakeClock)."""
from __future__ import annotations

import json
import logging
import threading

import pytest
from inbox_util import LIMIT_S, FakeClock, inbox_env, ticks_until

BOOK = "Chapter One\n\nThe first chapter has a sentence. And another one.\n\nChapter Two\n\nThe end is near.\n"
OTHER = "Another book.\n\nIt is read while the others are left alone.\n"


@pytest.fixture
def env(tmp_path):
    paths, q, w = inbox_env(tmp_path, quiet_s=0.6, closed_quiet_s=0.2)
    yield paths, q, w
    q.close()


def test_slowly_written_file_taken_only_when_complete(env, monkeypatch):
    """A file that changes at every scan is never complete, however long it has been written in all (here 8
    writes 0.5 s apart on the watcher's clock, past the quiet time of 0.6 s in all); unchanged for the quiet
    time, it is taken."""
    paths, q, w = env
    clock = FakeClock()
    monkeypatch.setattr("jobs.watch.time", clock)
    target = paths.inbox / "slow.txt"
    with open(target, "w") as f:
        for i in range(8):
            f.write(f"Paragraph {i} of a slow upload. " * 5 + "\n\n")
            f.flush()
            w.tick()
            clock.advance(0.5)
            w.tick()  # 0.5 s unchanged: less than the quiet time
            assert target.exists() and q.jobs() == [], "taken while still being written"
    clock.advance(0.5)
    w.tick()  # 1.0 s unchanged: taken
    assert not target.exists() and (paths.processing / "slow.txt").exists()
    ticks_until(w, lambda: q.jobs())
    [job] = q.jobs()
    assert "Paragraph 7" in " ".join(s["original"] for s in q.segments(job["id"]))


def test_events_let_a_closed_file_in_early(env):
    """A close-after-write event lets a file in after `closed_quiet_s`: with a quiet time of an hour, a file
    taken at all was taken on its event."""
    paths, q, w = env
    w.quiet_s = 3600.0  # without the close event it would wait this long
    ticked = threading.Event()
    tick = w.tick

    def counted_tick():  # run() starts the observer before its first tick
        tick()
        ticked.set()

    w.tick = counted_tick
    stop = threading.Event()
    t = threading.Thread(target=w.run, args=(stop, 0.1), daemon=True)
    t.start()
    try:
        assert ticked.wait(LIMIT_S), "the watcher never ticked"
        (paths.inbox / "book.txt").write_text(BOOK)
        for _ in range(int(LIMIT_S / 0.1)):
            if q.jobs():
                break
            stop.wait(0.1)
        assert len(q.jobs()) == 1
    finally:
        stop.set()
        t.join(LIMIT_S)


def test_temp_names_ignored_until_renamed(env):
    paths, q, w = env
    temp = ("book.txt.part", ".hidden.txt", "x.tmp", "y.txt.crdownload", "notes.yaml")
    for name in temp:
        (paths.inbox / name).write_text(BOOK)
    (paths.inbox / "other.txt").write_text(OTHER)  # written with them, taken: the watcher looked at them all
    ticks_until(w, lambda: q.jobs())
    assert len(q.jobs()) == 1 and (paths.processing / "other.txt").exists()
    assert sorted(p.name for p in paths.inbox.iterdir()) == sorted(temp)
    (paths.inbox / "book.txt.part").rename(paths.inbox / "book.txt")
    ticks_until(w, lambda: len(q.jobs()) == 2)
    assert (paths.processing / "book.txt").exists()


def test_same_content_not_taken_twice(env):
    paths, q, w = env
    (paths.inbox / "a.txt").write_text(BOOK)
    ticks_until(w, lambda: q.jobs())
    (paths.inbox / "b.txt").write_text(BOOK)
    ticks_until(w, lambda: (paths.failed / "b.txt.reason.txt").exists())
    assert len(q.jobs()) == 1
    reason = (paths.failed / "b.txt.reason.txt").read_text()
    assert "same content as a.txt" in reason and (paths.failed / "b.txt").read_text() == BOOK


def test_sidecar_yaml_honoured(env):
    paths, q, w = env
    (paths.inbox / "novel.yaml").write_text("voice: vivian\nlanguage: english\nformat: ogg\ntitle: Side Car\n")
    (paths.inbox / "novel.txt").write_text(BOOK)
    ticks_until(w, lambda: q.jobs())
    [job] = q.jobs()
    spec = json.loads(job["spec"])
    # format: the earlier name ogg is stored as opus, as the speech API names Ogg Opus
    assert (spec["voice"], spec["language"], spec["format"], spec["title"]) == ("vivian", "english", "opus", "Side Car")
    assert job["title"] == "Side Car"
    assert (paths.processing / "novel.yaml").exists() and not (paths.inbox / "novel.yaml").exists()


def test_bad_files_go_to_failed_with_reason(env):
    paths, q, w = env
    (paths.inbox / "empty.txt").write_text("")
    (paths.inbox / "blob.txt").write_bytes(bytes(range(256)) * 16)
    (paths.inbox / "bad.txt").write_text(BOOK)
    (paths.inbox / "bad.yaml").write_text("format: aiff\n")
    (paths.inbox / "good.txt").write_text(BOOK + "More.\n")
    ticks_until(w, lambda: "queued" in [j["state"] for j in q.jobs()]
                and all((paths.failed / f"{n}.txt.reason.txt").exists() for n in ("empty", "blob", "bad")))
    assert "empty" in (paths.failed / "empty.txt.reason.txt").read_text()
    assert "binary" in (paths.failed / "blob.txt.reason.txt").read_text().lower()
    assert "unknown format 'aiff'" in (paths.failed / "bad.txt.reason.txt").read_text()
    assert (paths.failed / "empty.txt").exists() and (paths.failed / "blob.txt").exists()
    assert (paths.failed / "bad.yaml").exists()
    assert [j["state"] for j in q.jobs()].count("queued") == 1  # the good one carries on


@pytest.mark.parametrize("yaml_text, where, what", [
    ("voice: vivian\ntitle: Notes: part one\n", "line 2, column 13", "mapping values are not allowed here"),
    ("voice: [vivian\n", "line 2, column 1", "expected ',' or ']', but got '<stream end>' (while parsing a flow"),
    ("\tvoice: vivian\n", "line 1, column 1", "found character '\\t' that cannot start any token"),
])
def test_a_malformed_sidecar_is_one_line_saying_where_and_what_to_fix(env, yaml_text, where, what):
    """PyYAML's message runs over several lines (a snippet of the file, a caret); the reason a user reads (the
    reason file, the failed job's error) is one line: the sidecar, where, what, and how to fix it."""
    paths, q, w = env
    (paths.inbox / "notes.yaml").write_text(yaml_text)
    (paths.inbox / "notes.txt").write_text(BOOK)
    ticks_until(w, lambda: (paths.failed / "notes.txt.reason.txt").exists())
    reason = (paths.failed / "notes.txt.reason.txt").read_text().strip()
    [job] = q.jobs()
    assert job["state"] == "failed" and job["error"] == reason
    assert "\n" not in reason and reason.startswith(f"bad sidecar notes.yaml: {where}: {what}"), reason
    assert "one `key: value` per line" in reason and "drop the book with its sidecar into the inbox again" in reason


def test_finished_jobs_filed_and_sources_kept(env):
    paths, q, w = env
    (paths.inbox / "ok.txt").write_text(BOOK)
    (paths.inbox / "ok.yaml").write_text("title: Fine\n")
    (paths.inbox / "doomed.txt").write_text(BOOK + "Doomed.\n")
    ticks_until(w, lambda: len(q.jobs()) == 2)
    jobs = {json.loads(j["sources"])[0].split("/")[-1]: j["id"] for j in q.jobs()}
    out = paths.output / jobs["ok.txt"]
    (out / "chapters").mkdir(parents=True)
    (out / "Fine.flac").write_bytes(b"fLaC")
    (out / "chapters" / "01 - One.flac").write_bytes(b"fLaC")
    q.finish_job(jobs["ok.txt"], "done", str(out))
    q.fail_job(jobs["doomed.txt"], "unknown voice 'nobody'; available: ryan")
    ticks_until(w, lambda: not any(paths.processing.iterdir()))
    done = paths.done / jobs["ok.txt"]
    assert (done / "ok.txt").read_text() == BOOK and (done / "ok.yaml").exists()
    assert (done / "Fine.flac").exists() and (done / "chapters" / "01 - One.flac").exists()
    assert "unknown voice 'nobody'" in (paths.failed / "doomed.txt.reason.txt").read_text()
    assert (paths.failed / "doomed.txt").exists()
    assert list(paths.processing.iterdir()) == []
    # a failed book may be dropped again (e.g. with a fixed sidecar)
    (paths.inbox / "again.txt").write_text(BOOK + "Doomed.\n")
    ticks_until(w, lambda: len(q.jobs()) == 3)
    assert len(q.jobs()) == 3


def test_a_partial_job_is_filed_with_the_failures_not_as_done(env):
    """A book with failed segments is no finished book: its source goes to failed/ with the reason (the
    first failed segment's error, how to retry, where the audio made so far is), nothing to done/."""
    paths, q, w = env
    (paths.inbox / "half.txt").write_text(BOOK)
    ticks_until(w, lambda: q.jobs())
    [job] = q.jobs()
    first, *rest = q.segments(job["id"])
    q.fail(first["id"], "runaway/truncated audio: 9.0 s for text expected ~1.0 s", retry=False)
    out = paths.output / job["id"]
    out.mkdir(parents=True)
    (out / "half.flac").write_bytes(b"fLaC")
    q.finish_job(job["id"], "partial", str(out), f"1 of {1 + len(rest)} segments failed; "
                                                  f"`tts-appliance retry {job['id']}` requeues them")
    ticks_until(w, lambda: (paths.failed / "half.txt.reason.txt").exists())
    assert not (paths.done / job["id"]).exists() and (paths.failed / "half.txt").read_text() == BOOK
    reason = (paths.failed / "half.txt.reason.txt").read_text()
    assert f"job {job['id']} partial: 1 of" in reason and f"tts-appliance retry {job['id']}" in reason
    assert f"segment {first['idx']}: runaway/truncated audio" in reason and str(out) in reason
    assert [r["state"] for r in q.inbox_files() if r["name"] == "half.txt"] == ["failed"]


def test_a_sidecar_key_it_does_not_know_is_named_once_in_the_log_and_the_job_s_log(env, caplog):
    """A misspelt key (`voise`) is no reason to refuse the book (the sidecar is the user's hand-written file), nor
    to be silent: one warning and one line in the job's log name it and the valid keys; the rest is honoured."""
    paths, q, w = env
    (paths.inbox / "typo.yaml").write_text("voise: vivian\ntitle: Spelt Wrong\n")
    (paths.inbox / "typo.txt").write_text(BOOK)
    with caplog.at_level(logging.INFO, logger="jobs"):
        ticks_until(w, lambda: q.jobs())
    [job] = q.jobs()
    assert job["state"] == "queued" and job["title"] == "Spelt Wrong"
    told = [r for r in caplog.records if "voise" in r.getMessage()]
    assert len(told) == 1 and told[0].levelname == "WARNING", [r.getMessage() for r in caplog.records]
    lines = [e["message"] for e in q.events(job["id"]) if "voise" in e["message"]]
    assert len(lines) == 1 and lines[0] == told[0].getMessage().removeprefix("inbox: "), lines
    assert "sidecar typo.yaml: unknown key(s) 'voise', ignored; valid keys: voice (str), language (str)" in lines[0]
