"""What a synthesis of the queue worker ends in (a part of jobs.worker.Worker): its audio written and
recorded, a failed attempt, a job-level error. While the queue is away what finished is kept for `flush`;
while the disk has no room (jobs.disk) nothing is leased (`_room`) and what was synthesized waits in memory,
its leases renewed, until it can be written (`_flush_unwritten`): nothing is synthesized again.
"""
from __future__ import annotations

import logging
import os
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from engines.model.errors import EngineBusy

from jobs.assemble import SEGMENT_SUFFIX, write_segment_audio
from jobs.disk import SPACE, WRITE_MARGIN, no_space, segments_bytes
from jobs.guard import check_audio
from jobs.queue import QueueUnavailable

log = logging.getLogger("jobs.worker")

JOB_LEVEL_ERRORS = ("VoiceNotFound", "LanguageNotSupported", "UnsupportedMode")
WRITER_THREADS = min(4, os.cpu_count() or 1)  # segments whose audio is encoded and written at once (`_write_ahead`)


class Results:
    """Needs the worker's queue, engine, paths, guard, heartbeat, worker_id, min_free_bytes, `_pending`,
    `_unwritten` and `_writers` (None until `_write_ahead` needs its threads; `close_writers` lets them go)."""

    _writers: Optional[ThreadPoolExecutor] = None

    def close_writers(self) -> None:
        if self._writers is not None:
            self._writers.shutdown(wait=True)
            self._writers = None

    # -- recording -------------------------------------------------------------------------------
    def _record(self, write: Callable[[], Any], ids: list[int]) -> None:
        """Run `write()` (the queue writes that record an outcome of segments `ids`), then let their leases
        go. While the queue is away, keep it for `flush` instead: the audio is on disk already and the
        leases stay this worker's (the heartbeat renews them once the queue is back)."""
        try:
            write()
        except QueueUnavailable:
            self._pending.append((write, ids))
            return
        self.heartbeat.drop(ids)

    def flush(self) -> None:
        """Record what finished while the queue was away (QueueUnavailable while it still is)."""
        while self._pending:
            write, ids = self._pending[0]
            write()
            self._pending.pop(0)
            self.heartbeat.drop(ids)

    # -- room on the disk (jobs.disk) -----------------------------------------------------------
    def _room(self, n: int) -> bool:
        """Whether `n` more segments may be leased: what was synthesized and not yet written for want of room
        is written first, and the spool folder has room for `n` segments' audio plus `min_free_bytes`."""
        return self._flush_unwritten() and SPACE.need(self.paths.audio, segments_bytes(n), f"the next {n} segment(s)",
                                                      self.min_free_bytes)

    def _flush_unwritten(self) -> bool:
        """Write what waits for room, if it fits now; True when nothing waits any more."""
        if not self._unwritten:
            return True
        size = sum(segments_bytes(1, a.size / sr) for _, _, a, sr, _ in self._unwritten)
        what = f"the audio of {len(self._unwritten)} segment(s) already synthesized"
        if not SPACE.need(self.paths.audio, size + WRITE_MARGIN, what):
            return False
        waiting, self._unwritten = self._unwritten, []
        for item in waiting:
            self._store(*item)
        return not self._unwritten

    def _give_back_unwritten(self) -> None:
        """At the end, segments still without room to be written go back to the queue (synthesized again)."""
        if self._unwritten:
            ids = [r["id"] for _, rows, _, _, _ in self._unwritten for r in rows]
            log.warning("worker %s stops with %d synthesized segment(s) it had no room to write: they go back to "
                        "the queue", self.worker_id, len(ids))
            self._unwritten = []
            self._record(lambda: self.queue.release(self.worker_id, ids), ids)

    def _audio_path(self, key: str) -> Path:
        """A new file for audio of `key`: a name of its own per write (the module docstring)."""
        return self.paths.audio / key[:2] / f"{key}.{uuid.uuid4().hex[:8]}{SEGMENT_SUFFIX}"

    def _outcome(self, rows: list[dict], res) -> Optional[tuple[np.ndarray, int]]:
        """One synthesis' outcome for the rows that share its audio key: a failure (or audio the guard refuses)
        recorded for them (`_record`) -> None; a good one -> (audio, sample rate), for `_store`."""
        first, ids = rows[0], [r["id"] for r in rows]
        if isinstance(res, Exception):
            name = type(res).__name__
            if isinstance(res, EngineBusy):  # the engine stopped (or refused) before it worked on it: not an attempt
                log.info("segment(s) %s back to the queue: %s", ", ".join(str(i) for i in ids), res)
                self._record(lambda: self.queue.release(self.worker_id, ids), ids)
                return None
            if name in JOB_LEVEL_ERRORS:
                log.error("job %s failed: %s", first["job_id"], res)  # (journalctl -p err shows it)
                self._record(lambda: self.queue.fail_job(first["job_id"], str(res)), ids)
                return None
            self._record(lambda: self._fail(rows, f"{name}: {res}", f"{name}: {res}", retry=name != "BadInput"),
                         ids)
            return None
        audio = np.asarray(res.audio, dtype=np.float32).reshape(-1)
        sr = int(getattr(res, "sample_rate", None) or self.engine.sample_rate)
        reason = check_audio(audio, sr, first["text"], first["_job"].spec.language, self.guard)
        if reason:
            self._record(lambda: self._fail(rows, reason, f"(seed {first['_seed']}): {reason}", guard=True), ids)
            return None
        return audio, sr

    def _write_ahead(self, items: list[tuple]) -> list[Optional[tuple[Path, Future]]]:
        """Start writing the audio of several syntheses at once, [(key, rows, audio, sr, log id)] -> [(path,
        the write's Future)], each for `_store`: their FLAC encodings and fsyncs run on the writer threads (the
        encoder lets the GIL go), so one thread feeding an engine of hundreds of rows is not held up writing
        segment after segment (a book on two GPUs waited for it). One item: written by `_store` itself."""
        if len(items) < 2:
            return [None] * len(items)
        if self._writers is None:
            self._writers = ThreadPoolExecutor(WRITER_THREADS, thread_name_prefix="segment-writer")
        out = []
        for key, _, audio, sr, _ in items:
            path = self._audio_path(key)
            out.append((path, self._writers.submit(write_segment_audio, path, audio, sr)))
        return out

    def _store(self, key: str, rows: list[dict], audio: np.ndarray, sr: int, log_id: int,
               ahead: Optional[tuple[Path, Future]] = None) -> None:
        """Write a synthesis' audio (or wait for its write begun by `_write_ahead`) and record it for its rows
        (`_record`). No room on the disk: kept for `_flush_unwritten`, its leases held (nothing is synthesized
        again). Recorded for none of them (their job was cancelled or deleted meanwhile): the file goes again."""
        path, first = ahead[0] if ahead else self._audio_path(key), rows[0]
        try:
            ahead[1].result() if ahead else write_segment_audio(path, audio, sr)
        except OSError as exc:
            if not no_space(exc, path.parent):
                raise
            SPACE.full(self.paths.audio, segments_bytes(len(self._unwritten) + 1),
                       "the audio of segments already synthesized")
            self._unwritten.append((key, rows, audio, sr, log_id))
            return

        def complete():
            done_log = log_id  # the synthesis counts as finished with the first row it recorded
            for r in rows:
                if self.queue.complete(r["id"], key, str(path), sr, audio.size, first["_seed"], log_id=done_log):
                    done_log = None
            if done_log is not None:  # no row wanted it: nothing names the file
                path.unlink(missing_ok=True)

        self._record(complete, [r["id"] for r in rows])

    def _fail(self, rows: list[dict], error: str, note: str, retry: bool = True, guard: bool = False) -> None:
        """A failed attempt of each row, in the job log too (`note`: what the log says about it)."""
        for r in rows:
            state = self.queue.fail(r["id"], error, retry=retry, guard=guard)
            self.queue.event(r["job_id"], f"segment {r['idx']} {note} -> {state}", "warning", r["idx"])
