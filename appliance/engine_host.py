"""The engines of the settings, with the scheduler in front of them.

`EngineHost` starts the engines of the settings' `EngineSpec`s (appliance.settings.engine_spec, one per
device) for the daemon and the job commands (appliance.compose builds it); `load_runner(cfg)` loads one
engine in this process for `say`. All of them load through engines.load. The host runs one runner per
device of model.device (`all`, or a list such as `cuda:0,cuda:1`; usually one) behind an `appliance.engine_pool.EnginePool`, and all synthesis
goes through it. Streaming requests (HTTP, Wyoming) are submitted with `STREAM_PRIORITY` to the
least-loaded engine; the jobs worker hands segments to the pool at batch priority (`jobs.worker.Worker`,
fed continuously), so batch segments only fill capacity streams leave free and one book runs on every
engine; it also claims nothing new while streams wait on every engine (`streams_waiting`).
"""
from __future__ import annotations

import logging
from typing import Optional

from engines.runtime.runner import EngineBusy, EngineRunner  # noqa: F401 - EngineBusy re-exported

from appliance.config import Config
from appliance.engine_pool import BATCH_PRIORITY, STREAM_PRIORITY, EnginePool  # noqa: F401 - re-exported
from appliance.settings import devices, engine_spec

log = logging.getLogger(__name__)

WARMUP_TEXT = "Warm-up."


def load_runner(cfg: Config, *, max_slots: Optional[int] = None, max_queue: Optional[int] = None,
                device: Optional[str] = None) -> EngineRunner:
    """The checkpoint of the settings `cfg` behind an EngineRunner in this process (its loop not started:
    `synthesize()` runs it in the calling thread, `start()` in a thread of its own): `engine_spec` on
    `device` (default model.device, its first device when it names several), loaded by
    engines.load.load_runner (the chosen values logged and kept in `runner.settings`). ConfigError when no
    model is configured. `say` loads this way; the daemon and the job commands through `EngineHost`."""
    from engines.load import load_runner as load

    return load(engine_spec(cfg, device or devices(cfg.model.device)[0], max_slots=max_slots, max_queue=max_queue))


class EngineHost:
    """The engines of the settings (appliance.settings.Settings): one per device, each in a process of its own
    (runtime.engine_process, engines.process) or in this one, served as one `EnginePool` (`pool`);
    `engine` is the checkpoint's `Catalog` (voices, languages, sample rate: what every engine shares)."""

    def __init__(self, settings, metrics=None):
        self.settings, self.metrics = settings, metrics  # appliance.settings.Settings
        self.cfg = settings.config
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

    def load(self, in_process: bool = False) -> None:
        """Start an engine on every device of the settings (load, capture every device graph: no capture on
        the request path; speak the warm-up request with model.warmup), all at once with engine processes
        (runtime.engine_process), one after the other in this process (compiled regions made for the first
        are loaded from the cache by the next). `in_process`: in this process and without the warm-up (the
        job commands: the command is the process that works). A device whose engine cannot start ends the
        start with a one-line error (EngineStartError)."""
        from dataclasses import replace

        from engines import load as loader
        from engines.catalog import Catalog

        s, cfg = self.settings, self.cfg
        self.engine = s.catalog or Catalog.from_dir(s.require_model(), s.voices_dir)  # (raises what is wrong)
        warm = cfg.model.warmup and not in_process
        warmup = self.request(WARMUP_TEXT, voice=self.default_voice(), max_frames=4, seed=0) if warm else None
        if warm and warmup is None:
            log.info("warm-up skipped (a Base checkpoint without saved voices has nothing to say)")
        specs = [replace(spec, warmup=warmup) for spec in s.engines]
        if cfg.runtime.engine_process and not in_process:
            engines = self._start_processes(specs)
        else:
            engines = []
            for spec in specs:
                runner = loader.load_runner(spec)
                loader.ready(runner, spec)
                engines.append(runner)
        self.pool = EnginePool(engines, self.engine)
        if len(engines) > 1:
            log.info("%d engines: %s (%d slots in all)", len(engines),
                     ", ".join(f"{r.settings['device']} {r.max_slots} slots" for r in engines),
                     sum(r.max_slots for r in engines))

    def _start_processes(self, specs: list) -> list:
        from functools import partial

        from appliance.logs import setup_logging
        from engines.process.proxy import EngineProcess

        engines = [EngineProcess(spec, init=partial(setup_logging, self.cfg.service.log_level), restart=False)
                   for spec in specs]
        try:
            for e in engines:
                e.start()
            for e in engines:
                e.wait_ready()
        except BaseException:
            for e in engines:
                e.stop(5.0)
            raise
        return engines

    def default_voice(self) -> Optional[str]:
        voices = self.engine.voices
        want = self.cfg.wyoming.default_voice
        return want if want in voices else (voices[0] if voices else None)

    def request(self, text, voice=None, language="auto", instruct=None, ref_audio=None, ref_text=None,
                seed=None, max_frames=None, text_feed=None, non_streaming_text=None):
        """A SynthesisRequest with the daemon's frame cap (None when nothing can be said); `text_feed`: text
        still arriving (engines.runtime.text_feed); `non_streaming_text`: the prompt's text mode (None: the
        model's default for the voice, SynthesisRequest)."""
        from engines.api import SamplingParams, SynthesisRequest

        if self.engine.model_type == "base" and not (voice or ref_audio):
            return None
        cap = self.cfg.model.max_frames
        frames = min(x for x in (cap, max_frames) if x) if (cap or max_frames) else None
        sampling = SamplingParams(seed=seed, max_new_tokens=frames + 1 if frames else None)
        return SynthesisRequest(text=text, voice=voice, language=language or "auto", instruct=instruct,
                                ref_audio=ref_audio, ref_text=ref_text, sampling=sampling, text_feed=text_feed,
                                non_streaming_text=non_streaming_text)

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
        """Iterate a handle's chunks from asyncio (the watchdog counts them as progress)."""
        async for chunk in handle.chunks():
            self.progress += 1
            yield chunk

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
