"""Assembly of a job: chapter and book files, manifest, final state.

A job's book is written while its synthesis goes on: a `JobBook` takes each chapter as soon as all of
its segments have ended (chapters in order) and writes its file and its part of the book file on a
background thread, so that when the last segment is stored only the last chapter is left to write.
`assemble_job` finishes a job with the `JobBook` that followed it, or from scratch (after a restart,
a retry, or in another process): both give the same files. An assembly that fails (a folder that cannot
be written, out of memory) fails its job with the reason; one that finds no room on the disk raises
`jobs.disk.DiskFull` and leaves the job running (its book is assembled again once there is room: jobs.assembler);
one cut short (the process died) is tried again at the next start, and a job gets `ASSEMBLY_TRIES`
attempts in all (`jobs.queue.assembly`).
"""
from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import soundfile as sf

from audio.speed import stretch
from jobs.assemble import AssemblyError, BookMeta, BookWriter, Chapter, JoinSettings, read_audio
from jobs.disk import SPACE, DiskFull, no_space
from jobs.manifest import build_manifest, write_manifest
from jobs.queue import Queue
from jobs.queue.assembly import ASSEMBLY_TRIES
from jobs.settings import JobSpec, Paths, audio_format
from jobs.subtitles import write_job_subtitles

log = logging.getLogger(__name__)
PENDING = ("queued", "leased")  # segment states that have not ended


class JobBook:
    """One job's chapter files and book file, written chapter by chapter in the order chapters complete.

    `advance(segments)` (cheap) hands every newly complete chapter to background threads: chapters are
    joined and their files written in parallel, then added to the book file in order by one thread;
    `finish(segments)` waits for them and closes the book. A segment whose state or audio changed
    after its chapter was written (a retry, a redo) makes `finish` start over from the stored audio.
    A chapter that cannot be written stops the book (`error`): nothing is added after it, and
    `finish` raises that error."""

    def __init__(self, job: dict, chapters: list[dict], out_dir: Path, join: JoinSettings = JoinSettings()):
        self.job_id, self.chapters, self.out_dir, self.settings = job["id"], chapters, out_dir, join
        self.spec = JobSpec.from_dict(json.loads(job["spec"]))
        meta_raw = json.loads(job["meta"] or "{}")
        self.meta = BookMeta(title=job["title"], author=job["author"], cover=_cover(meta_raw.get("cover_path")),
                             cover_mime=meta_raw.get("cover_mime"))
        self.next = 0  # chapters handed to the writer so far
        self.used: dict[int, tuple] = {}  # segment id -> (state, audio path) its chapter was written with
        self.sample_rate: Optional[int] = None
        self.writer: Optional[BookWriter] = None
        self._chapters = ThreadPoolExecutor(min(4, os.cpu_count() or 1), thread_name_prefix="book-chapter")
        self._book = ThreadPoolExecutor(1, thread_name_prefix="book-file")  # one thread: chapters stay in order
        self._last: Optional[Future] = None
        self.error: Optional[Exception] = None  # the first chapter that could not be written or added

    @classmethod
    def of(cls, queue: Queue, paths: Paths, job_id: str, join: JoinSettings = JoinSettings()) -> "JobBook":
        return cls(queue.job(job_id), queue.chapters(job_id), paths.output / job_id, join)

    def advance(self, segments: list[dict]) -> int:
        """Hand the chapters whose segments have all ended to the writer; returns how many. `segments`: the
        job's rows (all of them, e.g. at the end); `follow` does the same reading only what it needs."""
        by_ch: dict[int, list[dict]] = {}
        for s in segments:
            by_ch.setdefault(s["chapter_idx"], []).append(s)
        pending = {c: sum(r["state"] in PENDING for r in rows) for c, rows in by_ch.items()}
        return self._advance(pending, lambda idx: by_ch.get(idx, []), lambda: next(
            (s for s in segments if s["state"] == "done"), None))

    def follow(self, queue: Queue) -> int:
        """`advance` as a book in work is followed: the queue is asked which chapters still have segments in
        work (only those rows are read) and for the rows of the chapters handed over, never for every row
        of the book (a long book would make each look O(segments), the whole book O(segments^2))."""
        return self._advance(queue.pending_chapters(self.job_id),
                             lambda idx: queue.segments(self.job_id, chapter_idx=idx),
                             lambda: next(iter(queue.segments(self.job_id, state="done", limit=1)), None))

    def _advance(self, pending: dict, rows_of, any_done) -> int:
        if self.error is not None:
            return 0
        if self.sample_rate is None:
            done = any_done()
            if done is None:
                return 0  # no audio yet: the sample rate is not known
            try:
                self.sample_rate = sf.info(done["audio_path"]).samplerate
            except Exception as exc:  # noqa: BLE001 - its audio file is unreadable: finish() says so
                self.error = exc
                return 0
            self.writer = BookWriter(self.out_dir, self.sample_rate, audio_format(self.spec.format), self.meta,
                                     self.settings)
        n = 0
        while self.next < len(self.chapters):
            ch = self.chapters[self.next]
            if pending.get(ch["idx"]):
                break
            rows = rows_of(ch["idx"])
            for r in rows:
                self.used[r["id"]] = (r["state"], r["audio_path"])
            self.next += 1
            done = self._chapters.submit(self._write_chapter, self.next, ch["title"], rows)
            self._last = self._book.submit(self._add, done)
            n += 1
        return n

    def _write_chapter(self, number: int, title: str, rows: list[dict]) -> Chapter:
        """Chapter thread: its file, from its segments read one at a time (each stretched on its own to the
        job's speed: memory holds one segment, whatever the chapter's length)."""
        pieces = ((stretch(read_audio(r["audio_path"])[0], self.sample_rate, self.spec.speed)
                   if r["state"] == "done" else None, r["pause_after_ms"]) for r in rows)
        return self.writer.chapter(number, title, pieces)

    def _add(self, written: Future) -> None:
        """Book thread: add a written chapter to the book file, in order; after a failure, nothing more."""
        try:
            chapter = written.result()
            if self.error is None:
                self.writer.append(chapter)
            elif chapter.spool is not None:
                chapter.spool.close()
        except Exception as exc:  # noqa: BLE001 - kept for finish(), which raises it
            if self.error is None:
                self.error = exc
                if no_space(exc, self.out_dir):  # said once for the disk; the book is begun again once there is room
                    SPACE.full(self.out_dir, 0, f"the book of job {self.job_id}")
                else:
                    log.warning("job %s: its book stopped at chapter %d (%s: %s); nothing more is added to it",
                                self.job_id, len(self.writer.outs) + 1, type(exc).__name__, exc)

    def progress(self) -> dict:
        """{"chapters": "written/total"}, and "error" when the book stopped (/health)."""
        out = {"chapters": f"{len(self.writer.outs) if self.writer else 0}/{len(self.chapters)}"}
        if self.error is not None:
            out["error"] = f"{type(self.error).__name__}: {self.error}"
        return out

    def current(self, segments: list[dict]) -> bool:
        """Whether every chapter was handed over with the segments as they are now."""
        return self.next == len(self.chapters) and all(
            self.used.get(s["id"]) == (s["state"], s["audio_path"]) for s in segments)

    def finish(self, segments: list[dict]):
        """Wait for the chapters in hand and close the book -> (book path, chapter outputs, codec, sample rate).
        Raises AssemblyError when there is nothing to assemble."""
        self.advance(segments)
        try:
            if self._last is not None:
                self._last.result()  # the book thread adds chapters in order: the last ends them all
            if self.error is not None:
                raise self.error
            if self.writer is None:
                raise AssemblyError("every segment failed; nothing to assemble (see `tts-appliance logs JOB`)")
            if not self.current(segments):
                raise AssemblyError("some segments have not ended yet; the job is assembled when they have")
            return (*self.writer.finish(), self.sample_rate)
        except BaseException:
            self.abort()
            raise
        finally:
            self._shutdown(wait=False)

    def _shutdown(self, wait: bool) -> None:
        self._chapters.shutdown(wait=wait)
        self._book.shutdown(wait=wait)

    def abort(self) -> None:
        """Stop following the job (its partial book file is removed)."""
        self._shutdown(wait=True)
        if self.writer is not None:
            self.writer.abort()


def assemble_job(queue: Queue, paths: Paths, job_id: str, join: JoinSettings = JoinSettings(),
                 book: Optional[JobBook] = None) -> str:
    """Write a job's chapter/book files and manifest, then set its final state; returns the state.
    `book`: the JobBook that followed the job's synthesis (used when it is current, else started over).
    Counts as one of the job's ASSEMBLY_TRIES attempts; past them the job fails without trying."""
    tries = queue.assembly_attempt(job_id)
    job, chapters, segs = queue.job(job_id), queue.chapters(job_id), queue.segments(job_id)
    n_failed = sum(1 for s in segs if s["state"] != "done")
    outputs, book_path, codec, sample_rate, error, subtitles, epub = None, None, None, None, None, None, None
    try:
        if tries > ASSEMBLY_TRIES:
            if book is not None:
                book.abort()
            raise AssemblyError(f"its assembly was tried {tries - 1} times without finishing (the process "
                                "stopped while writing the book: out of memory? see the daemon's log, "
                                f"`journalctl -u tts-appliance`); `tts-appliance retry {job_id}` tries again")
        if book is None or not _usable(book, segs):
            if book is not None:
                book.abort()
            book = JobBook(job, chapters, paths.output / job_id, join)
        book_path, outputs, codec, sample_rate = book.finish(segs)
        subtitles = write_job_subtitles(outputs, _texts(chapters, segs), book_path)
        if JobSpec.from_dict(json.loads(job["spec"])).format == "epub":
            from jobs.narrated.writer import write_narrated_epub

            epub = write_narrated_epub(job, chapters, segs, outputs, paths.output / job_id)
        state = "partial" if n_failed else "done"
        if n_failed:
            error = f"{n_failed} of {len(segs)} segments failed; `tts-appliance retry {job_id}` requeues them"
    except Exception as exc:  # noqa: BLE001 - a write that failed (folder, disk, memory): the job says why
        _disk_full(exc, paths, job_id)
        if isinstance(exc, AssemblyError):
            state, error = "failed", str(exc)
        else:
            log.warning("job %s: assembly failed", job_id, exc_info=True)
            state, error = "failed", (f"assembly failed: {type(exc).__name__}: {exc}; fix the cause (output folder "
                                      f"{paths.output}, memory), then `tts-appliance retry {job_id}` "
                                      "(a restart of the daemon also tries once more)")
    job["state"], job["error"], job["finished_at"] = state, error, time.time()
    manifest = build_manifest(job, chapters, queue.segments(job_id), outputs, book_path, codec, sample_rate,
                              subtitles, epub)
    try:
        write_manifest(paths.output / job_id / "manifest.json", manifest)
    except OSError as exc:
        _disk_full(exc, paths, job_id)
        if state != "failed":
            state, error = "failed", f"cannot write the manifest: {exc}; `tts-appliance retry {job_id}` after fixing it"
        log.warning("job %s: cannot write its manifest: %s", job_id, exc)
    queue.finish_job(job_id, state, str(paths.output / job_id), error, at=job["finished_at"])
    if state != "failed":
        queue.assembly_finished(job_id)
    # a job that did not give its user the whole book is the admin's to see: `journalctl -p err` shows it
    log.log(logging.INFO if state == "done" else logging.ERROR, "job %s %s%s", job_id, state, f": {error}" if error else "")
    return state


def _disk_full(exc: BaseException, paths: Paths, job_id: str) -> None:
    """Raise DiskFull when `exc` is a full disk: the job is not failed for it, it waits (jobs.assembler)."""
    folder = paths.output / job_id
    if no_space(exc, folder):
        raise DiskFull(folder, 0, f"the book of job {job_id}", exc) from exc


def _texts(chapters: list[dict], segs: list[dict]) -> list[list[str]]:
    """Each chapter's segment texts as the document had them (the subtitles' cue texts), in segment order."""
    by_ch: dict[int, list[str]] = {}
    for s in segs:
        by_ch.setdefault(s["chapter_idx"], []).append(s["original"] or s["text"])
    return [by_ch.get(ch["idx"], []) for ch in chapters]


def _cover(path: Optional[str]) -> Optional[bytes]:
    """The book's cover image, or None (and a warning) when its file is gone."""
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        log.warning("cover image unreadable (%s): the book is written without it", exc)
        return None


def _usable(book: JobBook, segs: list[dict]) -> bool:
    """A followed book is kept when what it wrote so far still matches the segments and none failed."""
    return book.error is None and all(
        book.used.get(s["id"], (s["state"], s["audio_path"])) == (s["state"], s["audio_path"]) for s in segs)
