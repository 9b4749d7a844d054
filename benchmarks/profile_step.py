"""Where a decode step's time goes: CUDA kernels of one eager step and of one codec call, by total time.

    python -m benchmarks.profile_step --dummy 0.6b --batch 1 64
    python -m benchmarks.profile_step --dummy 0.6b --batch 256 --context 450 --kv-cache fp8

`--context N`: the rows are moved to positions [N, N + 50) first (benchmarks.ab_step.advance), so the attention
reads a book's context; `--kv-cache`: the talker's key/value cache (runtime.kv_cache).
"""
from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.ab_step import advance
from benchmarks.bench import request
from benchmarks.dummy_engine import dummy_engine
from engines.runtime.runner import EngineRunner


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
        runner = EngineRunner(eng, max_slots=b, max_context=512 if args.context < 400 else 1024, use_graphs=False,
                              kv_cache=args.kv_cache)
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


if __name__ == "__main__":
    main()
