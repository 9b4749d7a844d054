"""The step's draw alone: the Triton kernel (per digit width of its top-k search) against the torch form.

    python -m benchmarks.draw_kernel [--rows 1,256] [--vocab 2048,3072]

Random logits, the official defaults (sampling, temperature 0.9, top-k 50, top-p 1.0); each variant is
captured in a CUDA graph of 16 draws (a frame's worth) and replayed between events; median per draw.
"""
from __future__ import annotations

import argparse
import json
import torch

from benchmarks.graph_timing import per_call_us
from engines.model.sampling import SamplingTensors, draw
from engines.runtime.sampler import device_draw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,256")
    ap.add_argument("--vocab", default="2048,3072")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for b in map(int, args.rows.split(",")):
        for v in map(int, args.vocab.split(",")):
            x = torch.randn(b, v, device="cuda") * 3
            st = SamplingTensors(torch.ones(b, dtype=torch.bool, device="cuda"), torch.full((b,), 0.9, device="cuda"),
                                 torch.full((b,), 50, dtype=torch.long, device="cuda"), torch.ones(b, device="cuda"))
            seed = torch.arange(b, device="cuda")
            step = torch.zeros(b, dtype=torch.long, device="cuda")
            torch_us = per_call_us(lambda i: draw(x, st, seed, step * 16 + 1), 16, args.reps)
            row = {"rows": b, "vocab": v, "torch_us": torch_us}
            for digit in (1, 2, 4):  # 8: 468 us at one row on an H100 (256 counts per pass)
                row[f"kernel_d{digit}_us"] = per_call_us(lambda i: device_draw(x, st, seed, step, 1, digit), 16,
                                                        args.reps)
            rows.append(row)
            print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
