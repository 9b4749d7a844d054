"""The codec lanes' bf16 decoder (runtime.codec_dtype: bfloat16, auto on a CPU with bf16 dot instructions)
against the fp32 decoder it is copied from: speed and how far the audio moves, on the released codec shape.

    python -m benchmarks.codec_bf16                    # 2 threads, 3 requests of 48 frames
    python -m benchmarks.codec_bf16 --threads 1 --frames 96 --rows 4

Random weights (benchmarks.codec_cpu.random_decoder: the released shape, well-scaled), random codes; each of
`--rows` rows decoded in one pass by both decoders (engines.codec.dtype.lane_decoder makes the bf16 copy, as
the runner does). Reported: the signal-to-error ratio of the bf16 audio against fp32's (dB, over all rows), and
the wall time of one batched call of each (median of `--reps`), its ratio.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from benchmarks.codec_cpu import random_decoder
from engines.codec.dtype import bf16_reason, lane_decoder
from engines.codec.parity import random_codes, snr_db
from engines.device.detect import cpu_name


def _timed(dec, codes: torch.Tensor, reps: int) -> tuple[float, np.ndarray]:
    times, out = [], None
    with torch.inference_mode():
        dec(codes[:, :, :2])  # warm-up (oneDNN picks its kernels)
        for _ in range(reps):
            t0 = time.perf_counter()
            out = dec(codes)
            times.append(time.perf_counter() - t0)
    return statistics.median(times), out.float().numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frames", type=int, default=48)
    ap.add_argument("--rows", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fp32 = random_decoder()
    bf16 = lane_decoder(fp32, "bfloat16")
    codes = random_codes(fp32, args.rows, args.frames)
    t32, a32 = _timed(fp32, codes, args.reps)
    t16, a16 = _timed(bf16, codes, args.reps)
    snr = snr_db(a32, a16)
    print(f"{cpu_name()}, {args.threads} threads, torch {torch.__version__}; bf16 on this CPU: "
          f"{bf16_reason('cpu') or 'native bf16 dot instructions'}")
    print(f"{args.rows} rows x {args.frames} frames in one call: fp32 {t32 * 1000:.0f} ms, bf16 {t16 * 1000:.0f} ms "
          f"(x{t32 / t16:.2f}); bf16 audio against fp32: {snr:.1f} dB")


if __name__ == "__main__":
    main()
