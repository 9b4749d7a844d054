"""GPU time per call of a small function: many calls captured in one CUDA graph, the graph replayed."""
from __future__ import annotations

import statistics

import torch


def per_call_us(fn, calls: int, reps: int, copies: int = 1) -> float:
    """Microseconds per call of `fn(i)`: `calls` calls captured in one graph, i cycling over range(copies)
    (e.g. weight copies that together outgrow L2), after one eager call per copy; median over `reps` replays."""
    for i in range(copies):
        fn(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i % copies)
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)
