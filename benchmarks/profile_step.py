"""Where a decode step's time goes: CUDA kernels of one eager step and of one codec call, by total time.

    python -m benchmarks.profile_step --dummy 0.6b --batch 1 64
    python -m benchmarks.profile_step --dummy 0.6b --batch 256 --context 450 --kv-cache fp8

`--context N`: the rows are moved to positions [N, N + 50) first (benchmarks.ab_step.advance), so the attention
reads a book's context; `--kv-cache`: the talker's key/value cache (runtime.kv_cache). The step's kernel time is
also split by part (talker layers and their attention, predictor layers, draws, inputs) and set beside the
captured step's replay time (`ab_step.time_steps`): the difference is time between kernels.
"""
from __future__ import annotations

import argparse
import gc
from contextlib import contextmanager

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from benchmarks.ab_step import advance, time_steps
from benchmarks.bench import request
from benchmarks.dummy_engine import dummy_engine
from engines.runtime.runner import EngineRunner


# the decode step's regions (engines.runtime.decode_step.FastStep) -> the part of a frame each one is
PARTS = {"r_code0": "talker head + code-0 draw", "r_first": "predictor input", "p_layer": "predictor layers",
         "r_sub": "predictor heads + draws", "r_embed": "predictor embeddings", "r_pred": "predictor passes (fused)",
         "r_next": "talker input", "t_layer": "talker layers", "r_tail": "talker input + layers (fused)",
         "r_final": "talker norm + state"}


@contextmanager
def labelled(fast):
    """Each region of `fast` called inside a profiler range named after its part (the instance's attributes
    are wrapped, the class is untouched); restored afterwards."""
    saved = {name: getattr(fast, name) for name in PARTS if hasattr(fast, name)}

    def wrap(label, fn):
        def call(*a, **k):
            with record_function(label):
                return fn(*a, **k)
        return call
    try:
        for name, fn in saved.items():
            setattr(fast, name, wrap(PARTS[name], fn))
        yield
    finally:
        for name, fn in saved.items():
            setattr(fast, name, fn)


def by_part(prof) -> dict:
    """Kernel time (ms) and count under each part's ranges, attention kernels apart."""
    out: dict = {}

    def kernels(e):
        for c in e.cpu_children:
            yield from kernels(c)
        yield from e.kernels

    for e in prof.events():
        if e.name not in PARTS.values():
            continue
        for k in kernels(e):
            part = e.name + (" (attention)" if "attention" in k.name else "")
            t, n = out.get(part, (0.0, 0))
            out[part] = (t + k.duration / 1e3, n + 1)
    return out


def replay_ms(runner: EngineRunner, b: int, reps: int = 20) -> float:
    """Median time of the step's captured graph replayed (ab_step.time_steps: captured first, CUDA events);
    the runner's model steps eagerly again afterwards."""
    runner.model.use_graphs = True
    try:
        return time_steps(runner, b, reps)
    finally:
        runner.model.use_graphs = False


@torch.no_grad()  # as the loop runs the step
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dummy", default="0.6b")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--context", type=int, default=0)
    ap.add_argument("--kv-cache", default="auto", choices=["auto", "model", "fp8"])
    args = ap.parse_args()
    eng = dummy_engine(args.dummy, "cuda", "bfloat16")
    for b in args.batch:
        runner = EngineRunner(eng, max_slots=b, max_context=512 if args.context < 400 else 1024, use_graphs=True,
                              kv_cache=args.kv_cache)
        runner.model.use_graphs = False  # eager steps: the profiler sees every kernel (the replay is timed apart)
        for i in range(b):
            runner.submit(request(300, i))
        while runner.slots.n_active < b:
            runner.step_once()
        if args.context:
            advance(runner, b, args.context)
        _, length = runner.model.bucket(runner.slots.seqs, b)
        for _ in range(3):
            runner.model.run_step(b, length, runner.model.k_cap(runner.slots.seqs, b))
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            runner.model.run_step(b, length, runner.model.k_cap(runner.slots.seqs, b))
            torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
        total = sum(e.self_device_time_total for e in events)
        count = sum(e.count for e in events)
        print(f"\n== decode step, batch {b}, {args.kv_cache} key/value cache, length bucket {length}: {count} kernels, "
              f"{total / 1e3:.2f} ms of kernel time")
        for e in sorted(events, key=lambda e: -e.self_device_time_total)[:12]:
            print(f"{e.self_device_time_total / 1e3:8.3f} ms {e.count:5d}x  {e.key[:90]}")
        with labelled(runner.model.fast), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            runner.model.run_step(b, length, runner.model.k_cap(runner.slots.seqs, b))
            torch.cuda.synchronize()
        parts = by_part(prof)
        replay = replay_ms(runner, b)
        print(f"== by part (kernel time of one eager step; per frame = / {b} rows):")
        for name, (t, n) in sorted(parts.items(), key=lambda kv: -kv[1][0]):
            print(f"{t:8.3f} ms {n:5d} kernels  {t * 1e3 / b:7.2f} us/frame  {name}")
        kt = sum(t for t, _ in parts.values())
        print(f"{kt:8.3f} ms in parts ({total / 1e3:.3f} ms all kernels); captured step replay {replay:.3f} ms: "
              f"{max(0.0, replay - total / 1e3):.3f} ms between kernels")
        for h in list(runner.slots.seqs):
            h.handle.cancel()
        while runner.slots.n_active or any(l.busy for l in runner.lanes.values()):
            runner.step_once()
        for lane in runner.lanes.values():
            lane.use_graphs = False  # eager: the profiler sees every kernel
            # (at most what one call of b rows may decode: 8 stream frames x 256 rows overran it)
            frames = min(8, lane.chunk_cap(b)) if lane.name == "stream" else lane.chunk_cap(b)
            lane.bench_call(b, frames)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                lane.bench_call(b, frames)
                torch.cuda.synchronize()
            events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
            total = sum(e.self_device_time_total for e in events)
            print(f"== codec ({lane.name} lane) {frames} frames x {b} rows: {sum(e.count for e in events)} kernels, "
                  f"{total / 1e3:.2f} ms")
            for e in sorted(events, key=lambda e: -e.self_device_time_total)[:8]:
                print(f"{e.self_device_time_total / 1e3:8.3f} ms {e.count:5d}x  {e.key[:90]}")
        del runner, lane  # this batch's caches and graph pools go before the next batch's are made
        gc.collect()  # (the runner's reference cycles hold them otherwise: 512 rows ran out of memory behind 256)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
