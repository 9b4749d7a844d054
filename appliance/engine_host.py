"""Loading the engine from the settings, and the daemon's engines with the scheduler in front of them.

`load_runner(cfg)` is the one way every command and the daemon load a model: an `EngineRunner`
(continuous batching) around the checkpoint of the settings. The daemon runs one runner per device of
model.device (`all`, or a list such as `cuda:0,cuda:1`; usually one) behind an
`appliance.engine_pool.EnginePool`, and all synthesis goes through it. Streaming requests (HTTP,
Wyoming) are submitted with `STREAM_PRIORITY` to the least-loaded engine; the jobs worker hands
segments to the pool at batch priority (`jobs.worker.Worker`, fed continuously), so batch segments
only fill capacity streams leave free and one book runs on every engine; it also claims nothing new
while streams wait on every engine (`streams_waiting`).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Optional

from engines.runtime.runner import EngineBusy, EngineConfig, EngineRunner  # noqa: F401 - EngineBusy re-exported

from appliance.config import Config
from appliance.engine_pool import BATCH_PRIORITY, STREAM_PRIORITY, EnginePool  # noqa: F401 - re-exported

log = logging.getLogger(__name__)

WARMUP_TEXT = "Warm-up."


def device_context(device: str):
    """Make `device` the current CUDA device for a block (model loading, graph capture); a no-op elsewhere."""
    import contextlib

    import torch

    return torch.cuda.device(torch.device(device)) if str(device).startswith("cuda") else contextlib.nullcontext()


def runtime_settings(cfg: Config, engine=None, max_slots: Optional[int] = None, device: Optional[str] = None) -> dict:
    """The values `auto` stands for on this machine: device, dtype and slot count (with how they were
    chosen). With a loaded `engine` the slot count comes from the memory left after its weights; without,
    from the checkpoint's shape and the weights still to load (for `info` and `--print-config`).
    `device`: one of the devices of model.device (default its first)."""
    from engines.device.detect import resolve_device
    from engines.model.checkpoint import resolve_dtype
    from engines.runtime import memory

    r = cfg.runtime
    device = str(engine.device) if engine is not None else (device or resolve_device(cfg.model.device))
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


def all_runtime_settings(cfg: Config) -> list[dict]:
    """`runtime_settings` for each engine the daemon would run (one per device of model.device)."""
    from engines.device.detect import resolve_devices

    return [runtime_settings(cfg, device=d) for d in resolve_devices(cfg.model.device)]


def load_runner(cfg: Config, *, max_slots: Optional[int] = None, max_queue: Optional[int] = None,
                device: Optional[str] = None) -> EngineRunner:
    """The checkpoint of the settings `cfg` behind an EngineRunner (its loop not started:
    `synthesize()` runs it in the calling thread, `start()` in a thread of its own).

    model.path on `device` (default model.device, its first device when it names several:
    engines.device.detect.resolve_device) in model.dtype (auto: bfloat16 on
    an accelerator, float32 on the CPU), saved voices from model.voices_dir (default HOME/voices),
    model.threads torch threads (as Config.torch_threads decides); `max_slots` requests decoded together
    (default runtime.max_slots; auto: what fits in the free memory, engines.runtime.memory),
    runtime.max_context cache positions each,
    `max_queue` streams waiting (default runtime.max_queue), codes decoded by the runtime.codec backend.
    The chosen values are logged and kept in `runner.settings`. ConfigError when no model is configured.
    """
    import torch

    from engines.api import TTSEngine
    from engines.device.detect import resolve_device

    m = cfg.model
    path = cfg.require_model()
    threads = cfg.torch_threads()
    torch.set_num_threads(threads)
    log.info("torch CPU threads: %d (model.threads %s)", threads, m.threads)
    device = device or resolve_device(m.device)
    t0 = time.monotonic()
    with device_context(device):
        engine = TTSEngine.load(path, device=device, dtype=m.dtype,
                                voices_dir=m.voices_dir or str(cfg.home().home / "voices"))
        log.info("loaded %s (%s) on %s in %s in %.1f s", path, engine.model_type, device, engine.dtype,
                 time.monotonic() - t0)
        chosen = runtime_settings(cfg, engine, max_slots)
        slots = chosen["max_slots"]
        log.info("runtime: %s, %s, %d slots of %d positions (%s)", chosen["device"], chosen["dtype"], slots,
                 chosen["max_context"], chosen["slots_reason"])
        runner = EngineRunner(engine, max_slots=slots, max_queue=max_queue or cfg.runtime.max_queue,
                              max_context=cfg.runtime.max_context,
                              prefill_batch=min(EngineConfig.prefill_batch, slots), codec_backend=cfg.runtime.codec,
                              prefill_graphs=cfg.runtime.prefill_graphs, codec_fast=cfg.runtime.codec_fast)
    runner.settings = chosen
    return runner


class EngineHost:
    """Loads one engine per device of model.device and serves them as one `EnginePool` (`pool`);
    `runner` and `engine` are the first (what every engine shares: voices, languages, sample rate)."""

    def __init__(self, cfg, metrics=None):
        self.cfg, self.metrics = cfg, metrics
        self.engine = None
        self.pool: Optional[EnginePool] = None
        self.progress = 0  # bumped on every chunk of audio seen (watchdog)

    @property
    def runner(self) -> Optional[EngineRunner]:
        return self.pool.runners[0] if self.pool else None

    @runner.setter
    def runner(self, runner: EngineRunner) -> None:  # one runner made elsewhere (benchmarks)
        self.pool = EnginePool([runner])
        self.engine = runner.engine

    @property
    def runners(self) -> list:
        return self.pool.runners if self.pool else []

    def load(self) -> None:
        """Load the model on every device, capture every device graph (no capture on the request path),
        start the loops. Devices are loaded one after the other: compiled regions made for the first are
        loaded from the cache by the next."""
        from engines.device.detect import resolve_devices

        devices = resolve_devices(self.cfg.model.device)
        runners = []
        for dev in devices:
            runner = load_runner(self.cfg, device=dev)
            with device_context(dev):
                runner.prepare()
            runner.start()
            runners.append(runner)
        self.pool = EnginePool(runners)
        self.engine = runners[0].engine
        if len(runners) > 1:
            log.info("%d engines: %s (%d slots in all)", len(runners),
                     ", ".join(f"{r.settings['device']} {r.cfg.max_slots} slots" for r in runners),
                     sum(r.cfg.max_slots for r in runners))

    @property
    def settings(self) -> list[dict]:
        """The chosen runtime values of each engine (device, dtype, slots and why)."""
        return [getattr(r, "settings", None) or {"device": str(r.device), "max_slots": r.cfg.max_slots}
                for r in self.runners]

    def warm_up(self) -> None:
        """One short synthesis per engine so the first real request does not pay for lazy initialisation."""
        req = self.request(WARMUP_TEXT, voice=self.default_voice(), language="auto", max_frames=4, seed=0)
        if req is None:
            log.info("warm-up skipped (a Base checkpoint without saved voices has nothing to say)")
            return
        for runner in self.runners:
            t0 = time.monotonic()
            for _ in runner.submit(req, priority=STREAM_PRIORITY):
                self.progress += 1
            log.info("warm-up on %s done in %.2f s", runner.device, time.monotonic() - t0)

    def default_voice(self) -> Optional[str]:
        voices = self.engine.voices
        want = self.cfg.wyoming.default_voice
        return want if want in voices else (voices[0] if voices else None)

    def request(self, text, voice=None, language="auto", instruct=None, ref_audio=None, ref_text=None,
                seed=None, max_frames=None, text_feed=None):
        """A SynthesisRequest with the daemon's frame cap (None when nothing can be said); `text_feed`: text
        still arriving (engines.runtime.text_feed)."""
        from engines.api import SamplingParams, SynthesisRequest

        if self.engine.model_type == "base" and not (voice or ref_audio):
            return None
        cap = self.cfg.model.max_frames
        frames = min(x for x in (cap, max_frames) if x) if (cap or max_frames) else None
        sampling = SamplingParams(seed=seed, max_new_tokens=frames + 1 if frames else None)
        return SynthesisRequest(text=text, voice=voice, language=language or "auto", instruct=instruct,
                                ref_audio=ref_audio, ref_text=ref_text, sampling=sampling, text_feed=text_feed)

    # -- streaming ---------------------------------------------------------------------------
    def submit_stream(self, request):
        """Admit a streaming request on the least-loaded engine (EngineBusy when every queue is full)."""
        return self.pool.submit(request, priority=STREAM_PRIORITY)

    def stream_finished(self, handle, error: Optional[str] = None, started: Optional[float] = None) -> None:
        self.pool.finished(handle)
        if self.metrics:
            self.metrics.observe_stream(handle, error, started)

    def streams_waiting(self) -> bool:
        """True when streams fill every slot or requests wait behind them, on every engine: the jobs
        worker then claims nothing new (batch segments only fill the capacity streams leave free)."""
        return all(self.pool.streams_waiting(i) for i in range(len(self.runners)))

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
        """The pool's figures (summed over engines, `engines` per engine) and `streams` being served."""
        if not self.pool:
            return {"streams": 0, "alive": True}
        s = self.pool.stats()
        s["streams"] = sum(self.pool.streams)
        return s

    def stop(self, timeout: float = 10.0) -> None:
        if self.pool:
            self.pool.stop(timeout)
