"""Single-stream speed on the CPU with random weights of a real shape (codec included).

    python -m benchmarks.cpu_single --dummy 0.6b --threads 2 --frames 12
    python -m benchmarks.cpu_single --dummy 0.6b --threads 2 --frames 24 --dtypes float32 --linear model,int8 --reps 3
    # as the daemon runs it on 2 cores (model.threads auto, appliance.settings.cpu_split): the loop on 1 thread
    # (2 while no codec call runs), the codec off the loop's thread, a call's rows split over 2 threads
    python -m benchmarks.cpu_single --dummy 0.6b --threads 1 --codec-threads 2 --idle-threads 2 --frames 24 \
        --dtypes float32 --reps 3

One stream as an app meets it: the request is submitted as a stream (priority 0) to a started runner (its loop in
its own thread) and its chunks are read as they come. Reported per run: time to first audio (submit -> first
chunk) and x realtime (audio seconds / wall seconds, submit -> last chunk); medians over `--reps` runs after
a warm-up request (start-up apart). `--linear`: runtime.linear values to compare (model, int8) in one process;
`--codec-threads` N > 0: the codec lanes off the loop's thread, a call's rows split over N threads (runtime
cpu_codec_threads); `--idle-threads`: the loop's torch threads while no codec call runs (runtime
cpu_idle_threads); appliance.settings.cpu_split gives the daemon's CPU engine both.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.bench import request
from benchmarks.dummy_engine import dummy_engine
from engines.device.threads import in_passing_thread
from engines.runtime.runner import EngineRunner


def one_stream(runner: EngineRunner, frames: int, seed: int) -> tuple[float, float]:
    """(seconds to the first chunk, x realtime) of one stream."""
    t0 = time.perf_counter()
    handle = runner.submit(request(frames, seed), priority=0)
    first, samples = None, 0
    for chunk in handle:
        if first is None:
            first = time.perf_counter() - t0
        samples += len(chunk)
    wall = time.perf_counter() - t0
    return first, samples / runner.sample_rate / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dummy", choices=["0.6b", "1.7b"], default="0.6b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frames", type=int, default=12)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--linear", default="model", help="comma list of runtime.linear values: model, int8")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--codec-threads", type=int, default=0, help="the codec on its own thread(s) (0: in the loop's)")
    ap.add_argument("--idle-threads", type=int, default=0, help="the loop's threads while no codec call runs (0: --threads)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for dt in args.dtypes.split(","):
        eng = in_passing_thread(dummy_engine, args.dummy, "cpu", dt)  # (its torch threads end with it)
        for linear in args.linear.split(","):
            t0 = time.perf_counter()
            runner = in_passing_thread(EngineRunner, eng, max_slots=1, max_context=256, linear=linear,
                                       cpu_codec_threads=args.codec_threads, cpu_idle_threads=args.idle_threads)
            runner.start()
            one_stream(runner, 2, 0)  # warm-up
            startup = time.perf_counter() - t0
            runs = [one_stream(runner, args.frames, 1 + i) for i in range(args.reps)]
            runner.stop()
            ttfa, speed = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            print(f"{args.dummy} {dt} linear {linear}, {args.threads} threads ({args.idle_threads or args.threads} "
                  f"while the codec idles), codec threads {args.codec_threads}, "
                  f"{args.frames} frames: "
                  f"{speed:.3f}x realtime, first audio {ttfa:.2f} s (medians of {args.reps}; "
                  f"each {', '.join(f'{s:.3f}x/{f:.2f} s' for f, s in runs)}; start-up {startup:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
