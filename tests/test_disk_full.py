"""A full disk (jobs.disk) as the worker and the assembler meet it, with the failure injected where the real
write fails (a segment's atomic write, the book encoder's "System error."), the free space reported by a
stand-in for statvfs: the job waits (not failed, not done again), one error line names the folder and the
space needed, the disk state is degraded, and the work goes on by itself once there is room.
tests/test_disk_live.py does the same on a real small tmpfs."""
from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
import soundfile as sf

from test_queue import ToneEngine, _chapters

import jobs.disk
from jobs.disk import SPACE, disk_state, no_space
from jobs.queue import Queue
from jobs.settings import JobSpec, resolve_home
from jobs.worker import Worker


@pytest.fixture(autouse=True)
def forget_waits():
    SPACE.clear()
    yield
    SPACE.clear()


class Disk:
    """The spool folder's disk as the code sees it: `full` makes writes under `home` fail with ENOSPC (at
    the write itself) and, with `reports_full`, statvfs says 4 KB free."""

    def __init__(self, monkeypatch, home: Path):
        self.home, self.full, self.reports_full = home, False, False
        real_write, real_free = Path.write_bytes, jobs.disk.free_bytes

        def write_bytes(path, data):
            if self.full and home in Path(path).parents:
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            return real_write(path, data)

        monkeypatch.setattr(Path, "write_bytes", write_bytes)
        monkeypatch.setattr(jobs.disk, "free_bytes", lambda folder: 4096 if self.reports_full else real_free(folder))

    def fill(self):
        self.full = self.reports_full = True

    def free(self):
        self.full = self.reports_full = False


def _errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_full_disk_makes_the_job_wait_with_one_error_line_and_nothing_is_synthesized_again(tmp_path, monkeypatch,
                                                                                             caplog):
    caplog.set_level(logging.INFO)
    paths = resolve_home(tmp_path / "home").ensure()
    disk = Disk(monkeypatch, paths.home)
    q = Queue(paths.db)
    job = q.add_job(JobSpec(format="wav"), _chapters(2, 3))
    engine = ToneEngine()
    worker = Worker(q, engine, paths, batch_size=2, heartbeat_s=0.2)
    worker.run_once()
    assert q.counts(job)["done"] == 2
    disk.full = True  # the disk fills after the check for room passed: the next writes fail
    worker.run_once()
    assert len(worker._unwritten) == 2 and q.counts(job)["leased"] == 2  # synthesized, kept, leases held
    disk.reports_full = True
    for _ in range(5):  # nothing more is leased while there is no room
        assert worker.run_once() == 0
    assert len(engine.calls) == 4 and q.counts(job) == {**q.counts(job), "done": 2, "leased": 2, "queued": 2}
    assert q.job(job)["state"] == "running" and q.counts(job)["failed"] == 0
    errors = _errors(caplog)
    assert len(errors) == 1, errors
    assert str(paths.audio) in errors[0] and "needs about" in errors[0] and "MB" in errors[0]
    state = disk_state(paths.home, 0)
    assert state["ok"] is False and "disk full" in state["error"] and str(paths.audio) in state["error"]

    disk.free()
    while worker.run_once():
        pass
    worker.shelf.assembler.wait(60)
    worker.close()
    assert q.job(job)["state"] == "done" and q.counts(job)["done"] == 6
    texts = [t for t, _ in engine.calls]
    assert len(texts) == len(set(texts)) == 6  # every segment synthesized once
    assert len(_errors(caplog)) == 1 and any("room again" in r.getMessage() for r in caplog.records)
    assert disk_state(paths.home, 0)["ok"] is True
    q.close()


def test_a_book_that_finds_the_disk_full_waits_without_using_an_attempt(tmp_path, monkeypatch, caplog):
    """libsndfile reports a full disk as "System error.": with the folder out of room it is taken for one, the
    job stays running (no `failed` with a retry to type), its assembly attempt is not counted, and the book is
    written once there is room."""
    caplog.set_level(logging.INFO)
    paths = resolve_home(tmp_path / "home").ensure()
    disk = Disk(monkeypatch, paths.home)
    from audio.encode import SoundFileEncoder

    real, book_full = SoundFileEncoder.write, [True]

    def write(enc, audio):
        if book_full[0]:  # the disk fills while the book is written (after the check for room passed)
            disk.reports_full = True
            raise sf.LibsndfileError(2, "Error writing: ")
        return real(enc, audio)

    monkeypatch.setattr(SoundFileEncoder, "write", write)
    q = Queue(paths.db)
    job = q.add_job(JobSpec(format="flac", title="Book"), _chapters(1, 2))
    worker = Worker(q, ToneEngine(), paths, batch_size=4, heartbeat_s=0.2)
    worker.run_once()  # the segments are written and the book begun
    worker.shelf.assembler.wait(60)
    assert disk.reports_full
    row = q.job(job)
    assert row["state"] == "running" and row["assembly_attempts"] == 0 and row["assembly_worker"] is None, row
    for _ in range(3):
        worker.run_once()  # no room: the book is not begun again
        assert not worker.shelf.assembler.running()
    errors = _errors(caplog)
    assert len(errors) == 1 and "the book of job" in errors[0] and str(paths.output) in errors[0], errors
    disk.free()
    book_full[0] = False
    worker.run_once()
    worker.shelf.assembler.wait(60)
    worker.close()
    assert q.job(job)["state"] == "done" and (paths.output / job / "Book.flac").is_file()
    assert len(_errors(caplog)) == 1
    q.close()


def test_what_counts_as_a_full_disk(tmp_path):
    assert no_space(OSError(errno.ENOSPC, "No space left on device"))
    assert no_space(RuntimeError("ffmpeg failed writing b.m4b: Error writing trailer: No space left on device"))
    assert no_space(Exception("database or disk is full"))
    assert not no_space(OSError(errno.EACCES, "Permission denied"))
    assert not no_space(RuntimeError("System error."), tmp_path)  # this folder has room: another error
