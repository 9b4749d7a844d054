"""A/B of decode-step variants in one process: graph-replay time per step at several batch sizes.

    python -m benchmarks.ab_step --dummy 0.6b --batches 1,64,256 --variants layer:0,layer:64,pass:64
    python -m benchmarks.ab_step --dummy 0.6b --batches 256,512,1024 --context 450 --variants layer:64,layer:64:fp8
    python -m benchmarks.ab_step --model tests/data/tiny/cv_small --device cpu --dtype float32 --batches 2 --reps 2 \
        --context 100 --variants layer:0,layer:0:fp8          # a smoke run on the CPU

A variant is `fuse:topk_cap[:attn[:sampler[:rows|layer|nopre|nolayer|fp8|split|opaque]]]` (EngineRunner's `fuse` and `topk_cap`: per-layer or per-pass
compiled regions; a top-k sampler sorting only the best `topk_cap` ids, 0 = the whole vocabulary; `attn`:
`kernel` for the Triton decode-attention kernel, `torch` for the torch form; `sampler`: `kernel` for the
Triton draw (no sort; topk_cap unused), `torch` for the torch draws; each default the engine's choice;
`rows`: the one-row projections as Triton kernels, engines.runtime.rowproj; `layer`: each one-row decoder layer
as one persistent kernel, engines.runtime.layer_kernel; `nopre`: the same without loading weights ahead of its barriers;
`nolayer`: the compiled layers for one row too; `fp8`: the talker's key/value cache in fp8, runtime.kv_cache, else the
model's dtype; `split`: the talker's attention split over programs per row, runtime.attn_split true, else false;
`opaque`: the attention kernels called as one torch custom op inside the compiled regions (attention_split.opaque);
unnamed: the engine's choice). For each
variant and batch size: requests are admitted until the batch is full (`--context N`: then every row is moved
to a position in [N, N + 50), so the attention reads a book's context rather than a fresh prompt's; the cache
there holds zeros, which read as fast), then the step for that bucket is replayed `--reps` times between CUDA
events (median reported; wall clock on the CPU), plus the kernels of one eager step (torch profiler, CUDA).
Compilation and capture are timed apart. Random weights of the real shape (`--dummy`, bf16), or a checkpoint.
`--probe V1,V2`: also the talker's attention launch on those variants' own cache tensors, alone and in the step
(benchmarks.attention_probe), at the first batch size (`all`: every variant).
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
from engines.runtime import attention_split, layer_kernel
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


@torch.no_grad()  # as the loop runs it
def step(runner: EngineRunner, n: int) -> None:
    """One decode step over slots [0, n) as the loop would run it (its bucket's graph, or eagerly)."""
    m, seqs = runner.model, runner.slots.seqs
    b, length = m.bucket(seqs, n)
    m.run_step(b, length, m.k_cap(seqs, b))


def advance(runner: EngineRunner, n: int, context: int) -> None:
    """Move the rows of slots [0, n) to positions context .. context + 49 (device table and host copies)."""
    seqs = runner.slots.seqs[:n]
    pos = [context + (i * 37) % 50 for i in range(n)]
    runner.model.table.pos[:n].copy_(torch.tensor(pos))
    for seq, p in zip(seqs, pos):
        seq.pos = p


@torch.no_grad()
def time_steps(runner: EngineRunner, n: int, reps: int) -> float:
    runner._decode(n)  # the bucket's graph (captured now if new)
    runner._drain()
    times = []
    for _ in range(reps):
        if runner.device.type != "cuda":
            t0 = time.perf_counter()
            step(runner, n)
            times.append((time.perf_counter() - t0) * 1e3)
            continue
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
    ap.add_argument("--model", help="a checkpoint folder instead of random weights")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--variants", default="layer:0,layer:64,pass:64")
    ap.add_argument("--context", type=int, default=0, help="rows moved to positions [N, N + 50) before timing")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--probe", default="", help="variants (comma list, or all) whose attention launch is probed alone "
                                                "and in the step (benchmarks.attention_probe)")
    ap.add_argument("--json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.backends.cuda.matmul.allow_tf32 = True
    cuda = args.device.startswith("cuda")
    if args.model:
        from engines.engine import TTSEngine

        eng = TTSEngine.load(args.model, device=args.device, dtype=args.dtype)
    else:
        eng = dummy_engine(args.dummy, args.device, args.dtype)
    batches = [int(b) for b in args.batches.split(",")]
    max_context = 512 if not args.context else -(-(args.context + 50 + args.reps + 64) // 256) * 256
    out = {"device": torch.cuda.get_device_name() if cuda else args.device, "model": args.model or f"dummy-{args.dummy}",
           "dtype": args.dtype, "context": args.context, "rows": []}
    for v in args.variants.split(","):
        fuse, cap, *kinds = v.split(":")
        rows = "rows" in kinds
        layers = True if "layer" in kinds or "nopre" in kinds else False if "nolayer" in kinds else None
        layer_kernel.PRELOAD = "nopre" not in kinds
        flags = ("rows", "layer", "nopre", "nolayer", "fp8", "split", "opaque")
        attn, sampler = ([{"kernel": True, "torch": False, "auto": None}[k] for k in kinds
                          if k not in flags] + [None, None])[:2]
        attention_split.OPAQUE = "opaque" in kinds
        runner = EngineRunner(eng, max_slots=max(batches), max_context=max_context, max_queue=4096, fuse=fuse,
                              topk_cap=int(cap), attn_kernel=attn, sample_kernel=sampler, row_kernel=rows,
                              layer_kernel=layers, kv_cache="fp8" if "fp8" in kinds else "model",
                              attn_split="split" in kinds)
        for b in batches:
            t0 = time.perf_counter()
            handles = fill(runner, b, 400)
            if args.context:
                advance(runner, b, args.context)
            first = time_steps(runner, b, 1)  # includes compile + capture of this bucket
            setup = time.perf_counter() - t0
            ms = time_steps(runner, b, args.reps)
            row = {"variant": v, "batch": b, "step_ms": ms, "ms_per_frame_single": ms if b == 1 else None,
                   "audio_s_per_s_decode_only": b * 0.08 / (ms / 1e3), "setup_s": setup, "first_ms": first}
            if b == 1 and cuda:
                row["kernels"] = kernels_per_step(runner, b)
            if cuda and b == batches[0] and (args.probe == "all" or v in args.probe.split(",")):
                row["probe"] = run_probe(runner, b, v)
            out["rows"].append(row)
            log.info("%s", row)
            if args.json:  # after every row: a run cut short keeps what it measured
                with open(args.json, "w") as f:
                    json.dump(out, f, indent=1)
            drain(runner, handles)
        del runner
        torch._dynamo.reset()  # the next variant compiles afresh (compiled entries are shared by code object)
        if cuda:
            torch.cuda.empty_cache()
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    print("| variant | batch | step ms | decode-only audio-s/s | kernels (b=1) |\n|---|---|---|---|---|")
    for r in out["rows"]:
        print(f"| {r['variant']} | {r['batch']} | {r['step_ms']:.2f} | {r['audio_s_per_s_decode_only']:.0f} | "
              f"{r.get('kernels', '')} |")
    probes = [r["probe"] for r in out["rows"] if "one" in r.get("probe", {})]
    if probes:
        from benchmarks.attention_probe import table

        print("\ntalker attention per launch, us (benchmarks.attention_probe):\n" + table(probes))


def run_probe(runner: EngineRunner, b: int, variant: str) -> dict:
    """benchmarks.attention_probe on this variant's runner; a failure is recorded, the A/B goes on."""
    from benchmarks.attention_probe import probe

    try:
        return {"variant": variant, **probe(runner, b)}
    except Exception as e:  # noqa: BLE001 (a probe that fails must not lose the A/B's figures)
        log.exception("probe failed")
        return {"variant": variant, "error": f"{type(e).__name__}: {e}"}


if __name__ == "__main__":
    main()
