"""A/B of a CPU stream's waited codec calls: in the loop's thread (CodecLane.inline, the default) or on the lane's
worker thread while the loop waits (the form before), one stream at a time, alternating, same engine.

    python -m benchmarks.stream_inline --frames 96 --reps 3

The engine is loaded as benchmarks.peer_cpu loads it (the daemon's settings for this machine: model.threads
auto, runtime.linear auto) on the random-weight 0.6B checkpoint in the official layout. Per run: x realtime
(submit -> last chunk), first audio, and the loop's own counters: seconds in decode steps and seconds waiting for
the codec (inside the loop's codec phase), and how many calls ran inline.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
from pathlib import Path

from benchmarks import peer_cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=96)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    from benchmarks.load.daemon import write_dummy
    from engines.runtime.runner import EngineRunner

    with tempfile.TemporaryDirectory(prefix="stream-inline-") as tmp:
        ckpt = Path(tmp) / "dummy-0.6b"
        write_dummy("0.6b", ckpt, "cpu", "bfloat16", seed=0)
        inline = peer_cpu.our_runners(ckpt, ["auto"])["auto"]
        worker = EngineRunner(inline.engine, inline.cfg)
        worker.lanes["stream"].inline = False
        worker.start()
        worker.synthesize([peer_cpu.request(2, 0)], priority=0)  # warm-up
        runners = {"inline": inline, "worker": worker}
        speeds: dict = {k: [] for k in runners}
        for rep in range(args.reps):
            for name, r in runners.items():
                s0 = r.stats()
                out = peer_cpu.our_run(r, args.frames, rep)
                s1 = r.stats()
                speeds[name].append(out["x_realtime"])
                d = {k: s1["loop_s"][k] - s0["loop_s"][k] for k in ("decode_launch", "codec_wait")}
                print(f"{name}: {out['x_realtime']:.3f}x realtime, first audio {out['first_audio_s']:.2f} s, decode "
                      f"{d['decode_launch']:.2f} s, codec wait {d['codec_wait']:.2f} s, inline calls "
                      f"{s1['codec_inline_calls'] - s0['codec_inline_calls']}", flush=True)
        for r in runners.values():
            r.stop()
    for name, v in speeds.items():
        print(f"{name}: median {statistics.median(v):.3f}x realtime over {len(v)} runs of {args.frames} frames")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
