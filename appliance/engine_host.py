"""Loading the engine from the settings, and the daemon's engine with the scheduler in front of it.

`load_runner(cfg)` is the one way every command and the daemon load a model: an `EngineRunner`
(continuous batching) around the checkpoint of the settings. In the daemon all synthesis goes
through one runner. Streaming requests (HTTP, Wyoming) are submitted with `STREAM_PRIORITY`; the
jobs worker hands segments to the same runner at batch priority (`jobs.worker.Worker`, fed
continuously), so batch segments only fill capacity streams leave free; it also claims nothing new
while streams are waiting (`streams_waiting`).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Optional

import numpy as np

from engines.runtime.runner import EngineBusy, EngineConfig, EngineRunner

from appliance.config import Config

log = logging.getLogger(__name__)

STREAM_PRIORITY = 0  # the runner serves lower values first
BATCH_PRIORITY = 1
WARMUP_TEXT = "Warm-up."


def runtime_settings(cfg: Config, engine=None, max_slots: Optional[int] = None) -> dict:
    """The values `auto` stands for on this machine: device, dtype and slot count (with how they were
    chosen). With a loaded `engine` the slot count comes from the memory left after its weights; without,
    from the checkpoint's shape and the weights still to load (for `info` and `--print-config`)."""
    from engines.device.detect import resolve_device
    from engines.model.checkpoint import resolve_dtype
    from engines.runtime import memory

    r = cfg.runtime
    device = str(engine.device) if engine is not None else resolve_device(cfg.model.device)
    dtype = engine.dtype if engine is not None else resolve_dtype(cfg.model.dtype, device)
    out = {"device": device, "dtype": str(dtype).replace("torch.", ""), "max_context": r.max_context}
    if max_slots or str(r.max_slots) != "auto":
        out.update(max_slots=int(max_slots or r.max_slots), slots_reason="configured")
        return out
    if engine is not None:
        plan = memory.plan_for_engine(engine, r.max_context)
    else:
        from engines.model.config import CodecConfig, ModelConfig

        path = Path(cfg.require_model())
        plan = memory.plan_slots(ModelConfig.from_dir(path), CodecConfig.from_dir(path / "speech_tokenizer"), device,
                                 dtype, r.max_context, still_to_load=memory.weights_bytes(path, dtype))
    out.update(max_slots=plan.slots, slots_reason=plan.describe())
    return out


def load_runner(cfg: Config, *, max_slots: Optional[int] = None, max_queue: Optional[int] = None) -> EngineRunner:
    """The checkpoint of the settings `cfg` behind an EngineRunner (its loop not started:
    `synthesize()` runs it in the calling thread, `start()` in a thread of its own).

    model.path on model.device (engines.device.detect.resolve_device) in model.dtype (auto: bfloat16 on
    an accelerator, float32 on the CPU), saved voices from model.voices_dir (default HOME/voices),
    model.threads torch threads; `max_slots` requests decoded together (default runtime.max_slots; auto:
    what fits in the free memory, engines.runtime.memory), runtime.max_context cache positions each,
    `max_queue` streams waiting (default runtime.max_queue), codes decoded by the runtime.codec backend.
    The chosen values are logged and kept in `runner.settings`. ConfigError when no model is configured.
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
    log.info("loaded %s (%s) on %s in %s in %.1f s", path, engine.model_type, device, engine.dtype,
             time.monotonic() - t0)
    chosen = runtime_settings(cfg, engine, max_slots)
    slots = chosen["max_slots"]
    log.info("runtime: %s, %s, %d slots of %d positions (%s)", chosen["device"], chosen["dtype"], slots,
             chosen["max_context"], chosen["slots_reason"])
    runner = EngineRunner(engine, max_slots=slots, max_queue=max_queue or cfg.runtime.max_queue,
                          max_context=cfg.runtime.max_context, prefill_batch=min(EngineConfig.prefill_batch, slots),
                          codec_backend=cfg.runtime.codec)
    runner.settings = chosen
    return runner


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
        """Load the model, capture every device graph (no capture on the request path), start the loop."""
        self.runner = load_runner(self.cfg)
        self.engine = self.runner.engine
        self.runner.prepare()
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
        if self._streams >= self.runner.cfg.max_slots:
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
