"""What the spool folder keeps (jobs.deletion, jobs.retention, jobs.queue.removal), on SQLite and PostgreSQL:
segment audio is compact FLAC; `delete` removes a job and every file of it but what another job shares; the
retention removes a finished job's working files after jobs.keep_work_days, keeping its outputs, its row and
its counts, and refusing redo and retry after it; what nothing names any more goes after a day."""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from test_queue import ToneEngine, _chapters

from jobs.deletion import delete_job
from jobs.document import SegmentText
from jobs.queue import Queue, QueueError
from jobs.report import job_summary
from jobs.retention import DAY_S, prune
from jobs.settings import JobSpec, resolve_home
from jobs.worker import Worker


@pytest.fixture
def spool(location, tmp_path):
    """(spool paths, queue): the queue a SQLite file in the spool folder, or a PostgreSQL database."""
    url = str(location) if str(location).startswith("postgres") else None
    paths = resolve_home(tmp_path / "home", queue=url).ensure()
    q = Queue(paths.db)
    yield paths, q
    q.close()


def _work(q, paths, engine=None) -> ToneEngine:
    engine = engine or ToneEngine()
    worker = Worker(q, engine, paths, batch_size=8, heartbeat_s=0.2)
    while worker.run_once():
        pass
    worker.close()
    return engine


def _audio(q, job_id) -> list[Path]:
    return sorted({Path(s["audio_path"]) for s in q.segments(job_id) if s["audio_path"]})


def _size(paths) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


def test_segment_audio_is_24_bit_flac_read_back_as_made(tmp_path):
    """A segment's audio is stored as FLAC of 24-bit samples: the model's samples to 2**-23, about half the
    bytes of the float32 WAV it was before."""
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(paths.db)
    job = q.add_job(JobSpec(format="wav"), _chapters(1, 2))
    engine = _work(q, paths)
    for seg in q.segments(job):
        path = Path(seg["audio_path"])
        info = sf.info(str(path))
        assert path.suffix == ".flac" and info.format == "FLAC" and info.subtype == "PCM_24", (path, info)
        made = engine.synthesize([_request(seg["text"], seg["seed_used"])])[0].audio
        stored, sr = sf.read(str(path), dtype="float32")
        assert sr == 24000 and stored.shape == made.shape and np.abs(stored - made).max() <= 2 ** -23
        assert path.stat().st_size < 0.6 * made.size * 4  # a float32 WAV: 4 bytes a sample
    q.close()


def _request(text, seed):
    from engines.api import SamplingParams, SynthesisRequest

    return SynthesisRequest(text=text, sampling=SamplingParams(seed=seed))


def test_delete_removes_the_job_and_its_files_but_what_another_job_shares(spool, tmp_path):
    paths, q = spool
    upload = paths.home / "uploads" / "abc" / "book.txt"
    upload.parent.mkdir(parents=True)
    upload.write_text("x" * 1000)
    own = tmp_path / "mine.txt"  # a user's own file a job read: never removed
    own.write_text("mine")
    shared = [("One", [SegmentText("Shared words are spoken here.", "s", 100),
                       SegmentText("Only the first job says this.", "a", 100)])]
    first = q.add_job(JobSpec(format="wav", title="First"), shared, sources=[str(upload)])
    second = q.add_job(JobSpec(format="flac", title="Second"),
                       [("One", [SegmentText("Shared words are spoken here.", "s", 100)])], sources=[str(own)])
    engine = _work(q, paths)
    assert len(engine.calls) == 2  # the shared segment was synthesized once
    first_audio, second_audio = _audio(q, first), _audio(q, second)
    assert set(second_audio) < set(first_audio)
    out = paths.output / first
    done = paths.done / first  # the inbox's links to the outputs
    for f in out.rglob("*"):
        if f.is_file():
            (done / f.relative_to(out)).parent.mkdir(parents=True, exist_ok=True)
            os.link(f, done / f.relative_to(out))
    (done / "book.txt").write_text("the file the user dropped")
    gone = [p for p in first_audio if p not in second_audio]
    expected = _size(gone) + _size(f for f in out.rglob("*")) + upload.stat().st_size

    result = delete_job(q, paths, first)

    assert result == {"id": first, "deleted": True, "freed_bytes": expected}
    with pytest.raises(QueueError, match="no job"):
        q.job(first)
    assert q.segments(first) == [] and q.chapters(first) == [] and q.events(first) == []
    assert not any(p.exists() for p in gone) and all(p.is_file() for p in second_audio)
    assert not out.exists() and not upload.exists() and not upload.parent.exists()
    assert sorted(p.name for p in done.rglob("*")) == ["book.txt"]  # the user's file stays, the links went
    assert own.is_file()
    assert q.job(second)["state"] == "done"
    with pytest.raises(QueueError, match="no job"):
        delete_job(q, paths, first)


def test_delete_cancels_a_running_job_first_and_its_submit_may_come_again(spool):
    paths, q = spool
    key = "k" * 64
    job, mine = q.claim_submission(key)  # as jobs.submit does: the key first, then the job under its id
    assert mine and q.add_job(JobSpec(format="wav"), _chapters(1, 3), job_id=job) == job
    worker = Worker(q, ToneEngine(), paths, batch_size=1, heartbeat_s=0.2)
    worker.run_once()  # one segment done, the rest queued: the job runs
    assert q.job(job)["state"] == "running" and q.claim_submission(key) == (job, False)
    written = _audio(q, job)
    assert written and all(p.is_file() for p in written)
    assert delete_job(q, paths, job)["deleted"]
    assert q.segments(job) == [] and not any(p.exists() for p in written)
    again, mine = q.claim_submission(key)  # the key of a deleted job is claimed anew: a new job
    assert mine and again != job
    worker.close()


def test_retention_removes_working_files_keeps_outputs_counts_and_refuses_redo(spool):
    paths, q = spool
    old = q.add_job(JobSpec(format="wav", title="Old"), _chapters(2, 2) + [
        ("Bad", [SegmentText("SILENT words here.", "x", 100)])])
    recent = q.add_job(JobSpec(format="wav", title="Recent"), _chapters(1, 1, prefix="Recent"))
    _work(q, paths)
    assert q.job(old)["state"] == "partial" and q.job(recent)["state"] == "done"
    now = time.time()
    with q.tx() as c:  # the old job ended 8 days ago
        c.execute("UPDATE jobs SET finished_at = ? WHERE id = ?", (now - 8 * DAY_S, old))
    before = job_summary(q, old)
    old_audio, recent_audio = _audio(q, old), _audio(q, recent)
    outputs = sorted(p for p in (paths.output / old).rglob("*") if p.is_file())
    held = _size(old_audio)

    result = prune(q, paths, keep_work_days=7, now=now)

    assert result["jobs"] == [old] and result["freed_bytes"] == held > 0 and result["files"] == len(old_audio)
    assert not any(p.exists() for p in old_audio) and all(p.is_file() for p in recent_audio)
    assert all(p.is_file() for p in outputs)  # the outputs stay
    after = job_summary(q, old)
    assert after["progress"] == before["progress"] and after["failed_segments"] == before["failed_segments"]
    assert after["length"] == before["length"] and before["length"]["seconds"] > 0  # the library's "how long"
    assert [s["state"] for s in q.segments(old)] == ["failed"]  # only the failed rows stay
    assert q.job(old)["work_removed_at"] and "working files removed" in q.events(old)[-1]["message"]
    with pytest.raises(QueueError, match="keep_work_days"):
        q.redo(old, 0)
    with pytest.raises(QueueError, match="keep_work_days"):
        q.retry(old)
    assert prune(q, paths, keep_work_days=7, now=now)["jobs"] == []  # nothing more to do
    assert prune(q, paths, keep_work_days=None, now=now + 30 * DAY_S)["jobs"] == []  # null: kept


def test_retention_keeps_audio_a_kept_job_shares(spool):
    paths, q = spool
    text = [("One", [SegmentText("The same words in two books.", "s", 100)])]
    old = q.add_job(JobSpec(format="wav", title="Old"), text)
    _work(q, paths)
    new = q.add_job(JobSpec(format="mp3", title="New"), text)
    engine = _work(q, paths)
    assert engine.calls == []  # a cache hit
    now = time.time()
    with q.tx() as c:
        c.execute("UPDATE jobs SET finished_at = ? WHERE id = ?", (now - 8 * DAY_S, old))
    shared = _audio(q, new)
    assert shared == _audio(q, old)
    assert prune(q, paths, keep_work_days=7, now=now)["jobs"] == [old]
    assert all(p.is_file() for p in shared)
    q.redo(new, 0, seed=5)  # the new job's audio is still there for a redo
    _work(q, paths)
    assert q.job(new)["state"] == "done"


def test_a_cache_entry_removed_with_its_job_is_synthesized_again(spool):
    """A segment whose audio was made before by a job deleted since is synthesized, not pointed at a file
    that went (Records.complete_cached)."""
    paths, q = spool
    text = [("One", [SegmentText("Words said once, then again.", "s", 100)])]
    first = q.add_job(JobSpec(format="wav", title="First"), text)
    _work(q, paths)
    delete_job(q, paths, first)
    again = q.add_job(JobSpec(format="wav", title="Again"), text)
    engine = _work(q, paths)
    assert len(engine.calls) == 1 and q.job(again)["state"] == "done"
    assert all(p.is_file() for p in _audio(q, again))


def test_what_nothing_names_goes_after_a_day(spool):
    paths, q = spool
    job = q.add_job(JobSpec(format="wav"), _chapters(1, 1))
    _work(q, paths)
    kept = _audio(q, job)
    old = time.time() - 2 * DAY_S
    stray = paths.audio / "ab" / "ab12.deadbeef.flac"  # written, never recorded (a kill between the two)
    fresh = paths.audio / "ab" / "ab34.deadbeef.flac"  # written a moment ago: its record may still come
    preview = paths.home / "uploads" / "preview-1" / "doc.txt"
    narration = paths.home / "narration" / "0123.epub"
    for p in (stray, fresh, preview, narration):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x" * 100)
    for p in (stray, preview, preview.parent, narration):
        os.utime(p, (old, old))
    result = prune(q, paths, keep_work_days=7)
    assert result["jobs"] == [] and result["files"] == 3 and result["freed_bytes"] == 300
    assert not stray.exists() and not preview.parent.exists() and not narration.exists()
    assert fresh.is_file() and all(p.is_file() for p in kept)


def test_a_report_reads_a_queue_its_new_step_is_not_applied_to_yet(tmp_path, monkeypatch):
    """`status` and `list` read a queue read-only, without migrating it: one made by the version before schema
    step 8 (no `removed_counts` yet) is still summed up."""
    import jobs.queue.schema as schema

    db = tmp_path / "queue.db"
    monkeypatch.setattr(schema, "MIGRATIONS", [m for m in schema.MIGRATIONS if m[0] < 8])
    monkeypatch.setattr(schema, "LATEST", 7)
    q = Queue(db)
    job = q.add_job(JobSpec(format="wav"), _chapters(1, 3))
    q.close()
    monkeypatch.undo()
    with Queue.reading(db) as r:
        assert job_summary(r, job)["progress"]["total"] == 3


def test_a_pruned_job_keeps_its_cover_and_place_a_deleted_one_loses_both(spool):
    """The library shows a finished book's cover and its listener's place for as long as the job is there: the
    retention leaves them (they are no working files), even once a day old; `delete` takes both."""
    paths, q = spool
    jobs = [q.add_job(JobSpec(format="wav"), _chapters(1, 2)) for _ in range(2)]
    _work(q, paths)
    covers = []
    for i, job in enumerate(jobs):
        cover = paths.home / "covers" / f"cover{i}.png"
        cover.parent.mkdir(parents=True, exist_ok=True)
        cover.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
        covers.append(cover)
        with q.tx() as c:
            c.execute("UPDATE jobs SET meta = ?, finished_at = ? WHERE id = ?",
                      (f'{{"cover_path": "{cover}"}}', time.time() - 8 * DAY_S, job))
        q.set_position(job, 12.5, 0)
    old = time.time() - 2 * DAY_S
    for cover in covers:
        os.utime(cover, (old, old))

    assert sorted(prune(q, paths, keep_work_days=7)["jobs"]) == sorted(jobs)
    assert all(c.is_file() for c in covers) and job_summary(q, jobs[0])["cover"]
    prune(q, paths, keep_work_days=7, now=time.time() + 3 * DAY_S)  # the orphan sweep leaves them too
    assert all(c.is_file() for c in covers) and q.position(jobs[0])["position_s"] == 12.5

    delete_job(q, paths, jobs[0])
    assert not covers[0].exists() and covers[1].is_file()
    assert q.position(jobs[0]) is None and q.position(jobs[1])["position_s"] == 12.5


def _ctrl_c_as_in_a_terminal() -> None:
    """In the child before it starts: SIGINT at its default, as a terminal's command has it (a shell runs a
    background job, the test run itself perhaps, with SIGINT ignored, and the child would inherit that)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("command", [["work", "--until-idle"], ["watch", "--no-work"]])
def test_the_job_commands_apply_the_retention_as_the_daemon_does(tmp_path, command):
    """`work` and `watch` (the daemon's worker and watcher in a command's process) apply jobs.keep_work_days as
    the daemon does: a round at their start, then every hour. `work --until-idle` ends after its round; `watch`
    is stopped (Ctrl-C) once the old job's working files are gone, however long that took."""
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(paths.db)
    old = q.add_job(JobSpec(format="wav", title="Old"), _chapters(1, 2))
    _work(q, paths)
    with q.tx() as c:  # it ended 8 days ago: past jobs.keep_work_days (7)
        c.execute("UPDATE jobs SET finished_at = ? WHERE id = ?", (time.time() - 8 * DAY_S, old))
    audio = _audio(q, old)
    assert audio and all(p.is_file() for p in audio)
    model = ["--model", str(root / "tests" / "data" / "tiny" / "cv_small"), "--device", "cpu"]
    proc = subprocess.Popen([sys.executable, "-m", "appliance.cli", *command, "--home", str(paths.home),
                             *(model if command[0] == "work" else [])], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "TTS_APPLIANCE_NO_DAEMON": "1"},
                            preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        if command[0] == "watch":
            deadline = time.monotonic() + 300  # (a failure guard)
            while not q.job(old)["work_removed_at"] and proc.poll() is None:
                assert time.monotonic() < deadline, "the watch command never applied the retention"
                time.sleep(0.1)
            proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, 130) if command[0] == "watch" else proc.returncode == 0, out
    assert q.job(old)["work_removed_at"] and not any(p.exists() for p in audio), out
    assert (paths.output / old).is_dir()  # its outputs stay
    q.close()
