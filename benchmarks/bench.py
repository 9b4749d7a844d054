"""Engine benchmark: random weights of the real shapes, fixed frames per request (EOS never sampled).

    python -m benchmarks.bench --dummy 1.7b --frames 150 --json out.json --md out.md

Reports single-stream x-realtime and ms per frame, time to first audio (engine-side: submit -> first
PCM chunk ready) p50/p95 at 1 and 32 concurrent streams, aggregate audio-seconds per second in closed
loops at several concurrencies (codec included), a per-step time breakdown, peak GPU memory, device.
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import threading
import time
from pathlib import Path

import torch

from engines.api import SamplingParams, SynthesisRequest
from benchmarks.dummy_engine import dummy_engine
from engines.runtime.runner import EngineRunner
from engines.runtime.scheduler import pick_bucket

FRAME_S = 0.08
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the quiet forest."


def request(frames: int, seed: int) -> SynthesisRequest:
    # min_new_tokens = max_new_tokens: EOS stays masked, every request yields exactly `frames` frames
    sp = SamplingParams(max_new_tokens=frames + 1, min_new_tokens=frames + 1, seed=seed)
    return SynthesisRequest(text=TEXT, voice="vivian", language="english", sampling=sp)


def closed_loop(runner: EngineRunner, concurrency: int, total: int, frames: int, priority: int = 0) -> dict:
    """Keep `concurrency` requests in flight until `total` are done; returns audio s/s and TTFAs.
    priority 0: streams (small first codec chunk); 1: batch work (large codec chunks)."""
    lock, done_evt = threading.Lock(), threading.Event()
    state = {"submitted": 0, "done": 0, "handles": []}

    def submit_one():
        h = runner.submit(request(frames, seed=state["submitted"]), priority)
        state["submitted"] += 1
        state["handles"].append(h)
        h.on_done = on_done

    def on_done(h):
        with lock:
            state["done"] += 1
            if state["submitted"] < total:
                submit_one()
            elif state["done"] == total:
                done_evt.set()

    t0 = time.perf_counter()
    with lock:
        for _ in range(min(concurrency, total)):
            submit_one()
    done_evt.wait()
    wall = time.perf_counter() - t0
    audio = sum(h.audio_seconds for h in state["handles"])
    ttfa = sorted(h.ttfa_s for h in state["handles"])
    errors = [h.error for h in state["handles"] if h.error]
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed: {errors[0]}")
    return {"concurrency": concurrency, "requests": total, "priority": priority, "wall_s": wall, "audio_s": audio,
            "audio_s_per_s": audio / wall, "ttfa_p50_ms": 1e3 * statistics.median(ttfa),
            "ttfa_p95_ms": 1e3 * ttfa[min(len(ttfa) - 1, int(0.95 * len(ttfa)))]}


def step_breakdown(runner: EngineRunner, frames: int, batch: int) -> dict:
    """Time decode steps (graph replays) and codec calls separately at one batch size."""
    handles = [runner.submit(request(frames, seed=i)) for i in range(batch)]
    while runner.slots.n_active < batch:
        runner.step_once()
    torch.cuda.synchronize()
    n = runner.slots.n_active
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        runner._decode(n)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    for h in handles:
        h.cancel()
    while runner.slots.n_active or len(runner.sched.queue) or any(l.busy for l in runner.lanes.values()):
        runner.step_once()
    codec = {}
    for lane_name, frames in (("stream", 8), ("batch", runner.lanes["batch"].chunk_cap(pick_bucket(batch, runner.lanes["batch"].buckets)))):
        lane = runner.lanes[lane_name]
        b = pick_bucket(batch, lane.buckets)
        lane.bench_call(b, frames)  # capture
        times = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            lane.bench_call(b, frames)
            times.append(1e3 * (time.perf_counter() - t0))
        codec[lane_name] = {"rows": b, "frames": frames, "ms": statistics.median(times),
                            "audio_s_per_s": b * frames * FRAME_S / (statistics.median(times) / 1e3)}
    return {"batch": batch, "decode_step_ms": statistics.median(times), "codec": codec}


def measure(runner: EngineRunner, phases: list, args, slots: int, conc: list, prefix: str) -> dict:
    """The closed-loop phases (single stream, TTFA at 1 and 32 streams, aggregate); keys get `prefix`."""
    res = {}
    if "single" in phases:
        singles = [closed_loop(runner, 1, 1, args.frames)["wall_s"] for _ in range(3)]
        wall = statistics.median(singles)
        res["single"] = {"x_realtime": args.frames * FRAME_S / wall, "ms_per_frame": 1e3 * wall / args.frames}
    if "ttfa1" in phases:
        res["ttfa_c1"] = closed_loop(runner, 1, args.ttfa_requests, 20)
    if "ttfa32" in phases and slots >= 32:
        res["ttfa_c32"] = closed_loop(runner, 32, max(args.ttfa_requests, 64), args.frames)
    if "aggregate" in phases:
        res["aggregate"] = [closed_loop(runner, c, max(2 * c, 4), args.frames, priority=1) for c in conc]
    return {prefix + k: v for k, v in res.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dummy", choices=["0.6b", "1.7b"], help="random weights of a real shape")
    ap.add_argument("--model", help="a checkpoint folder instead (e.g. the tiny test model, to try the script)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--concurrency", default="1,8,32,64,128,256", help="aggregate phase: requests in flight")
    ap.add_argument("--ttfa-requests", type=int, default=50)
    ap.add_argument("--slots", type=int, default=0, help="slots (0: auto, sized by free GPU memory)")
    ap.add_argument("--max-context", type=int, default=0, help="cache positions per slot (0: frames + 100, rounded up)")
    ap.add_argument("--no-gemv", action="store_true", help="batch-1 matmuls as library kernels (A/B)")
    ap.add_argument("--attn", choices=["auto", "kernel", "torch"], default="auto",
                    help="decode attention: the Triton kernel, the torch form, or the engine's choice (A/B)")
    ap.add_argument("--sampler", choices=["auto", "kernel", "torch"], default="auto",
                    help="the step's draws: the Triton kernel, the torch form (sorts), or the engine's choice (A/B)")
    ap.add_argument("--layer", choices=["auto", "kernel", "torch"], default="auto",
                    help="one stream's decoder layers: one persistent kernel each, the compiled torch form, or the "
                         "engine's choice (A/B)")
    ap.add_argument("--codec", default="torch", help="codec backend: torch, torch-compiled, built, auto")
    ap.add_argument("--no-overlap", action="store_true", help="read each step back before the next (A/B)")
    ap.add_argument("--cudnn-benchmark", choices=["on", "off"], default="on", help="cuDNN autotuning of the codec convs")
    ap.add_argument("--batch-chunk", type=int, default=64, help="batch work: frames per codec chunk")
    ap.add_argument("--codec-streams", default="on", help="codec lanes on their own CUDA streams: on, off, or "
                    "on,off (A/B: the phases run once per setting, same process)")
    ap.add_argument("--phases", default="single,ttfa1,ttfa32,aggregate,breakdown",
                    help="comma list of single, ttfa1, ttfa32, aggregate, breakdown")
    ap.add_argument("--json")
    ap.add_argument("--md")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.benchmark = args.cudnn_benchmark == "on"

    t_load = time.perf_counter()
    if args.model:
        from engines.engine import TTSEngine

        eng = TTSEngine.load(args.model, device=args.device, dtype=args.dtype)
    else:
        eng = dummy_engine(args.dummy or "0.6b", args.device, args.dtype)
    cuda = eng.device.type == "cuda"
    conc = [int(c) for c in args.concurrency.split(",")]
    ctx = args.max_context or 256 * ((args.frames + 100) // 256 + 1)
    plan = None
    if not args.slots:
        from engines.runtime.memory import plan_for_engine

        plan = plan_for_engine(eng, ctx)
        logging.info("auto slots: %s", plan.describe())
    slots = args.slots or plan.slots
    conc = [c for c in conc if c <= slots] or [slots]
    runner = EngineRunner(eng, max_slots=slots, max_context=ctx, max_queue=4096, gemv=not args.no_gemv,
                          attn_kernel={"auto": None, "kernel": True, "torch": False}[args.attn],
                          sample_kernel={"auto": None, "kernel": True, "torch": False}[args.sampler],
                          layer_kernel={"auto": None, "kernel": True, "torch": False}[args.layer],
                          overlap=not args.no_overlap, codec_backend=args.codec, batch_chunk_frames=args.batch_chunk)
    t_prep = time.perf_counter()
    prep = runner.prepare()  # every graph captured (and every region compiled) before any request
    runner.synthesize([request(4, i) for i in range(2)])  # touch the host paths once
    warm = time.perf_counter() - t_prep
    runner.start()
    res = {"device": torch.cuda.get_device_name() if cuda else "cpu",
           "model": Path(args.model).name if args.model else f"dummy-{args.dummy}", "dtype": args.dtype,
           "gemv": not args.no_gemv, "attn": args.attn, "sampler": args.sampler, "overlap": not args.no_overlap, "codec": args.codec,
           "cudnn_benchmark": args.cudnn_benchmark, "batch_chunk": args.batch_chunk, "slots": slots,
           "slots_auto": plan.describe() if plan else None, "max_context": ctx, "frames": args.frames,
           "load_s": t_prep - t_load, "startup_s": warm, "prepare": prep, "graphs": len(runner.graphs)}
    phases = args.phases.split(",")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    variants = args.codec_streams.split(",")
    for v in variants:
        for lane in runner.lanes.values():
            lane.use_stream(v == "on")
        res.update(measure(runner, phases, args, slots, conc, "" if len(variants) == 1 else f"codec_streams_{v}:"))
    runner.stop()
    if "breakdown" in phases and cuda:
        sizes = sorted({1, 32, min(128, slots), slots} & set(range(1, slots + 1)))
        res["breakdown"] = [step_breakdown(runner, 400, b) for b in sizes]
    res["peak_gpu_mem_gb"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    res["reserved_gpu_mem_gb"] = torch.cuda.memory_reserved() / 2**30 if cuda else 0.0
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        open(args.json, "w").write(text)
    md = markdown(res)
    print(md)
    if args.md:
        open(args.md, "w").write(md)


def markdown(r: dict) -> str:
    lines = [f"### {r['model']} {r['dtype']} on {r['device']} ({r['frames']} frames per request, "
             f"{r['slots']} slots, codec {r['codec']})", "", "| metric | value |", "|---|---|",
             f"| start-up (graphs captured, regions compiled) | {r['startup_s']:.1f} s |"]
    prefixes = sorted({k.split(":")[0] + ":" for k in r if ":" in k}) or [""]
    for p in prefixes:
        tag = f" ({p[:-1]})" if p else ""
        if p + "single" in r:
            lines.append(f"| single stream{tag} | {r[p + 'single']['x_realtime']:.1f}x realtime, "
                         f"{r[p + 'single']['ms_per_frame']:.2f} ms/frame |")
        for key, label in (("ttfa_c1", "TTFA at 1 stream"), ("ttfa_c32", "TTFA at 32 streams")):
            if p + key in r:
                lines.append(f"| {label}{tag} | p50 {r[p + key]['ttfa_p50_ms']:.1f} ms, "
                             f"p95 {r[p + key]['ttfa_p95_ms']:.1f} ms |")
        for a in r.get(p + "aggregate", []):
            lines.append(f"| aggregate (batch work) c={a['concurrency']}{tag} | {a['audio_s_per_s']:.0f} audio-s/s |")
    for b in r.get("breakdown", []):
        c = b["codec"]
        lines.append(f"| step at batch {b['batch']} | decode {b['decode_step_ms']:.2f} ms; codec stream lane "
                     f"{c['stream']['rows']}x{c['stream']['frames']} {c['stream']['ms']:.1f} ms, batch lane "
                     f"{c['batch']['rows']}x{c['batch']['frames']} {c['batch']['ms']:.1f} ms "
                     f"({c['batch']['audio_s_per_s']:.0f} audio-s/s) |")
    lines.append(f"| peak GPU memory | {r['peak_gpu_mem_gb']:.1f} GiB |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
