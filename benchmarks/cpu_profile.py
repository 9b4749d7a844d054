"""Where a CPU decode step's time goes, by part, at a few row counts and thread counts (codec too).

    python -m benchmarks.cpu_profile --dummy 0.6b --threads 1,2 --rows 1,2,8,16,32 --reps 3
    python -m benchmarks.cpu_profile --dummy 0.6b --threads 2 --rows 16 --linear int8 --ops
    python -m benchmarks.cpu_profile --dummy 0.6b --threads 1 --rows 1,37 --linear model,fp16 --reps 5  # A/B

For each (threads, rows): the rows are admitted (prefill not timed), then `--reps` decode steps run eagerly as
the loop runs them; each part of the step (engines.runtime.decode_step.FastStep) is timed by wrapping it:
the talker's 28 layers, the predictor's 15 passes of 5 layers, the heads (codebook 0 and the 15 predictor
heads, draws excluded), the draws (sampling), and the glue (first input, embeddings, next input, final norm).
Medians over the steps, in ms per step and per frame-row (and the process's CPU time per step: a loaded
machine's waits left out). `--linear` with several formats runs one runner of each and interleaves their steps. Then the batch codec lane: one call of `rows` rows
x `--codec-frames` frames (median of `--reps`), as audio-seconds decoded per wall second.
`--ops`: torch profiler table of one step (CPU ops by self time: the per-op overheads at few rows).
Random weights of the real shape; timings depend on shapes, not on the values.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections import defaultdict

import torch

from benchmarks.ab_step import drain, fill
from benchmarks.dummy_engine import dummy_engine
from engines.device.detect import cpu_name
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


class Rows:
    """A runner of one runtime.linear format with `rows` rows admitted, its step's parts timed."""

    def __init__(self, eng, rows: int, linear: str):
        self.runner = EngineRunner(eng, max_slots=rows, max_context=512, linear=linear)
        self.handles = fill(self.runner, rows, 400)
        self.fast, self.m = self.runner.model.fast, self.runner.model
        self.timer = PartTimer()
        for attr, part in PARTS.items():
            setattr(self.fast, attr, self.timer.wrap(part, getattr(self.fast, attr)))
        self.b, self.length = self.m.bucket(self.runner.slots.seqs, rows)
        self.cap = self.m.k_cap(self.runner.slots.seqs, self.b)
        self.rows, self.walls, self.cpus, self.parts = rows, [], [], defaultdict(list)

    @torch.no_grad()
    def step(self, timed: bool = True) -> None:
        self.timer.acc.clear()
        t0, c0 = time.perf_counter(), time.process_time()
        self.m.run_step(self.b, self.length, self.cap)
        if timed:
            self.walls.append(time.perf_counter() - t0)
            self.cpus.append(time.process_time() - c0)
            for p, v in self.timer.acc.items():
                self.parts[p].append(v)

    def result(self) -> dict:
        wall = statistics.median(self.walls)
        return {"rows": self.rows, "step_ms": round(wall * 1e3, 1), "ms_per_frame_row": round(wall * 1e3 / self.rows, 1),
                "cpu_ms": round(statistics.median(self.cpus) * 1e3, 1), "frames_per_s": round(self.rows / wall, 2),
                "parts_ms": {p: round(statistics.median(v) * 1e3, 1) for p, v in sorted(self.parts.items())}}

    @torch.no_grad()
    def ops(self) -> str:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            self.m.run_step(self.b, self.length, self.cap)
        return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)

    def codec(self, reps: int, codec_frames: int) -> dict:
        drain(self.runner, self.handles)
        lane = self.runner.lanes["batch"]
        n = min(codec_frames, lane.chunk_cap(self.rows))
        lane.bench_call(self.rows, n)  # warm-up
        ts = []
        for _ in range(max(1, reps)):
            t0 = time.perf_counter()
            lane.bench_call(self.rows, n)
            ts.append(time.perf_counter() - t0)
        audio = self.rows * n / 12.5
        return {"frames": n, "call_s": round(statistics.median(ts), 3),
                "audio_s_per_s": round(audio / statistics.median(ts), 2),
                "ms_per_frame_row": round(statistics.median(ts) * 1e3 / (self.rows * n), 1)}

    def close(self) -> None:
        self.runner.stop()
        del self.runner, self.handles, self.fast, self.m
        gc.collect()  # the runner's caches (reference cycles) before the next one is built


def profile_rows(eng, rows: int, reps: int, codec_frames: int, ops: bool, linears: list) -> list:
    """Each runtime.linear format of `linears` at `rows` rows, their steps interleaved (A/B in one run)."""
    runs = [Rows(eng, rows, linear) for linear in linears]
    for r in runs:
        r.step(timed=False)  # warm-up
    for _ in range(reps):
        for r in runs:
            r.step()
    out = []
    for linear, r in zip(linears, runs):
        res = r.result() | {"linear": linear, "format": r.m.linear}
        if ops:
            res["ops"] = r.ops()
        res["codec"] = r.codec(reps, codec_frames)
        r.close()
        out.append(res)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dummy", choices=["0.6b", "1.7b"], default="0.6b")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rows", default="1,2,8,16,32")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--codec-frames", type=int, default=16)
    ap.add_argument("--linear", default="model", help="runtime.linear values, comma list (model, fp16, int8, auto): "
                                                      "their steps interleaved")
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
            for r in profile_rows(eng, rows, args.reps, args.codec_frames, args.ops, args.linear.split(",")):
                r["threads"] = threads
                res["runs"].append(r)
                print(f"threads {threads} rows {rows:3d} linear {r['linear']} ({r['format']}): step {r['step_ms']:8.1f} "
                      f"ms (cpu {r['cpu_ms']:.1f} ms) = {r['ms_per_frame_row']:6.1f} ms per frame-row "
                      f"({r['frames_per_s']:.2f} frames/s = {r['frames_per_s'] / 12.5:.3f} audio-s/s); "
                      f"parts {r['parts_ms']}; codec {r['codec']['frames']} frames x {rows}: "
                      f"{r['codec']['ms_per_frame_row']} ms per frame-row ({r['codec']['audio_s_per_s']} audio-s/s)",
                      flush=True)
                if "ops" in r:
                    print(r.pop("ops"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
