"""Single-stream speed on the CPU with random weights of a real shape (codec included).

    python -m benchmarks.cpu_single --dummy 0.6b --threads 2 --frames 12
"""
from __future__ import annotations

import argparse
import time

import torch

from benchmarks.bench import request
from benchmarks.dummy_engine import dummy_engine
from engines.runtime.runner import EngineRunner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dummy", choices=["0.6b", "1.7b"], default="0.6b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frames", type=int, default=12)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for dt in args.dtypes.split(","):
        runner = EngineRunner(dummy_engine(args.dummy, "cpu", dt), max_slots=1, max_context=256)
        runner.synthesize([request(2, 0)])  # warm-up
        t0 = time.perf_counter()
        [res] = runner.synthesize([request(args.frames, 1)])
        wall = time.perf_counter() - t0
        audio = len(res.audio) / res.sample_rate
        print(f"{args.dummy} {dt} {args.threads} threads: {audio:.2f} s of audio in {wall:.1f} s = "
              f"{audio / wall:.3f}x realtime")


if __name__ == "__main__":
    main()
