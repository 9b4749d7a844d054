"""Where a CPU decode step's time goes, by part, at a few row counts and thread counts (codec too).

    python -m benchmarks.cpu_profile --dummy 0.6b --threads 1,2 --rows 1,2,8,16,32 --reps 3
    python -m benchmarks.cpu_profile --dummy 0.6b --threads 2 --rows 16 --linear int8 --ops

For each (threads, rows): the rows are admitted (prefill not timed), then `--reps` decode steps run eagerly as
the loop runs them; each part of the step (engines.runtime.decode_step.FastStep) is timed by wrapping it:
the talker's 28 layers, the predictor's 15 passes of 5 layers, the heads (codebook 0 and the 15 predictor
heads, draws excluded), the draws (sampling), and the glue (first input, embeddings, next input, final norm).
Medians over the steps, in ms per step and per frame-row. Then the batch codec lane: one call of `rows` rows
x `--codec-frames` frames (median of `--reps`), as audio-seconds decoded per wall second.
`--ops`: torch profiler table of one step (CPU ops by self time: the per-op overheads at few rows).
Random weights of the real shape; timings depend on shapes, not on the values.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import time
from collections import defaultdict

import torch

from benchmarks.ab_step import drain, fill
from benchmarks.dummy_engine import dummy_engine
from engines.runtime.runner import EngineRunner

PARTS = {"t_layer": "talker", "p_layer": "predictor", "r_code0": "heads", "r_sub": "heads", "_draw": "draw",
         "r_first": "glue", "r_embed": "glue", "r_next": "glue", "r_final": "glue"}


class PartTimer:
    """Self time per part: a part's time excludes the parts called inside it (the draws inside the heads)."""

    def __init__(self):
        self.acc: dict = defaultdict(float)
        self._stack: list = []

    def wrap(self, part: str, fn):
        def timed(*a, **kw):
            t0 = time.perf_counter()
            self._stack.append(0.0)
            try:
                return fn(*a, **kw)
            finally:
                inner = self._stack.pop()
                dt = time.perf_counter() - t0
                self.acc[part] += dt - inner
                if self._stack:
                    self._stack[-1] += dt
        return timed


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


@torch.no_grad()
def profile_rows(eng, rows: int, reps: int, codec_frames: int, ops: bool, linear: str) -> dict:
    runner = EngineRunner(eng, max_slots=rows, max_context=512, **({"linear": linear} if linear != "model" else {}))
    handles = fill(runner, rows, 400)
    fast, m = runner.model.fast, runner.model
    timer = PartTimer()
    for attr, part in PARTS.items():
        setattr(fast, attr, timer.wrap(part, getattr(fast, attr)))
    b, length = m.bucket(runner.slots.seqs, rows)
    cap = m.k_cap(runner.slots.seqs, b)
    m.run_step(b, length, cap)  # warm-up
    walls, parts = [], defaultdict(list)
    for _ in range(reps):
        timer.acc.clear()
        t0 = time.perf_counter()
        m.run_step(b, length, cap)
        walls.append(time.perf_counter() - t0)
        for p, v in timer.acc.items():
            parts[p].append(v)
    wall = statistics.median(walls)
    out = {"rows": rows, "step_ms": round(wall * 1e3, 1), "ms_per_frame_row": round(wall * 1e3 / rows, 1),
           "frames_per_s": round(rows / wall, 2),
           "parts_ms": {p: round(statistics.median(v) * 1e3, 1) for p, v in sorted(parts.items())}}
    if ops:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            m.run_step(b, length, cap)
        out["ops"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    drain(runner, handles)
    lane = runner.lanes["batch"]
    n = min(codec_frames, lane.chunk_cap(rows))
    lane.bench_call(rows, n)  # warm-up
    ts = []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        lane.bench_call(rows, n)
        ts.append(time.perf_counter() - t0)
    audio = rows * n / 12.5
    out["codec"] = {"frames": n, "call_s": round(statistics.median(ts), 3),
                    "audio_s_per_s": round(audio / statistics.median(ts), 2),
                    "ms_per_frame_row": round(statistics.median(ts) * 1e3 / (rows * n), 1)}
    runner.stop()
    del runner, handles, fast, m, lane
    gc.collect()  # the runner's caches (reference cycles) before the next one is built
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dummy", choices=["0.6b", "1.7b"], default="0.6b")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rows", default="1,2,8,16,32")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--codec-frames", type=int, default=16)
    ap.add_argument("--linear", default="model", help="runtime.linear: model (the model's dtype) or int8")
    ap.add_argument("--ops", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    eng = dummy_engine(args.dummy, "cpu", args.dtype)
    res = {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__, "dtype": args.dtype,
           "linear": args.linear, "load_s": round(time.perf_counter() - t0, 1), "runs": []}
    print(f"{res['cpu']}, {res['cores']} cores, torch {res['torch']}, {args.dummy} {args.dtype}, linear {args.linear}")
    for threads in (int(x) for x in args.threads.split(",")):
        torch.set_num_threads(threads)
        for rows in (int(x) for x in args.rows.split(",")):
            r = profile_rows(eng, rows, args.reps, args.codec_frames, args.ops, args.linear)
            r["threads"] = threads
            res["runs"].append(r)
            print(f"threads {threads} rows {rows:3d}: step {r['step_ms']:8.1f} ms = {r['ms_per_frame_row']:6.1f} ms "
                  f"per frame-row ({r['frames_per_s']:.2f} frames/s = {r['frames_per_s'] / 12.5:.3f} audio-s/s); "
                  f"parts {r['parts_ms']}; codec {r['codec']['frames']} frames x {rows}: "
                  f"{r['codec']['ms_per_frame_row']} ms per frame-row ({r['codec']['audio_s_per_s']} audio-s/s)")
            if "ops" in r:
                print(r.pop("ops"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
