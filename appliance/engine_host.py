"""Loading the engine from the settings, and the daemon's engine with the scheduler in front of it.

`load_runner(cfg)` is the one way every command and the daemon load a model: an `EngineRunner`
(continuous batching) around the checkpoint of the settings. In the daemon all synthesis goes
through one runner. Streaming requests (HTTP, Wyoming) are submitted with `STREAM_PRIORITY`; the
batch queue worker reaches the runner through `BatchSynthesizer`, which has the `synthesize(list)`
shape `jobs.worker.Worker` expects and submits at `BATCH_PRIORITY`, so batch segments only fill
capacity streams leave free. The jobs worker also yields (claims nothing) while streams are waiting
(`streams_waiting`).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Optional

import numpy as np

from engines.runtime.runner import EngineBusy, EngineConfig, EngineRunner

from appliance.config import Config

log = logging.getLogger(__name__)

STREAM_PRIORITY = 0  # the runner serves lower values first
BATCH_PRIORITY = 1
WARMUP_TEXT = "Warm-up."


def load_runner(cfg: Config, *, max_slots: Optional[int] = None, max_queue: Optional[int] = None) -> EngineRunner:
    """The checkpoint of the settings `cfg` behind an EngineRunner (its loop not started:
    `synthesize()` runs it in the calling thread, `start()` in a thread of its own).

    model.path on model.device (engines.device.detect.resolve_device) in model.dtype, saved voices
    from model.voices_dir (default HOME/voices), model.threads torch threads; `max_slots` requests
    decoded together (default runtime.max_slots), `max_queue` waiting (default runtime.max_queue),
    codes decoded by the runtime.codec backend. ConfigError when no model is configured.
    """
    import torch

    from engines.api import TTSEngine
    from engines.device.detect import resolve_device

    m = cfg.model
    path = cfg.require_model()
    if m.threads:
        torch.set_num_threads(m.threads)
    device = resolve_device(m.device)
    t0 = time.monotonic()
    engine = TTSEngine.load(path, device=device, dtype=m.dtype,
                            voices_dir=m.voices_dir or str(cfg.home().home / "voices"))
    log.info("loaded %s (%s) on %s in %.1f s", path, engine.model_type, device, time.monotonic() - t0)
    slots = max_slots or cfg.runtime.max_slots
    return EngineRunner(engine, max_slots=slots, max_queue=max_queue or cfg.runtime.max_queue,
                        prefill_batch=min(EngineConfig.prefill_batch, slots), codec_backend=cfg.runtime.codec)


class EngineHost:
    """Loads the engine for the configured accelerator and owns the runner."""

    def __init__(self, cfg, metrics=None):
        self.cfg, self.metrics = cfg, metrics
        self.engine = None
        self.runner = None
        self._streams = 0
        self._lock = threading.Lock()
        self.progress = 0  # bumped on every chunk of audio seen (watchdog)

    def load(self) -> None:
        self.runner = load_runner(self.cfg)
        self.engine = self.runner.engine
        self.runner.start()

    def warm_up(self) -> None:
        """One short synthesis so the first real request does not pay for lazy initialisation."""
        req = self.request(WARMUP_TEXT, voice=self.default_voice(), language="auto", max_frames=4, seed=0)
        if req is None:
            log.info("warm-up skipped (a Base checkpoint without saved voices has nothing to say)")
            return
        t0 = time.monotonic()
        for _ in self.runner.submit(req, priority=STREAM_PRIORITY):
            self.progress += 1
        log.info("warm-up done in %.2f s", time.monotonic() - t0)

    def default_voice(self) -> Optional[str]:
        voices = self.engine.voices
        want = self.cfg.wyoming.default_voice
        return want if want in voices else (voices[0] if voices else None)

    def request(self, text, voice=None, language="auto", instruct=None, ref_audio=None, ref_text=None,
                seed=None, max_frames=None):
        """A SynthesisRequest with the daemon's frame cap (None when nothing can be said)."""
        from engines.api import SamplingParams, SynthesisRequest

        if self.engine.model_type == "base" and not (voice or ref_audio):
            return None
        cap = self.cfg.model.max_frames
        frames = min(x for x in (cap, max_frames) if x) if (cap or max_frames) else None
        sampling = SamplingParams(seed=seed, max_new_tokens=frames + 1 if frames else None)
        return SynthesisRequest(text=text, voice=voice, language=language or "auto", instruct=instruct,
                                ref_audio=ref_audio, ref_text=ref_text, sampling=sampling)

    # -- streaming ---------------------------------------------------------------------------
    def submit_stream(self, request):
        """Admit a streaming request (raises EngineBusy when the queue is full)."""
        h = self.runner.submit(request, priority=STREAM_PRIORITY)
        with self._lock:
            self._streams += 1
        return h

    def stream_finished(self, handle, error: Optional[str] = None, started: Optional[float] = None) -> None:
        with self._lock:
            self._streams -= 1
        if self.metrics:
            self.metrics.observe_stream(handle, error, started)

    def streams_waiting(self) -> bool:
        """True when streams fill every slot or requests wait for one: the jobs worker then claims
        nothing new (batch segments only fill the capacity streams leave free)."""
        if self._streams >= self.cfg.runtime.max_slots:
            return True
        return self._streams > 0 and bool(self.runner.stats().get("queued"))

    async def aiter_chunks(self, handle):
        """Iterate a handle's chunks from asyncio (a pump thread does the blocking iteration)."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()

        def pump():
            try:
                for chunk in handle:
                    self.progress += 1
                    loop.call_soon_threadsafe(q.put_nowait, ("chunk", chunk))
                loop.call_soon_threadsafe(q.put_nowait, ("end", None))
            except BaseException as exc:  # the request's error, raised in the consumer
                loop.call_soon_threadsafe(q.put_nowait, ("error", exc))

        threading.Thread(target=pump, name="stream-pump", daemon=True).start()
        while True:
            kind, item = await q.get()
            if kind == "chunk":
                yield item
            elif kind == "error":
                raise item
            else:
                return

    def stats(self) -> dict:
        s = dict(self.runner.stats()) if self.runner else {}
        s["streams"] = self._streams
        thread = getattr(self.runner, "_thread", None)  # the runner loop (watchdog: no pings once it died)
        s.setdefault("alive", thread is None or thread.is_alive())
        return s

    def stop(self, timeout: float = 10.0) -> None:
        if self.runner:
            self.runner.stop(timeout)


class BatchSynthesizer:
    """`synthesize(list)` for `jobs.worker.Worker`, executed by the shared runner at batch priority."""

    def __init__(self, host: EngineHost, busy_wait_s: float = 0.2):
        self.host, self.busy_wait_s = host, busy_wait_s
        e = host.engine
        self.sample_rate, self.model_id = e.sample_rate, e.model_id
        self._inflight: list = []

    @property
    def voices(self):
        return self.host.engine.voices

    @property
    def languages(self):
        return self.host.engine.languages

    def synthesize(self, requests: list) -> list:
        from engines.api import SynthesisResult

        handles = []
        for req in requests:
            while True:
                try:
                    handles.append(self.host.runner.submit(req, priority=BATCH_PRIORITY))
                    break
                except EngineBusy:  # streams come first: wait for room
                    time.sleep(self.busy_wait_s)
        self._inflight = handles
        results, first_error = [], None
        for h in handles:
            try:
                chunks = list(h)
                self.host.progress += len(chunks)
                audio = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
                results.append(SynthesisResult(audio=audio, sample_rate=h.sample_rate,
                                               codes=np.zeros((0, 16), np.int64), finished_by_eos=True))
            except Exception as exc:
                first_error = first_error or exc
        self._inflight = []
        if first_error is not None:  # the jobs runner then retries one by one
            raise first_error
        return results
