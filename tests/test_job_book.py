"""A job's book written while its synthesis goes on (jobs.book.JobBook): chapters as they complete, the same
files as an assembly from scratch, and a fresh start when a segment changed after its chapter was written."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf

from jobs.assemble import write_segment_audio
from jobs.book import JobBook, assemble_job
from jobs.queue import Queue
from jobs.settings import JobSpec, Paths
from jobs.submit import submit_file

SR = 24000
TEXT = """Chapter 1

The first chapter has two short paragraphs of text.

And here is the second one, to make a second segment.

Chapter 2

The second chapter speaks of other things entirely.

Chapter 3

A third and last chapter closes the little book.
"""


def _job(tmp_path, fmt="flac"):
    paths = Paths(tmp_path / "home").ensure()
    q = Queue(paths.db)
    src = tmp_path / "book.txt"
    src.write_text(TEXT)
    job_id, err = submit_file(q, paths, src, JobSpec(voice="vivian", language="english", format=fmt, title="Little"))
    assert err is None
    return paths, q, job_id


def _store(paths, q, rows, amp=0.1, tag="a"):
    """Complete claimed segment rows with distinct, deterministic audio."""
    for r in rows:
        rng = np.random.default_rng(r["idx"])
        audio = (amp * np.sin(np.arange(SR // 2) * (0.01 + 0.002 * r["idx"])) + 0.01 * rng.standard_normal(SR // 2))
        path = paths.audio / f"{tag}{r['idx']}.wav"
        write_segment_audio(path, audio.astype(np.float32), SR)
        assert q.complete(r["id"], f"key-{tag}{r['idx']}", str(path), SR, SR // 2, r["seed"])


def _by_chapter(q, job_id):
    out = {}
    for s in q.segments(job_id):
        out.setdefault(s["chapter_idx"], []).append(s)
    return out


def _book_audio(paths, job_id):
    manifest = json.loads((paths.output / job_id / "manifest.json").read_text())
    book = sf.read(manifest["output"]["book"])[0]
    chapters = [sf.read(p)[0] for p in sorted((paths.output / job_id / "chapters").iterdir())
                if p.suffix not in (".srt", ".vtt")]
    return book, chapters, manifest


def test_chapters_are_written_as_they_complete_and_equal_a_fresh_assembly(tmp_path):
    paths, q, job_id = _job(tmp_path)
    chapters = _by_chapter(q, job_id)
    assert len(chapters) >= 3
    rows = {r["id"]: r for r in q.claim("w", 100, 60)}
    book = JobBook.of(q, paths, job_id)
    assert book.advance(q.segments(job_id)) == 0  # no audio yet
    _store(paths, q, [rows[s["id"]] for s in chapters[min(chapters)]])
    assert book.advance(q.segments(job_id)) == 1  # chapter 1 complete, the others pending
    book._last.result()
    assert len(list((paths.output / job_id / "chapters").iterdir())) == 1  # written before the job ends
    rest = [rows[s["id"]] for idx in sorted(chapters)[1:] for s in chapters[idx]]
    _store(paths, q, rest)
    assert assemble_job(q, paths, job_id, book=book) == "done"
    followed = _book_audio(paths, job_id)
    finished = followed[2]["job"]["finished_at"]  # the manifest says when the job finished, as the queue does
    assert finished is not None and finished == q.job(job_id)["finished_at"]
    assert followed[2]["language"] == "en"  # the job's "english" as a BCP-47 tag (the page's captions use it)
    assert assemble_job(q, paths, job_id) == "done"  # from scratch, over the same files
    fresh = _book_audio(paths, job_id)
    assert np.array_equal(followed[0], fresh[0]) and followed[0].size > SR
    assert all(np.array_equal(a, b) for a, b in zip(followed[1], fresh[1])) and len(followed[1]) == len(fresh[1])
    assert np.array_equal(np.concatenate(followed[1]), followed[0])  # the book is its chapters in order
    assert [c.get("start_s") for c in followed[2]["chapters"]] == [c.get("start_s") for c in fresh[2]["chapters"]]
    assert not list((paths.output / job_id).glob(".*"))  # no temp file left behind


def test_a_followed_book_reads_only_its_pending_and_handed_over_chapters(tmp_path, monkeypatch):
    """A book in work is followed from the queue (JobBook.follow) without reading every segment row of the
    job at each look (that made a long book O(segments^2)): only the pending rows are counted and the rows
    of the chapters handed over are read; the book is the same as one assembled from scratch."""
    paths, q, job_id = _job(tmp_path)
    chapters = _by_chapter(q, job_id)
    rows = {r["id"]: r for r in q.claim("w", 100, 60)}
    reads = []
    plain = q.segments
    monkeypatch.setattr(q, "segments", lambda job, **kw: reads.append(kw) or plain(job, **kw))
    book = JobBook.of(q, paths, job_id)
    assert book.follow(q) == 0  # no audio yet
    for idx in sorted(chapters):
        _store(paths, q, [rows[s["id"]] for s in chapters[idx]])
        assert book.follow(q) == 1  # this chapter, now complete
    assert reads and all(kw.get("chapter_idx") is not None or kw.get("limit") == 1 for kw in reads), reads
    assert sum(1 for kw in reads if kw.get("chapter_idx") is not None) == len(chapters)  # each chapter read once
    monkeypatch.setattr(q, "segments", plain)
    assert assemble_job(q, paths, job_id, book=book) == "done"
    followed = _book_audio(paths, job_id)
    assert assemble_job(q, paths, job_id) == "done"
    fresh = _book_audio(paths, job_id)
    assert np.array_equal(followed[0], fresh[0]) and followed[0].size > SR


def test_a_segment_changed_after_its_chapter_was_written_starts_the_book_over(tmp_path):
    paths, q, job_id = _job(tmp_path)
    rows = q.claim("w", 100, 60)
    _store(paths, q, rows, tag="a")
    book = JobBook.of(q, paths, job_id)
    assert book.advance(q.segments(job_id)) >= 3
    book._last.result()
    stale = sf.read(sorted((paths.output / job_id / "chapters").iterdir())[0])[0]
    first = min(rows, key=lambda r: r["idx"])
    q.redo(job_id, first["idx"])  # the user asks for that segment again (a new seed)
    again = q.claim("w", 100, 60)
    assert [r["idx"] for r in again] == [first["idx"]]
    _store(paths, q, [{**again[0], "idx": first["idx"] + 100}], tag="b")  # other audio for it
    assert assemble_job(q, paths, job_id, book=book) == "done"
    followed, chapters, _ = _book_audio(paths, job_id)
    assert not np.array_equal(chapters[0], stale)  # chapter 1 was written again, with the new take
    assert assemble_job(q, paths, job_id) == "done"
    assert np.array_equal(followed, _book_audio(paths, job_id)[0])


def test_a_chapter_that_cannot_be_written_stops_the_book_and_fails_the_job(tmp_path):
    paths, q, job_id = _job(tmp_path, fmt="wav")
    _store(paths, q, q.claim("w", 100, 60))
    chapters = _by_chapter(q, job_id)
    second = chapters[sorted(chapters)[1]][0]
    book = JobBook.of(q, paths, job_id)
    Path(second["audio_path"]).unlink()  # the cached audio of chapter 2 is gone
    assert book.advance(q.segments(job_id)) >= 3
    book._last.result()
    assert book.error is not None and book.progress()["chapters"] == f"1/{len(chapters)}"  # nothing after it
    assert assemble_job(q, paths, job_id, book=book) == "failed"  # started over: fails again, saying why
    job = q.job(job_id)
    assert job["error"].startswith("assembly failed: ") and second["audio_path"].split("/")[-1] in job["error"]
    assert not list((paths.output / job_id).glob("Little.*")), "a book without its second chapter"


def test_a_failed_assembly_fails_the_job_and_is_tried_once_more_after_a_restart(tmp_path):
    paths, q, job_id = _job(tmp_path, fmt="wav")
    _store(paths, q, q.claim("w", 100, 60))
    blocker = paths.output / job_id
    blocker.write_text("not a folder")  # the job's output folder cannot be made
    assert assemble_job(q, paths, job_id) == "failed"
    job = q.job(job_id)
    assert job["state"] == "failed" and "assembly failed: " in job["error"]
    assert f"tts-appliance retry {job_id}" in job["error"]
    assert q.retry_failed_assemblies() == [job_id] and q.job(job_id)["state"] == "running"  # a worker (re)starts
    assert any("trying it once more" in e["message"] for e in q.events(job_id))
    assert q.ready_jobs() == [job_id]
    assert assemble_job(q, paths, job_id) == "failed"  # the cause is still there
    assert q.retry_failed_assemblies() == []  # once only
    blocker.unlink()
    q.retry(job_id)  # the user's retry starts the count again
    assert assemble_job(q, paths, job_id) == "done"
    assert q.job(job_id)["assembly_attempts"] == 0


def test_an_assembly_cut_short_twice_fails_the_job_without_a_third_try(tmp_path):
    paths, q, job_id = _job(tmp_path, fmt="wav")
    _store(paths, q, q.claim("w", 100, 60))
    for _ in range(2):  # two attempts whose process died while writing the book (out of memory, killed)
        assert q.begin_assembly(job_id, "w", 60)
        q.assembly_attempt(job_id)
        with q.tx() as c:
            c.execute("UPDATE jobs SET assembly_worker = NULL WHERE id = ?", (job_id,))  # the dead worker's lease
    assert q.job(job_id)["state"] == "running"
    assert assemble_job(q, paths, job_id) == "failed"
    job = q.job(job_id)
    assert "tried 2 times without finishing" in job["error"] and f"tts-appliance retry {job_id}" in job["error"]
    assert not (paths.output / job_id / "chapters").exists()  # not tried a third time


def test_a_cover_image_that_is_gone_leaves_the_book_without_it(tmp_path, caplog):
    paths, q, job_id = _job(tmp_path, fmt="wav")
    _store(paths, q, q.claim("w", 100, 60))
    with q.tx() as c:
        c.execute("UPDATE jobs SET meta = ? WHERE id = ?",
                  (json.dumps({"cover_path": str(tmp_path / "gone.png"), "cover_mime": "image/png"}), job_id))
    assert assemble_job(q, paths, job_id) == "done"
    assert "cover image unreadable" in caplog.text
