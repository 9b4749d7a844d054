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
from pathlib import Path

import torch

from engines.api import EngineSpec
from engines.device.threads import in_passing_thread

log = logging.getLogger(__name__)


def device_context(device: str):
    """Make `device` the current CUDA device for a block (model loading, graph capture); a no-op elsewhere."""
    return torch.cuda.device(torch.device(device)) if str(device).startswith("cuda") else contextlib.nullcontext()


RUNTIME_MODULES = ("engines.runtime.runner", "engines.process.child")  # what an engine (process) imports


def code_error() -> str | None:
    """Why the engine's code cannot run on this installation (one of its modules fails to import: a package
    missing or broken), or None. The daemon checks it before it starts and `info` reports it: without it a
    daemon would start and then lose every engine."""
    import importlib

    for name in RUNTIME_MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - whatever it is, no engine can run
            return f"the engine's code does not load ({name}: {type(exc).__name__}: {exc})"
    return None


def check_device(device: str) -> None:
    """DeviceNotFound (one line saying what to set) when `device` is not on this machine."""
    from engines.device.detect import device_missing
    from engines.model.errors import DeviceNotFound

    why = device_missing(device)
    if why:
        raise DeviceNotFound(f"device {device}: {why}; set model.device to auto or cpu (or pass --device cpu)")


def settings(spec: EngineSpec) -> dict:
    """What `spec`'s "auto"s become on this machine, before anything is loaded: device, dtype, context and
    the slot count with why (auto: what fits in the device's free memory next to the weights still to load,
    engines.runtime.memory). The one place these are decided: the loader runs with it, `info` shows it."""
    from engines.model.checkpoint import model_folder, resolve_dtype
    from engines.model.config import CodecConfig, ModelConfig
    from engines.runtime import memory

    dtype = resolve_dtype(spec.dtype, torch.device(spec.device))
    from engines.codec.dtype import codec_dtype_setting
    from engines.runtime.linears import linear_setting
    from engines.runtime.model_runner import kv_cache_choice

    linear, linear_reason = linear_setting(spec.linear, spec.device, dtype)
    codec_dtype, codec_dtype_reason = codec_dtype_setting(spec.codec_dtype, spec.device, dtype)
    try:  # auto decided where the runner decides it (model_runner.AUTO_FP8)
        kv = "fp8" if kv_cache_choice(spec.kv_cache, torch.device(spec.device)) else "model"
    except ValueError:  # a setting that cannot run: the runner stops with the reason when it starts
        kv = "fp8" if spec.kv_cache == "fp8" else "model"
    out = {"device": spec.device, "dtype": str(dtype).replace("torch.", ""), "max_context": spec.max_context,
           "kv_cache": kv, "linear": linear, "linear_reason": linear_reason,
           "codec_dtype": codec_dtype, "codec_dtype_reason": codec_dtype_reason}
    configured = str(spec.max_slots) != "auto"
    path = model_folder(spec.model)
    cpu = torch.device(spec.device).type == "cpu"
    plan = memory.plan_slots(ModelConfig.from_dir(path), CodecConfig.from_dir(path / "speech_tokenizer"), spec.device,
                             dtype, spec.max_context, still_to_load=memory.weights_bytes(path, dtype),
                             kv_cache=kv, cap=int(spec.max_slots) if configured else memory.MAX_AUTO_SLOTS)
    out["max_positions"] = plan.positions  # CPU: what admission may reserve at once (0: no limit)
    if configured and cpu:  # the admin's row count, held only by the positions admission reserves
        return out | {"max_slots": int(spec.max_slots), "slots_reason": "configured"}
    if not configured:
        return out | {"max_slots": plan.slots, "slots_reason": plan.describe()}
    if plan.slots < int(spec.max_slots):  # would run out of memory while the cache is allocated or graphs captured
        raise RuntimeError(
            f"runtime.max_slots: {spec.max_slots} slots of {spec.max_context} positions do not fit on {spec.device}: "
            f"{plan.free_bytes / 2**30:.1f} GiB free, {plan.per_slot_bytes / 2**20:.0f} MiB a slot, at most "
            f"{plan.slots} fit; lower runtime.max_slots or runtime.max_context, or set runtime.max_slots: auto")
    return out | {"max_slots": plan.slots, "slots_reason": "configured; " + plan.describe()}


def load_runner(spec: EngineSpec):
    """The checkpoint of `spec` behind an EngineRunner (its loop not started: `synthesize()` runs it in the
    calling thread, `start()` in a thread of its own). The chosen values are logged and kept in
    `runner.settings` (device, dtype, slots and why, context)."""
    check_device(spec.device)  # (before anything touches it)
    if spec.threads:
        torch.set_num_threads(spec.threads)
        log.info("torch CPU threads: %d", spec.threads)
    if str(spec.device).split(":")[0] == "cpu":  # the load's OpenMP threads end with it: in_passing_thread
        return in_passing_thread(_load, spec, name="engine-load")
    return _load(spec)


def _load(spec: EngineSpec):
    from engines.engine import TTSEngine
    from engines.runtime.runner import EngineConfig, EngineRunner

    t0 = time.monotonic()
    with device_context(spec.device):
        chosen = settings(spec)
        engine = TTSEngine.load(spec.model, device=spec.device, dtype=chosen["dtype"], voices_dir=spec.voices_dir)
        log.info("loaded %s (%s) on %s in %s in %.1f s", spec.model, engine.model_type, spec.device, engine.dtype,
                 time.monotonic() - t0)
        slots = chosen["max_slots"]
        log.info("runtime: %s, %s, %d slots of %d positions (%s)", chosen["device"], chosen["dtype"], slots,
                 spec.max_context, chosen["slots_reason"])
        runner = EngineRunner(engine, max_slots=slots, max_queue=spec.max_queue, max_context=spec.max_context,
                              prefill_batch=min(EngineConfig.prefill_batch, slots), codec_backend=spec.codec,
                              prefill_graphs=spec.prefill_graphs, codec_fast=spec.codec_fast,
                              codec_windows=spec.codec_windows,
                              attn_kernel=spec.attn_kernel, sample_kernel=spec.sample_kernel,
                              layer_kernel=spec.layer_kernel, kv_cache=spec.kv_cache, attn_split=spec.attn_split,
                              linear=chosen["linear"], codec_dtype=chosen["codec_dtype"],
                              engine_cache=spec.engine_cache, cpu_codec_threads=spec.codec_threads,
                              cpu_idle_threads=spec.idle_threads,
                              max_positions=chosen["max_positions"])
    runner.settings = chosen
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
        runner.warm_up(spec.warmup)
        log.info("warm-up on %s done in %.2f s", runner.device, time.monotonic() - t0)
