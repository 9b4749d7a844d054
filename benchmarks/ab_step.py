"""A/B of decode-step variants in one process: graph-replay time per step at several batch sizes.

    python -m benchmarks.ab_step --dummy 0.6b --batches 1,64,256 --variants layer:0,layer:64,pass:64

A variant is `fuse:topk_cap[:attn[:sampler[:rows|layer|nopre|nolayer]]]` (EngineRunner's `fuse` and `topk_cap`: per-layer or per-pass
compiled regions; a top-k sampler sorting only the best `topk_cap` ids, 0 = the whole vocabulary; `attn`:
`kernel` for the Triton decode-attention kernel, `torch` for the torch form; `sampler`: `kernel` for the
Triton draw (no sort; topk_cap unused), `torch` for the torch draws; each default the engine's choice;
`rows`: the one-row projections as Triton kernels, engines.runtime.rowproj; `layer`: each one-row decoder layer
as one persistent kernel, engines.runtime.layer_kernel; `nopre`: the same without loading weights ahead of its barriers;
`nolayer`: the compiled layers for one row too; unnamed: the engine's choice). For each
variant and batch size: requests are admitted until the batch is full, then the step for that bucket
is replayed `--reps` times between CUDA events (median reported), plus the kernels of one eager step
(torch profiler). Compilation and capture are timed apart. Random weights of the real shape, bf16.
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import time

import torch

from benchmarks.bench import request
from benchmarks.dummy_engine import dummy_engine
from engines.runtime import layer_kernel
from engines.runtime.runner import EngineRunner

log = logging.getLogger("ab_step")


def fill(runner: EngineRunner, batch: int, frames: int) -> list:
    handles = [runner.submit(request(frames, seed=i), priority=1) for i in range(batch)]
    while runner.slots.n_active < batch:
        runner.step_once()
    return handles


def drain(runner: EngineRunner, handles: list) -> None:
    for h in handles:
        h.cancel()
    while runner.slots.n_active or any(l.busy for l in runner.lanes.values()) or runner._inflight:
        runner.step_once()


def step(runner: EngineRunner, n: int) -> None:
    """One decode step over slots [0, n) as the loop would run it (its bucket's graph, or eagerly)."""
    m, seqs = runner.model, runner.slots.seqs
    b, length = m.bucket(seqs, n)
    m.run_step(b, length, m.k_cap(seqs, b))


def time_steps(runner: EngineRunner, n: int, reps: int) -> float:
    runner._decode(n)  # the bucket's graph (captured now if new)
    runner._drain()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step(runner, n)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def kernels_per_step(runner: EngineRunner, n: int) -> int:
    """CUDA kernels of one step run eagerly (the graph replays the same kernels)."""
    from torch.profiler import ProfilerActivity, profile

    runner.model.use_graphs = False
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof, torch.no_grad():  # as the loop runs it
            step(runner, n)
            torch.cuda.synchronize()
    finally:
        runner.model.use_graphs = True
    return sum(e.count for e in prof.key_averages() if e.device_type.name == "CUDA")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dummy", choices=["0.6b", "1.7b"], default="0.6b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--variants", default="layer:0,layer:64,pass:64")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.backends.cuda.matmul.allow_tf32 = True
    eng = dummy_engine(args.dummy, "cuda", args.dtype)
    batches = [int(b) for b in args.batches.split(",")]
    out = {"device": torch.cuda.get_device_name(), "model": f"dummy-{args.dummy}", "dtype": args.dtype, "rows": []}
    for v in args.variants.split(","):
        fuse, cap, *kinds = v.split(":")
        rows = "rows" in kinds
        layers = True if "layer" in kinds or "nopre" in kinds else False if "nolayer" in kinds else None
        layer_kernel.PRELOAD = "nopre" not in kinds
        attn, sampler = ([{"kernel": True, "torch": False, "auto": None}[k] for k in kinds
                          if k not in ("rows", "layer", "nopre", "nolayer")] + [None, None])[:2]
        runner = EngineRunner(eng, max_slots=max(batches), max_context=512, max_queue=4096, fuse=fuse,
                              topk_cap=int(cap), attn_kernel=attn, sample_kernel=sampler, row_kernel=rows,
                              layer_kernel=layers)
        for b in batches:
            t0 = time.perf_counter()
            handles = fill(runner, b, 400)
            first = time_steps(runner, b, 1)  # includes compile + capture of this bucket
            setup = time.perf_counter() - t0
            ms = time_steps(runner, b, args.reps)
            row = {"variant": v, "batch": b, "step_ms": ms, "ms_per_frame_single": ms if b == 1 else None,
                   "audio_s_per_s_decode_only": b * 0.08 / (ms / 1e3), "setup_s": setup, "first_ms": first}
            if b == 1:
                row["kernels"] = kernels_per_step(runner, b)
            out["rows"].append(row)
            log.info("%s", row)
            drain(runner, handles)
        del runner
        torch._dynamo.reset()  # the next variant compiles afresh (compiled entries are shared by code object)
        torch.cuda.empty_cache()
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        open(args.json, "w").write(text)
    print("| variant | batch | step ms | decode-only audio-s/s | kernels (b=1) |\n|---|---|---|---|---|")
    for r in out["rows"]:
        print(f"| {r['variant']} | {r['batch']} | {r['step_ms']:.2f} | {r['audio_s_per_s_decode_only']:.0f} | "
              f"{r.get('kernels', '')} |")


if __name__ == "__main__":
    main()
