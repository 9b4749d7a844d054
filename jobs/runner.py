"""The batch worker: claim segments, synthesize them in full batches, store audio, assemble books.

    runner = Runner(Queue(paths.db), engine, paths, batch_size=8)
    runner.run_forever(stop_event)        # or runner.run_once() in a loop of your own

The engine is anything with the `Synthesizer` shape (`engines.api.TTSEngine` in production).
Audio is written durably to `audio/<key[:2]>/<key>.wav` and recorded in SQLite before a segment
counts as done, so a worker killed at any moment loses only the segments it had in flight.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence

import numpy as np

from .assemble import AssemblyError, BookMeta, JoinSettings, assemble_book, read_audio, write_segment_audio
from .manifest import build_manifest, write_manifest
from .queue import Queue
from .settings import JobSpec, Paths, segment_key

log = logging.getLogger(__name__)


class Synthesizer(Protocol):
    """What the runner needs from an engine (engines.api.TTSEngine has this shape)."""

    sample_rate: int
    voices: Sequence[str]
    languages: Sequence[str]
    model_id: str

    def synthesize(self, requests: list) -> list: ...


@dataclass
class GuardSettings:
    """Runaway/silence guard: audio length must be within [min_ratio, max_ratio] x the estimate
    (characters / chars-per-second; CJK characters count separately) and RMS above `silence_rms`."""

    enabled: bool = True
    min_ratio: float = 0.3
    max_ratio: float = 3.0
    chars_per_s: float = 15.0
    cjk_chars_per_s: float = 5.0
    per_language: dict = field(default_factory=dict)  # e.g. {"german": 13.0}: overrides chars_per_s
    min_expected_s: float = 1.0
    silence_rms: float = 0.003


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return 0x3040 <= o <= 0x30FF or 0x3400 <= o <= 0x9FFF or 0xAC00 <= o <= 0xD7AF or 0xF900 <= o <= 0xFAFF


def expected_seconds(text: str, language: str, guard: GuardSettings) -> float:
    """Rough spoken duration of `text`."""
    cjk = sum(1 for ch in text if _is_cjk(ch))
    other = sum(1 for ch in text if not ch.isspace()) - cjk
    cps = guard.per_language.get((language or "").lower(), guard.chars_per_s)
    return max(guard.min_expected_s, cjk / guard.cjk_chars_per_s + other / cps)


def check_audio(audio: np.ndarray, sample_rate: int, text: str, language: str, guard: GuardSettings) -> Optional[str]:
    """None when the audio is plausible for the text, else the reason it is not."""
    if not guard.enabled:
        return None
    dur = audio.size / float(sample_rate)
    est = expected_seconds(text, language, guard)
    if dur < guard.min_ratio * est or dur > guard.max_ratio * est:
        return f"runaway/truncated audio: {dur:.1f} s for text expected ~{est:.1f} s"
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64)))) if audio.size else 0.0
    if rms < guard.silence_rms:
        return f"silent audio (RMS {rms:.4f} < {guard.silence_rms})"
    return None


def attempt_seed(seed: int, guard_failures: int) -> int:
    """The seed of the next try: the segment's seed, then a different one after each guard failure."""
    return seed if guard_failures == 0 else (seed + 1_000_003 * guard_failures) % (2**31 - 1)


class Heartbeat(threading.Thread):
    """Renews this worker's leases every `interval_s` on its own connection."""

    def __init__(self, db_path: Path, worker_id: str, lease_s: float, interval_s: float):
        super().__init__(name=f"heartbeat-{worker_id}", daemon=True)
        self.db_path, self.worker_id, self.lease_s, self.interval_s = db_path, worker_id, lease_s, interval_s
        self._held: set[int] = set()
        self._lock = threading.Lock()
        self._halt = threading.Event()

    def hold(self, ids) -> None:
        with self._lock:
            self._held.update(ids)

    def drop(self, ids) -> None:
        with self._lock:
            self._held.difference_update(ids)

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        q = Queue(self.db_path)
        try:
            while not self._halt.wait(self.interval_s):
                with self._lock:
                    ids = sorted(self._held)
                try:
                    q.renew(self.worker_id, ids, self.lease_s)
                except Exception:  # a busy database must not kill the heartbeat
                    log.exception("heartbeat: renewing leases failed; will retry")
        finally:
            q.close()


JOB_LEVEL_ERRORS = ("VoiceNotFound", "LanguageNotSupported", "UnsupportedMode")


class Runner:
    """Drains the queue with one engine. `should_yield()` returning True makes `run_once` claim
    nothing (hook for serving streaming requests first)."""

    def __init__(self, queue: Queue, engine: Synthesizer, paths: Paths, *, batch_size: int = 8,
                 lease_s: float = 120.0, heartbeat_s: float = 10.0, guard: GuardSettings = GuardSettings(),
                 join: JoinSettings = JoinSettings(), model: Optional[str] = None,
                 worker_id: Optional[str] = None, should_yield: Optional[Callable[[], bool]] = None):
        self.queue, self.engine, self.paths = queue, engine, paths.ensure()
        self.batch_size, self.lease_s, self.guard, self.join = int(batch_size), lease_s, guard, join
        self.model = model
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.should_yield = should_yield
        self.heartbeat = Heartbeat(queue.path, self.worker_id, lease_s, min(heartbeat_s, lease_s / 3))
        self.heartbeat.start()

    def close(self) -> None:
        self.heartbeat.stop()

    def release_held(self) -> int:
        """Return the segments this worker holds to the queue (shutdown past its deadline)."""
        held = sorted(self.heartbeat._held)
        if held:
            self.queue.release(self.worker_id, held)
        return len(held)

    # -- loop ------------------------------------------------------------------------------
    def run_once(self) -> int:
        """Claim and process one batch, then assemble finished jobs. Returns work done (0: idle)."""
        if self.should_yield and self.should_yield():
            return 0
        rows = self.queue.claim(self.worker_id, self.batch_size, self.lease_s, model=self.model)
        if rows:
            ids = [r["id"] for r in rows]
            self.heartbeat.hold(ids)
            try:
                self._process(rows)
            finally:
                self.heartbeat.drop(ids)
        return len(rows) + self.assemble_ready()

    def run_forever(self, stop_event: threading.Event, idle_sleep_s: float = 1.0) -> None:
        """Work until `stop_event` is set, sleeping `idle_sleep_s` when there is nothing to do."""
        try:
            while not stop_event.is_set():
                if self.run_once() == 0:
                    stop_event.wait(idle_sleep_s)
        finally:
            self.close()

    # -- segments --------------------------------------------------------------------------
    def _audio_path(self, key: str) -> Path:
        return self.paths.audio / key[:2] / f"{key}.wav"

    def _process(self, rows: list[dict]) -> None:
        groups: dict[str, list[dict]] = {}
        for row in rows:
            row["_spec"] = JobSpec.from_dict(json.loads(row["spec"]))
            key = segment_key(row["text"], row["_spec"], row["seed"], self.engine.model_id)
            hit = self.queue.cached(key)
            if hit:
                self.queue.complete(row["id"], key, hit["path"], hit["sample_rate"], hit["samples"], hit["seed_used"])
            else:
                groups.setdefault(key, []).append(row)
        if not groups:
            return
        keys = list(groups)
        firsts = [groups[k][0] for k in keys]
        log_ids = self.queue.synth_started(self.worker_id, [(k, r["id"]) for k, r in zip(keys, firsts)])
        results = self._synthesize([self._request(r) for r in firsts])
        for key, log_id, res in zip(keys, log_ids, results):
            self._finish(key, groups[key], res, log_id)

    def _request(self, row: dict):
        from engines.api import SamplingParams, SynthesisRequest

        spec: JobSpec = row["_spec"]
        row["_seed"] = attempt_seed(row["seed"], row["guard_failures"])
        sampling = SamplingParams(**{**spec.sampling, "seed": row["_seed"]})
        return SynthesisRequest(text=row["text"], voice=spec.voice, language=spec.language, instruct=spec.instruct,
                                ref_audio=spec.ref_audio, ref_text=spec.ref_text, sampling=sampling)

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

    def _finish(self, key: str, rows: list[dict], res, log_id: int) -> None:
        first = rows[0]
        if isinstance(res, Exception):
            name = type(res).__name__
            if name in JOB_LEVEL_ERRORS:
                self.queue.fail_job(first["job_id"], str(res))
                return
            retry = name != "BadInput"
            for r in rows:
                state = self.queue.fail(r["id"], f"{name}: {res}", retry=retry)
                self.queue.event(r["job_id"], f"segment {r['idx']} {name}: {res} -> {state}", "warning", r["idx"])
            return
        audio = np.asarray(res.audio, dtype=np.float32).reshape(-1)
        sr = int(getattr(res, "sample_rate", None) or self.engine.sample_rate)
        reason = check_audio(audio, sr, first["text"], first["_spec"].language, self.guard)
        if reason:
            for r in rows:
                state = self.queue.fail(r["id"], reason, retry=True, guard=True)
                self.queue.event(r["job_id"], f"segment {r['idx']} (seed {first['_seed']}): {reason} -> {state}",
                                 "warning", r["idx"])
            return
        path = self._audio_path(key)
        write_segment_audio(path, audio, sr)
        for r in rows:
            self.queue.complete(r["id"], key, str(path), sr, audio.size, first["_seed"])
        self.queue.synth_finished([log_id])

    # -- assembly --------------------------------------------------------------------------
    def assemble_ready(self) -> int:
        """Assemble every job whose segments are all finished; returns how many were handled."""
        n = 0
        for job_id in self.queue.ready_jobs():
            if self.queue.begin_assembly(job_id, self.worker_id, self.lease_s):
                assemble_job(self.queue, self.paths, job_id, self.join)
                n += 1
        return n


def assemble_job(queue: Queue, paths: Paths, job_id: str, join: JoinSettings = JoinSettings()) -> str:
    """Write a job's chapter/book files and manifest, then set its final state; returns the state."""
    job, chapters, segs = queue.job(job_id), queue.chapters(job_id), queue.segments(job_id)
    spec = JobSpec.from_dict(json.loads(job["spec"]))
    meta_raw = json.loads(job["meta"] or "{}")
    cover = Path(meta_raw["cover_path"]).read_bytes() if meta_raw.get("cover_path") else None
    meta = BookMeta(title=job["title"], author=job["author"], cover=cover, cover_mime=meta_raw.get("cover_mime"))
    out_dir = paths.output / job_id
    by_ch: dict[int, list] = {c["idx"]: [] for c in chapters}
    sample_rate = None
    for s in segs:
        audio = None
        if s["state"] == "done":
            audio, sample_rate = read_audio(s["audio_path"])
        by_ch[s["chapter_idx"]].append((audio, s["pause_after_ms"]))
    n_failed = sum(1 for s in segs if s["state"] != "done")
    outputs, book, codec, error = None, None, None, None
    try:
        if sample_rate is None:
            raise AssemblyError("every segment failed; nothing to assemble (see `tts-appliance logs JOB`)")
        book, outputs, codec = assemble_book(out_dir, [(c["title"], by_ch[c["idx"]]) for c in chapters],
                                             sample_rate, spec.format, meta, join)
        state = "partial" if n_failed else "done"
        if n_failed:
            error = f"{n_failed} of {len(segs)} segments failed; `tts-appliance retry {job_id}` requeues them"
    except AssemblyError as exc:
        state, error = "failed", str(exc)
    job["state"] = state
    job["error"] = error
    manifest = build_manifest(job, chapters, queue.segments(job_id), outputs, book, codec, sample_rate)
    write_manifest(out_dir / "manifest.json", manifest)
    queue.finish_job(job_id, state, str(out_dir), error)
    log.info("job %s %s%s", job_id, state, f": {error}" if error else "")
    return state


# -- submission ------------------------------------------------------------------------------------
TEXT_SUFFIXES = {"", ".txt", ".text", ".md", ".markdown", ".html", ".htm", ".xhtml", ".rst"}


class SubmitError(Exception):
    """A file cannot become a job (message says why and what to do)."""


def precheck_file(path: Path) -> None:
    """Reject what can never be a book before ingestion: missing, empty, binary-looking text files."""
    if not path.is_file():
        raise SubmitError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise SubmitError(f"{path.name}: the file is empty; nothing to read aloud")
    if path.suffix.lower() in TEXT_SUFFIXES:
        head = path.read_bytes()[:8192]
        if b"\x00" in head and not head.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise SubmitError(f"{path.name}: this looks like a binary file, not text; "
                              "save it as plain text (UTF-8), EPUB, HTML or another supported format")


def check_voice(engine: Synthesizer, voice: Optional[str]) -> None:
    """Raise the engine's VoiceNotFound when `voice` is neither a known voice nor a voice file."""
    voices = list(getattr(engine, "voices", None) or [])
    if voice and voices and voice not in voices and not Path(voice).is_file():
        from engines.model.errors import VoiceNotFound

        raise VoiceNotFound(voice, voices)


def document_chapters(doc, spec: JobSpec) -> list[tuple[str, list]]:
    """Segment a Document into [(chapter title, [SegmentText, ...]), ...] (empty chapters dropped)."""
    from jobs.segment import SegmentOptions, segment_document

    language = spec.language if spec.language and spec.language != "auto" else (doc.language or "auto")
    per_chapter = segment_document(doc, language, SegmentOptions(), None)
    return [(ch.title or f"Chapter {i + 1}", segs)
            for i, (ch, segs) in enumerate(zip(doc.chapters, per_chapter)) if segs]


def submit_document(queue: Queue, paths: Paths, doc, spec: JobSpec, sources: Sequence[str] = (),
                    chapters: Optional[list] = None) -> str:
    """Queue a Document (already segmented `chapters` may be given). Returns the job id."""
    import hashlib

    spec = JobSpec.from_dict({**json.loads(spec.to_json()),
                              "title": spec.title or doc.title or (Path(sources[0]).stem if sources else None),
                              "author": spec.author or doc.author})
    meta = {"source_format": doc.source_format, "language_hint": doc.language}
    if doc.cover:
        ext = ".png" if (doc.cover_mime or "").endswith("png") else ".jpg"
        cover = paths.home / "covers" / (hashlib.sha256(doc.cover).hexdigest()[:16] + ext)
        if not cover.exists():
            from .assemble import write_bytes_atomic

            write_bytes_atomic(cover, doc.cover)
        meta.update(cover_path=str(cover), cover_mime=doc.cover_mime)
    return queue.add_job(spec, chapters if chapters is not None else document_chapters(doc, spec), sources, meta)


def submit_file(queue: Queue, paths: Paths, path: str | Path, spec: JobSpec) -> tuple[str, Optional[str]]:
    """Ingest and queue one file. Bad input becomes a failed job: returns (job id, error or None).

    The user's file is only read, never moved or deleted.
    """
    from .errors import JobError
    from .queue import QueueError

    path = Path(path)
    try:
        precheck_file(path)
        from jobs.ingest import IngestOptions, load_document

        doc = load_document(path, IngestOptions())
        return submit_document(queue, paths, doc, spec, [str(path.resolve())]), None
    except (SubmitError, JobError, QueueError) as exc:
        error = str(exc)
    except (ImportError, ModuleNotFoundError) as exc:
        raise SubmitError(f"document ingestion is not available ({exc}); the jobs.ingest module is missing")
    except Exception as exc:  # unexpected reader failure: still a clear job error, other jobs carry on
        log.exception("ingesting %s failed", path)
        error = f"could not read {path.name}: {type(exc).__name__}: {exc}"
    return queue.add_failed_job(spec, [str(path.resolve())], error), error
