"""Loading one engine from its `EngineSpec`: the checkpoint on its device behind an `EngineRunner`.

    runner = load_runner(EngineSpec(model="path/to/checkpoint", device="cuda:0"))
    ready(runner, spec)        # capture every device graph, speak the warm-up request, start the loop

Every command and the daemon load through here, in this process (`say`, `work`) or in an engine process
of their own (`engines.process`), so a checkpoint a user downloaded loads through one path.
"""
from __future__ import annotations

import contextlib
import logging
import time

import torch

from engines.api import EngineSpec

log = logging.getLogger(__name__)


def device_context(device: str):
    """Make `device` the current CUDA device for a block (model loading, graph capture); a no-op elsewhere."""
    return torch.cuda.device(torch.device(device)) if str(device).startswith("cuda") else contextlib.nullcontext()


def slot_plan(spec: EngineSpec, engine) -> tuple[int, str]:
    """(slots, why): spec.max_slots when it is a number, else what fits next to the loaded engine."""
    if str(spec.max_slots) != "auto":
        return int(spec.max_slots), "configured"
    from engines.runtime import memory

    plan = memory.plan_for_engine(engine, spec.max_context)
    return plan.slots, plan.describe()


def load_runner(spec: EngineSpec):
    """The checkpoint of `spec` behind an EngineRunner (its loop not started: `synthesize()` runs it in the
    calling thread, `start()` in a thread of its own). The chosen values are logged and kept in
    `runner.settings` (device, dtype, slots and why, context)."""
    from engines.engine import TTSEngine
    from engines.runtime.runner import EngineConfig, EngineRunner

    if spec.threads:
        torch.set_num_threads(spec.threads)
    t0 = time.monotonic()
    with device_context(spec.device):
        engine = TTSEngine.load(spec.model, device=spec.device, dtype=spec.dtype, voices_dir=spec.voices_dir)
        log.info("loaded %s (%s) on %s in %s in %.1f s", spec.model, engine.model_type, spec.device, engine.dtype,
                 time.monotonic() - t0)
        slots, why = slot_plan(spec, engine)
        settings = {"device": str(engine.device), "dtype": str(engine.dtype).replace("torch.", ""),
                    "max_context": spec.max_context, "max_slots": slots, "slots_reason": why}
        log.info("runtime: %s, %s, %d slots of %d positions (%s)", settings["device"], settings["dtype"], slots,
                 spec.max_context, why)
        runner = EngineRunner(engine, max_slots=slots, max_queue=spec.max_queue, max_context=spec.max_context,
                              prefill_batch=min(EngineConfig.prefill_batch, slots), codec_backend=spec.codec,
                              prefill_graphs=spec.prefill_graphs, codec_fast=spec.codec_fast,
                              engine_cache=spec.engine_cache)
    runner.settings = settings
    return runner


def ready(runner, spec: EngineSpec) -> None:
    """Make a loaded runner ready to serve: capture its device graphs (spec.prepare), start its loop, speak
    spec.warmup once."""
    if spec.prepare:
        with device_context(spec.device):
            runner.prepare()
    runner.start()
    if spec.warmup is not None:
        t0 = time.monotonic()
        for _ in runner.submit(spec.warmup, priority=0):
            pass
        log.info("warm-up on %s done in %.2f s", runner.device, time.monotonic() - t0)
