"""A/B of a CPU stream's waited codec calls: in the loop's thread (CodecLane.inline, the default) or on the lane's
worker thread while the loop waits (the form before), one stream at a time, alternating, same engine.

    python -m benchmarks.stream_inline --frames 96 --reps 3

One engine, loaded with the daemon's settings for this machine (appliance.settings.engine_spec: model.threads
auto, runtime.linear auto) on the random-weight 0.6B checkpoint in the official layout; the switch
(`lanes["stream"].inline`) alternates between runs of that one runner (a second runner in the same process would
keep torch threads of its own and slow the first: docs/PERFORMANCE.md, "Issue 46, third round"). Per run: x
realtime (submit -> last chunk), first audio, and the loop's own counters: seconds in decode steps and seconds
waiting for the codec (inside the loop's codec phase), and how many calls ran inline.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

from benchmarks.bench import request
from benchmarks.cpu_single import one_stream


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=96)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    from appliance.config import Config, merge
    from appliance.settings import engine_spec
    from benchmarks.load.daemon import write_dummy
    from engines.load import load_runner

    with tempfile.TemporaryDirectory(prefix="stream-inline-") as tmp:
        ckpt = Path(tmp) / "dummy-0.6b"
        write_dummy("0.6b", ckpt, "cpu", "bfloat16", seed=0)
        cfg = merge(Config(), {"model": {"path": str(ckpt), "device": "cpu", "dtype": "float32"},
                               "runtime": {"max_slots": 1, "max_context": 512}}, "benchmarks.stream_inline")
        runner = load_runner(replace(engine_spec(cfg, "cpu"), prepare=False))
        runner.start()
        runner.synthesize([request(2, 0)], priority=0)  # warm-up
        lane = runner.lanes["stream"]
        speeds: dict = {"inline": [], "worker": []}
        for rep in range(args.reps):
            for name in speeds:
                lane.inline = name == "inline"
                s0 = runner.stats()
                first, speed = one_stream(runner, args.frames, rep)
                s1 = runner.stats()
                speeds[name].append(speed)
                d = {k: s1["loop_s"][k] - s0["loop_s"][k] for k in ("decode_launch", "codec_wait")}
                print(f"{name}: {speed:.3f}x realtime, first audio {first:.2f} s, decode "
                      f"{d['decode_launch']:.2f} s, codec wait {d['codec_wait']:.2f} s, inline calls "
                      f"{s1['codec_inline_calls'] - s0['codec_inline_calls']}", flush=True)
        runner.stop()
    for name, v in speeds.items():
        print(f"{name}: median {statistics.median(v):.3f}x realtime over {len(v)} runs of {args.frames} frames")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
