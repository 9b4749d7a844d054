"""One code-predictor pass's projections (5 layers of the 0.6B: fused qkv, o, fused gate/up, down; ~75 M weights) in
each CPU weight format, one row, as a stream's step multiplies them 15 times a frame.

    python -m benchmarks.cpu_linear_formats --threads 2 --reps 3

Rows: `fp16` (runtime.linear fp16, fbgemm), `int8 W8A8` and `int8 W8A16` (engines.runtime.int8.Int8Weight with
8- and 16-bit activations: the format with its per-row normalisation), `int8 kernel alone` (torch's
quantized.linear_dynamic on the same packed weights without that normalisation: what the bytes allow), and
`int8pack bf16` (torch's `_weight_int8pack_mm` with bf16 activations; with fp32 activations it has no vector path
on x86). ms per pass (median of `--reps` timings of `--n` passes); random weights (timings depend on shapes).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from engines.device.detect import cpu_name
from engines.runtime.int8 import Int8Weight, per_channel, unavailable_reason as int8_unavailable
from engines.runtime.linears import Fp16Weight, unavailable_reason

SHAPES = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)] * 5  # [out, in] per layer, 5 layers


def passes(ws: list, xs: dict):
    def run():
        for w, (_, k) in zip(ws, SHAPES):
            w(xs[k])
    return run


def timed(fn, n: int, reps: int) -> float:
    for _ in range(3):
        fn()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t) / n * 1e3)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n", type=int, default=30, help="passes per timing")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ws = [torch.randn(o, i) * 0.02 for o, i in SHAPES]
    xs = {k: torch.randn(1, k) for k in (1024, 2048, 3072)}
    rows = {}
    if unavailable_reason("fp16", "cpu") is None:
        rows["fp16"] = passes([Fp16Weight(w) for w in ws], xs)
    if int8_unavailable("cpu") is None:
        i8 = [Int8Weight(w) for w in ws]
        rows["int8 W8A8"] = passes(i8, xs)
        try:
            rows["int8 W8A16"] = passes([Int8Weight(w, act_bits=16) for w in ws], xs)
        except ValueError as exc:  # (no VNNI)
            print(f"int8 W8A16: {exc}")
        raw = [lambda x, w=w: torch.ops.quantized.linear_dynamic(x, w.packed, w.reduce_range) for w in i8]
        rows["int8 kernel alone"] = passes(raw, xs)
    packed = []
    for w in ws:
        q, scale = per_channel(w)  # (the int8 format's own rounding)
        packed.append(lambda x, q=q, s=scale.bfloat16(): torch.ops.aten._weight_int8pack_mm(x.bfloat16(), q, s))
    rows["int8pack bf16"] = passes(packed, xs)
    print(f"{cpu_name()}, {args.threads} threads, torch {torch.__version__}: one predictor pass (~75 M weights), 1 row")
    print("| format | ms per pass |\n|---|---|")
    for name, fn in rows.items():
        print(f"| {name} | {timed(fn, args.n, args.reps):.2f} |")


if __name__ == "__main__":
    main()
