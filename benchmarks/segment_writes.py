"""How fast the queue worker stores finished segments: FLAC (24-bit) encoding and durable writes of book
segments, one after another (as the worker did) against at once on its writer threads (`jobs.worker_results.
_write_ahead`, WRITER_THREADS). What a book on fast accelerators needs: 2,000 audio-s/s of synthesis is ~190
segments of 10.5 s every second, each encoded and fsynced before the worker records it.

    python -m benchmarks.segment_writes --segments 256 --seconds 10.5 --reps 3

Audio: speech-like random signal (filtered noise under a slow envelope), 24 kHz; files in a temp folder on the
disk of --dir (default: the temp dir). Reported: audio seconds stored per wall second, serial and pooled, the ratio.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from jobs.assemble import write_segment_audio
from jobs.worker_results import WRITER_THREADS

SR = 24000


def speech_like(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(seconds * SR)
    env = 0.5 + 0.5 * np.sin(np.arange(n) / SR * 2 * np.pi * 3.0)
    return (np.convolve(rng.standard_normal(n), np.hanning(40), mode="same") * 0.02 * env).astype(np.float32)


def run(segs: list, folder: Path, threads: int) -> float:
    """Seconds to store every segment (threads 1: one after another in this thread)."""
    t0 = time.perf_counter()
    if threads == 1:
        for i, a in enumerate(segs):
            write_segment_audio(folder / f"{i}.flac", a, SR)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda ia: write_segment_audio(folder / f"{ia[0]}.flac", ia[1], SR), enumerate(segs)))
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--segments", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=10.5, help="audio per segment")
    ap.add_argument("--threads", type=int, default=WRITER_THREADS, help="writer threads (the worker's by default)")
    ap.add_argument("--reps", type=int, default=3, help="alternating repetitions of each")
    ap.add_argument("--dir", default=None, help="where the files go (a temp folder inside it)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    segs = [speech_like(args.seconds, i) for i in range(args.segments)]
    audio = args.segments * args.seconds
    rates: dict = {1: [], args.threads: []}
    for _ in range(args.reps):
        for threads in rates:
            with tempfile.TemporaryDirectory(dir=args.dir) as d:
                rates[threads].append(audio / run(segs, Path(d), threads))
    res = {"segments": args.segments, "seconds": args.seconds, "threads": args.threads,
           "serial_audio_s_per_s": [round(r, 1) for r in rates[1]],
           "pooled_audio_s_per_s": [round(r, 1) for r in rates[args.threads]],
           "ratio": round(statistics.median(rates[args.threads]) / statistics.median(rates[1]), 2)}
    print(json.dumps(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
