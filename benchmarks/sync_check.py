"""Where the engine loop makes the host wait for the GPU: CUDA syncs by Python call site.

    python -m benchmarks.sync_check --dummy 0.6b --slots 32 --requests 96

Runs the runner loop in this thread (eager, no graphs: only the host side matters) with torch's CUDA sync
debug mode on after a warm-up, and counts the warnings it raises for synchronising operations by the line
of our code that caused them. The loop should wait only where it means to: for a step's flags
(`_collect`), and for codec calls it chose to wait for.
"""
from __future__ import annotations

import argparse
import collections
import traceback
import warnings

import torch

from benchmarks.bench import request
from benchmarks.dummy_engine import dummy_engine
from engines.runtime.runner import EngineRunner


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dummy", default="0.6b")
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--frames", type=int, default=20)
    args = ap.parse_args(argv)
    eng = dummy_engine(args.dummy, "cuda", "bfloat16")
    runner = EngineRunner(eng, max_slots=args.slots, max_context=512, use_graphs=False, compile=False)
    runner.synthesize([request(args.frames, i) for i in range(4)])  # warm-up
    sites: collections.Counter = collections.Counter()
    orig = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        ours = [f for f in traceback.extract_stack() if "/engines/" in f.filename or "/jobs/" in f.filename]
        where = f"{ours[-1].filename.split('/engines/')[-1]}:{ours[-1].lineno} {ours[-1].name}" if ours else \
            f"{filename}:{lineno}"
        sites[where] += 1

    warnings.showwarning = record
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    try:
        runner.synthesize([request(args.frames, 100 + i) for i in range(args.requests)])
    finally:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = orig
    print(f"{sum(sites.values())} synchronising calls over {runner.steps} loop steps, by call site:")
    for where, n in sites.most_common():
        print(f"{n:8d}  {where}")
    return dict(sites)


if __name__ == "__main__":
    main()
