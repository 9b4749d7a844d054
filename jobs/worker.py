"""The queue worker: claim segments, synthesize them in full batches, store audio, assemble books.

    worker = Worker(Queue(paths.db), engine, paths, batch_size=8)
    worker.run_forever(stop_event)        # or worker.run_once() in a loop of your own

The engine is anything with the `Synthesizer` shape (`engines.runtime.runner.EngineRunner`); what a
segment asks of it is worked out in jobs.requests, and the leases of the segments held are renewed by
jobs.heartbeat.
Audio is written durably to `audio/<key[:2]>/<key>.<random>.flac` (jobs.assemble.encode_segment: FLAC,
24-bit; a name of its own per write, so a removal of the same content's earlier file never meets it) and
recorded in the queue before a segment counts as done, so a worker killed at any moment loses only the
segments it had in flight. While the queue database is away, what finishes is kept (with its leases, which
the heartbeat renews) and recorded when it is back (`Worker.flush`), not synthesized again; likewise
while the disk has no room for it (jobs.disk: nothing new is leased then, and what was synthesized is
written once there is room). What a synthesis ends in is `jobs.worker_results`. A job whose segments
have all ended is finished on a thread of its own (jobs.assembler), so the worker goes on with other jobs
meanwhile. The segments of a job that is cancelled or deleted stop in the engine (jobs.inflight).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, Sequence

from jobs.assemble import JoinSettings
from jobs.disk import SPACE, no_space
from jobs.guard import GuardSettings
from jobs.heartbeat import Heartbeat
from jobs.inflight import InFlight
from jobs.queue import Queue, QueueUnavailable
from jobs.queue.outage import OUTAGE
from jobs.requests import JobContext, audio_key, job_context, segment_voice, synthesis_request
from jobs.settings import Paths
from jobs.worker_books import WorkerBooks
from jobs.worker_results import Results

log = logging.getLogger(__name__)

BACKOFF_MAX_S = 2.0  # longest wait between tries while the queue is away (resuming takes at most this)


class Synthesizer(Protocol):
    """What the worker needs from an engine (engines.runtime.runner.EngineRunner has this shape).

    An engine whose loop runs in a thread of its own (`running` true) and that has `submit(request,
    priority)` -> handle (`done`, `result()`, `on_done`) is fed continuously: the worker keeps up to
    `batch_size` segments in flight and tops up as each one finishes, so the engine never drains
    between batches. Otherwise the worker hands it whole batches through `synthesize(requests)`."""

    sample_rate: int
    voices: Sequence[str]
    languages: Sequence[str]
    model_id: str

    def synthesize(self, requests: list) -> list: ...


class Worker(Results):
    """Drains the queue with one engine. `should_yield()` returning True makes `run_once` claim
    nothing (hook for serving streaming requests first)."""

    def __init__(self, queue: Queue, engine: Synthesizer, paths: Paths, *, batch_size: int = 8,
                 lease_s: float = 120.0, heartbeat_s: float = 10.0, guard: GuardSettings = GuardSettings(),
                 join: JoinSettings = JoinSettings(), model: Optional[str] = None,
                 worker_id: Optional[str] = None, should_yield: Optional[Callable[[], bool]] = None,
                 min_free_bytes: int = 0):
        self.queue, self.engine, self.paths = queue, engine, paths.ensure()
        self.batch_size, self.lease_s, self.guard, self.join = int(batch_size), lease_s, guard, join
        self.model = model
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.should_yield = should_yield
        self.heartbeat = Heartbeat(queue.path, self.worker_id, lease_s, min(heartbeat_s, lease_s / 3))
        self.heartbeat.start()
        self._jobs: dict[str, JobContext] = {}  # job id -> what its segments share (resolved once per job)
        self._inflight = InFlight()  # the segments in the engine: pipelined mode
        self._pending: list[tuple[Callable[[], Any], list[int]]] = []  # (queue writes, segment ids): `_record`
        self._unwritten: list[tuple] = []  # (key, rows, audio, sample rate, log id) waiting for room: `_store`
        self.min_free_bytes = int(min_free_bytes)  # jobs.min_free_mb: kept free beyond what a batch needs
        self._wake = threading.Event()
        self.shelf = WorkerBooks(queue, self.paths, join, self.worker_id, lease_s, self.min_free_bytes)

    def close(self, wait: bool = True) -> None:
        """Stop: the books being finished are waited for (`wait` false: not here, the thread of this worker
        that died may be started again meanwhile), their assembly leases renewed until they are."""
        if wait:
            self.shelf.finish_assemblies()
            self.heartbeat.stop()
        else:
            self.shelf.finish_assemblies(then=self.heartbeat.stop)
        OUTAGE.forget(self.worker_id)
        self.close_writers()
        self.shelf.close()

    def job_ended(self, job_id: str) -> None:
        """Job `job_id` was cancelled or deleted (any thread): its segments in the engine stop now."""
        self._inflight.note_ended(job_id)
        self._wake.set()

    def release_held(self) -> int:
        """Return the segments this worker holds to the queue (shutdown past its deadline)."""
        held = sorted(self.heartbeat._held)
        if held:
            self.queue.release(self.worker_id, held)
        return len(held)

    # -- loop ------------------------------------------------------------------------------
    @property
    def pipelined(self) -> bool:
        return bool(getattr(self.engine, "running", False)) and hasattr(self.engine, "submit")

    def run_once(self, wait_s: float = 0.2) -> int:
        """Claim and process segments, then assemble finished jobs. Returns work done (0: idle).
        Pipelined (see Synthesizer): finish what ended, top up to `batch_size` in flight, and wait up to
        `wait_s` for a segment to end when nothing else happened. Else: one whole batch."""
        self.shelf.look()
        if self.pipelined:
            return self._run_pipelined(wait_s) + self.assemble_ready()
        self.flush()
        if (self.should_yield and self.should_yield()) or not self._room(self.batch_size):
            return 0
        rows = self.queue.claim(self.worker_id, self.batch_size, self.lease_s, model=self.model)
        if rows:
            self._start(rows, self._process)
        return len(rows) + self.assemble_ready()

    def run_forever(self, stop_event: threading.Event, idle_sleep_s: float = 1.0) -> None:
        """Work until `stop_event` is set, sleeping `idle_sleep_s` when there is nothing to do; then let the
        segments in flight finish (the caller gives their leases back if that takes too long). First, the
        jobs whose assembly failed before are tried once more (jobs.queue.assembly)."""
        backoff, ended = 0.0, False
        try:
            for job_id in self.queue.retry_failed_assemblies():
                log.warning("job %s: its assembly failed before; trying it once more", job_id)
        except QueueUnavailable as exc:  # one warning per process for the outage (jobs.queue.outage)
            OUTAGE.failed(self.worker_id, exc)
            log.info("worker %s: failed assemblies are not tried again this time (the queue is away)", self.worker_id)
        try:
            while not stop_event.is_set():
                try:
                    worked = self.run_once()
                except QueueUnavailable as exc:  # the database went away: wait, then resume
                    self._away(exc)  # one warning per process, not one per retry
                    backoff = min(BACKOFF_MAX_S, max(0.25, backoff * 2))
                    log.debug("worker %s: %s; retrying in %.2f s", self.worker_id, exc, backoff)
                    stop_event.wait(backoff)
                    continue
                OUTAGE.ok(self.worker_id)
                backoff = 0.0
                if worked == 0 and not self._inflight:
                    stop_event.wait(idle_sleep_s)
            while self._inflight:  # not for a cancelled job's segments: they stop now
                self._wake.wait(0.2)
                self._wake.clear()
                self._reap()
                self._stop_ended()
            self._give_back_unwritten()
            self.flush()
            ended = True
        except QueueUnavailable as exc:
            ended = True
            log.warning("worker %s stops while the queue is away (%s): %d finished segment(s) not recorded are "
                        "synthesized again once their leases expire", self.worker_id, exc,
                        sum(len(ids) for _, ids in self._pending))
        finally:
            self.close(wait=ended)  # died of an error: its thread is started again at once

    def _start(self, rows: list[dict], work: Callable[[list[dict]], Any]) -> None:
        """Hold the leases of claimed `rows` and `work` on them (`_process` or `_launch`; their leases go as
        each outcome is recorded); while the queue is away before synthesis begins, again in `flush`."""
        ids = [r["id"] for r in rows]
        self.heartbeat.hold(ids)
        try:
            self._record(lambda: work(rows), [])
        except Exception:  # not done: the leases run out, another attempt follows
            self.heartbeat.drop(ids)
            raise

    def _away(self, exc: QueueUnavailable) -> None:
        """The queue cannot be used: said once, as the disk when it is full (SQLite's file), else as an outage."""
        if no_space(exc):
            SPACE.full(self.paths.db if isinstance(self.paths.db, Path) else self.paths.home, 0, "the queue database")
        else:
            OUTAGE.failed(self.worker_id, exc)

    # -- pipelined feeding -----------------------------------------------------------------------
    def _stop_ended(self) -> None:
        """The segments in flight of jobs that ended meanwhile stop in the engine (jobs.inflight)."""
        dropped = self._inflight.stop_ended(self.queue)
        if dropped:
            self.heartbeat.drop(dropped)

    def _run_pipelined(self, wait_s: float) -> int:
        # First what ended: its audio starts being written at once (and is kept even while the queue is away);
        # the engine is topped up while the writer threads work, then what ended is recorded in order. (Topped
        # up only after the writes, an engine whose rows ended together stood idle through a whole batch of them.)
        begun = self._begin_all(self._ended())
        claimed = 0
        try:
            self._stop_ended()
            self.flush()
            claimed = self._top_up()
        finally:
            worked = self._end_all(begun)
        worked += claimed
        if not worked and self._inflight:
            self._wake.wait(wait_s)
            self._wake.clear()
            worked += self._reap()
        return worked

    def _top_up(self) -> int:
        """Claim and launch segments up to `batch_size` in flight (none while streams want the engine, or
        without room on the disk); returns how many."""
        room = self.batch_size - self._inflight.rows()
        if room <= 0 or (self.should_yield and self.should_yield()) or not self._room(room):
            return 0
        rows = self.queue.claim(self.worker_id, room, self.lease_s, model=self.model)
        if rows:
            self._start(rows, self._launch)
        return len(rows)

    def _launch(self, rows: list[dict]) -> None:
        """Submit claimed segments to the engine (cache hits complete at once, same keys share a synthesis)."""
        groups = self._group(rows)
        if not groups:
            return
        keys = list(groups)
        firsts = [groups[k][0] for k in keys]
        log_ids = self.queue.synth_started(self.worker_id, [(k, r["id"]) for k, r in zip(keys, firsts)])
        for key, first, log_id in zip(keys, firsts, log_ids):
            handle = self.engine.submit(synthesis_request(first), 1)
            self._inflight.add(handle, key, groups[key], log_id)
            handle.on_done = lambda h: self._wake.set()
            if handle.done:
                self._wake.set()

    def _ended(self) -> list[tuple]:
        """The syntheses that ended, taken from those in flight: [(key, rows, result or error, log id)]."""
        ended = []
        for handle, key, rows, log_id in self._inflight.ended():
            try:
                res = handle.result()
            except Exception as exc:  # noqa: BLE001 - the segment's own error, recorded on it
                res = exc
            ended.append((key, rows, res, log_id))
        return ended

    def _reap(self) -> int:
        """Store the results of the segments that ended (recorded, or kept while the queue is away: `_record`);
        returns how many segment rows that was."""
        return self._end_all(self._begin_all(self._ended()))

    def _begin_all(self, ended: list[tuple]) -> tuple:
        """The outcomes of several syntheses [(key, rows, result, log id)]: failures recorded now, the good ones'
        audio written at once on the writer threads (`_write_ahead`) -> what `_end_all` finishes."""
        jobs, good, rows_n = set(), [], 0
        for key, rows, res, log_id in ended:
            try:
                out = self._outcome(rows, res)
            except Exception:  # the queue refused the record: the leases expire, another attempt follows
                self.heartbeat.drop([r["id"] for r in rows])
                raise
            if out is not None:
                good.append((key, rows, *out, log_id))
            jobs.update(r["job_id"] for r in rows)
            rows_n += len(rows)
        return jobs, good, self._write_ahead(good), rows_n

    def _end_all(self, begun: tuple, advance: bool = True) -> int:
        """Wait for the writes `_begin_all` started and record them in order; the books of their jobs move on
        (`advance`: their chapters written as they complete). Returns how many segment rows ended."""
        jobs, good, ahead, rows_n = begun
        try:
            for item, w in zip(good, ahead):
                try:
                    self._store(*item, ahead=w)
                except Exception:  # e.g. the audio cannot be written: the leases expire, another attempt follows
                    self.heartbeat.drop([r["id"] for r in item[1]])
                    raise
        finally:  # (after a failure too: no write may still run when the caller goes on)
            for w in ahead:
                if w is not None:
                    w[1].exception()
        if advance:
            self.shelf.advance(jobs)
        return rows_n

    # -- segments --------------------------------------------------------------------------
    def _job(self, row: dict) -> JobContext:
        """The job of a claimed segment, resolved once per job (jobs.requests.job_context; the voice cloned
        when the engine can clone: `clone_voice`)."""
        ctx = self._jobs.get(row["job_id"])
        if ctx is None:
            ctx = job_context(row, getattr(self.engine, "clone_voice", None))
            if len(self._jobs) >= 64:
                self._jobs.pop(next(iter(self._jobs)))
            self._jobs[row["job_id"]] = ctx
        return ctx

    def _group(self, rows: list[dict]) -> dict[str, list[dict]]:
        """Rows by audio key, after completing cache hits and failing jobs that cannot be synthesized."""
        groups: dict[str, list[dict]] = {}
        for row in rows:
            ctx = row["_job"] = self._job(row)
            if ctx.error is not None:
                self.queue.fail_job(row["job_id"], f"the reference audio cannot be used: {ctx.error}")
                self.heartbeat.drop([row["id"]])
                continue
            row["_voice"] = segment_voice(row)  # read once: the request takes it from here
            key = audio_key(row, self.engine.model_id)
            if self.queue.complete_cached(row["id"], key) is not None:  # the same audio made before
                self.heartbeat.drop([row["id"]])
            else:
                groups.setdefault(key, []).append(row)
        return groups

    def _process(self, rows: list[dict]) -> None:
        groups = self._group(rows)
        if not groups:
            return
        keys = list(groups)
        firsts = [groups[k][0] for k in keys]
        log_ids = self.queue.synth_started(self.worker_id, [(k, r["id"]) for k, r in zip(keys, firsts)])
        results = self._synthesize([synthesis_request(r) for r in firsts])
        self._end_all(self._begin_all([(key, groups[key], res, log_id)
                                       for key, log_id, res in zip(keys, log_ids, results)]), advance=False)

    def _synthesize(self, requests: list) -> list:
        """One batched call; if it raises, each request alone so one bad segment fails alone."""
        try:
            return list(self.engine.synthesize(requests))
        except Exception as exc:
            if len(requests) == 1:
                return [exc]
            log.warning("batch of %d failed (%s); retrying one by one", len(requests), exc)
        out = []
        for req in requests:
            try:
                out.append(self.engine.synthesize([req])[0])
            except Exception as exc:
                out.append(exc)
        return out

    # -- books -------------------------------------------------------------------------------
    def books(self) -> dict:
        """The books this worker writes while their jobs run, and those being finished: {job id:
        JobBook.progress()} (/health)."""
        return self.shelf.progress()

    def assemble_ready(self) -> int:
        """Start finishing the jobs whose segments have all ended (on threads of their own, while this one
        goes on: jobs.worker_books); returns how many were started."""
        return self.shelf.assemble_ready()
