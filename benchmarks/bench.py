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

import torch

from engines.api import SamplingParams, SynthesisRequest
from benchmarks.dummy_engine import dummy_engine
from engines.runtime.runner import EngineRunner

FRAME_S = 0.08
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the quiet forest."


def request(frames: int, seed: int) -> SynthesisRequest:
    # min_new_tokens = max_new_tokens: EOS stays masked, every request yields exactly `frames` frames
    sp = SamplingParams(max_new_tokens=frames + 1, min_new_tokens=frames + 1, seed=seed)
    return SynthesisRequest(text=TEXT, voice="vivian", language="english", sampling=sp)


def closed_loop(runner: EngineRunner, concurrency: int, total: int, frames: int) -> dict:
    """Keep `concurrency` requests in flight until `total` are done; returns audio s/s and TTFAs."""
    lock, done_evt = threading.Lock(), threading.Event()
    state = {"submitted": 0, "done": 0, "handles": []}

    def submit_one():
        h = runner.submit(request(frames, seed=state["submitted"]))
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
    return {"concurrency": concurrency, "requests": total, "wall_s": wall, "audio_s": audio,
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
    codec_times = []
    for _ in range(3):
        for i in range(n):
            for _ in range(8):
                runner.codec.push_frame(i, torch.zeros(16, dtype=torch.long))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        runner.codec.run(n, [True] * n)
        codec_times.append(1e3 * (time.perf_counter() - t0))
    for h in handles:
        h.cancel()
    while runner.slots.n_active or len(runner.queue):
        runner.step_once()
    return {"batch": batch, "decode_step_ms": statistics.median(times),
            "codec_8_frames_ms": statistics.median(codec_times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dummy", choices=["0.6b", "1.7b"], required=True)
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--concurrency", default="1,8,32,64,128,256")
    ap.add_argument("--ttfa-requests", type=int, default=50)
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--no-codec-graphs", action="store_true", help="run the codec eagerly (diagnosis)")
    ap.add_argument("--sync", action="store_true", help="synchronise after every step (diagnosis)")
    ap.add_argument("--no-gemv", action="store_true", help="batch-1 matmuls as library kernels (A/B)")
    ap.add_argument("--codec", default="torch", help="codec backend: torch, torch-compiled, built, auto")
    ap.add_argument("--no-overlap", action="store_true", help="read each step back before the next (A/B)")
    ap.add_argument("--phases", default="single,ttfa1,ttfa32,aggregate,breakdown",
                    help="comma list of single, ttfa1, ttfa32, aggregate, breakdown")
    ap.add_argument("--json")
    ap.add_argument("--md")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.backends.cuda.matmul.allow_tf32 = True

    eng = dummy_engine(args.dummy, "cuda", args.dtype)
    conc = [int(c) for c in args.concurrency.split(",")]
    runner = EngineRunner(eng, max_slots=max(args.slots, max(conc)), max_context=256 * ((args.frames + 100) // 256 + 1),
                          max_queue=4096, gemv=not args.no_gemv, overlap=not args.no_overlap,
                          codec_backend=args.codec)
    if args.no_codec_graphs:
        runner.codec.use_graphs = False
    if args.sync:
        step = runner.step_once

        def synced():
            step()
            torch.cuda.synchronize()
        runner.step_once = synced
    t0 = time.perf_counter()
    for c in sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 512} & set(range(1, max(conc) + 1))):  # capture graphs
        runner.synthesize([request(4, i) for i in range(c)])
    warm = time.perf_counter() - t0
    runner.start()
    res = {"device": torch.cuda.get_device_name(), "model": f"dummy-{args.dummy}", "dtype": args.dtype,
           "gemv": not args.no_gemv, "overlap": not args.no_overlap, "codec": args.codec,
           "frames": args.frames, "warmup_s": warm, "graphs": len(runner.graphs)}
    phases = args.phases.split(",")
    if "single" in phases:
        singles = [closed_loop(runner, 1, 1, args.frames)["wall_s"] for _ in range(3)]
        wall = statistics.median(singles)
        res["single"] = {"x_realtime": args.frames * FRAME_S / wall, "ms_per_frame": 1e3 * wall / args.frames}
    if "ttfa1" in phases:
        res["ttfa_c1"] = closed_loop(runner, 1, args.ttfa_requests, 20)
    if "ttfa32" in phases:
        res["ttfa_c32"] = closed_loop(runner, 32, max(args.ttfa_requests, 64), args.frames)
    if "aggregate" in phases:
        res["aggregate"] = [closed_loop(runner, c, max(2 * c, 4), args.frames) for c in conc]
    runner.stop()
    if "breakdown" in phases:
        sizes = sorted({1, 32, min(128, max(conc))} & set(range(1, runner.cfg.max_slots + 1)))
        res["breakdown"] = [step_breakdown(runner, 400, b) for b in sizes]
    res["peak_gpu_mem_gb"] = torch.cuda.max_memory_allocated() / 2**30
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        open(args.json, "w").write(text)
    md = markdown(res)
    print(md)
    if args.md:
        open(args.md, "w").write(md)


def markdown(r: dict) -> str:
    lines = [f"### {r['model']} {r['dtype']} on {r['device']} ({r['frames']} frames per request)", "",
             "| metric | value |", "|---|---|"]
    if "single" in r:
        lines.append(f"| single stream | {r['single']['x_realtime']:.1f}x realtime, "
                     f"{r['single']['ms_per_frame']:.2f} ms/frame |")
    for key, label in (("ttfa_c1", "TTFA at 1 stream"), ("ttfa_c32", "TTFA at 32 streams")):
        if key in r:
            lines.append(f"| {label} | p50 {r[key]['ttfa_p50_ms']:.1f} ms, p95 {r[key]['ttfa_p95_ms']:.1f} ms |")
    for a in r.get("aggregate", []):
        lines.append(f"| aggregate c={a['concurrency']} | {a['audio_s_per_s']:.0f} audio-s/s |")
    for b in r.get("breakdown", []):
        lines.append(f"| step at batch {b['batch']} | decode {b['decode_step_ms']:.2f} ms, "
                     f"codec (8 frames/row) {b['codec_8_frames_ms']:.1f} ms |")
    lines.append(f"| peak GPU memory | {r['peak_gpu_mem_gb']:.1f} GiB |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
