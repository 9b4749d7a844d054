"""The decode-attention kernel's launch settings swept at the book step's shapes: GPU time per call.

    python -m benchmarks.attention_tune --rows 256 --context 450

Two shapes: the talker's layer (one new token per row, every row at a position in [context, context + 50)) and
the code predictor's (its cache of num_code_groups + 1 positions, rows at the last ones; T = 2 for a frame's first
pass, 1 after). For each BLOCK_S x num_warps x num_stages the kernel (engines.runtime.attention.decode_attention)
is captured 20 times in one CUDA graph and replayed (benchmarks.graph_timing); the output is compared with the
default settings' (equal up to the online softmax's block order). Random values; the head shapes of both
real models (talker and predictor alike: 16 query heads, 8 key/value heads of 128, 16 code groups).
"""
from __future__ import annotations

import argparse
import itertools
import json

import torch

from benchmarks.graph_timing import per_call_us
from engines.runtime.attention import decode_attention


def case(n_heads, n_kv, d, rows, slots, t, positions, dtype, dev):
    g = torch.Generator(device="cpu").manual_seed(0)
    qkv = torch.randn(rows, t, (n_heads + 2 * n_kv) * d, generator=g).to(dev, dtype)
    kc = torch.randn(rows, n_kv, slots, d, generator=g).to(dev, dtype)
    vc = torch.randn(rows, n_kv, slots, d, generator=g).to(dev, dtype)
    pos = torch.tensor(positions, dtype=torch.long).view(rows, 1) + torch.arange(t)[None]
    pos = pos.to(dev)
    w = torch.ones(d, device=dev, dtype=dtype)
    ang = torch.arange(slots)[:, None] * torch.arange(d)[None] * 1e-3
    cos, sin = ang.cos().float().to(dev).contiguous(), ang.sin().float().to(dev).contiguous()
    return lambda launch: decode_attention(qkv, w, w, cos, sin, pos, kc, vc, n_heads, n_kv, 1e-6, launch=launch)


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--context", type=int, default=450)
    ap.add_argument("--blocks", default="16,32,64,128")
    ap.add_argument("--warps", default="1,2,4,8")
    ap.add_argument("--stages", default="1,2,3,4")
    ap.add_argument("--slots", default="",
                    help="also time the talker's case with caches of these many positions per row (comma list): the "
                         "cache's row and head strides, default context + 64")
    ap.add_argument("--json")
    args = ap.parse_args()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    t_heads, t_kv, t_d = p_heads, p_kv, p_d = 16, 8, 128
    groups = 16
    r = args.rows
    talker_pos = [args.context + (i * 37) % 50 for i in range(r)]  # as benchmarks.ab_step.advance places them
    cases = {
        "talker": case(t_heads, t_kv, t_d, r, args.context + 64, 1, talker_pos, dtype, dev),
        "predictor_t2": case(p_heads, p_kv, p_d, r, groups + 1, 2, [0] * r, dtype, dev),
        "predictor_t1": case(p_heads, p_kv, p_d, r, groups + 1, 1, [groups - 1] * r, dtype, dev),
    }
    out = {"strides": {}}
    for slots in [int(x) for x in args.slots.split(",") if x]:
        fn = case(t_heads, t_kv, t_d, r, slots, 1, talker_pos, dtype, dev)
        us = per_call_us(lambda i: fn(None), 20, 7)
        out["strides"][slots] = us
        print(f"talker, caches of {slots} positions per row: {us:.1f} us")
        del fn
        torch.cuda.empty_cache()
    for name, fn in cases.items():
        ref = fn(None).float()
        base = per_call_us(lambda i: fn(None), 20, 7)
        rows = []
        for bs, w, st in itertools.product(*(map(int, a.split(",")) for a in (args.blocks, args.warps, args.stages))):
            launch = {"BLOCK_S": bs, "num_warps": w, "num_stages": st}
            try:
                err = (fn(launch).float() - ref).abs().max().item()
                us = per_call_us(lambda i: fn(launch), 20, 7)
            except Exception as e:  # a setting the compiler refuses (shared memory, registers)
                print(f"{name} {launch}: {type(e).__name__}")
                continue
            rows.append({**launch, "us": us, "max_err": err})
        rows.sort(key=lambda x: x["us"])
        out[name] = {"default_us": base, "best": rows[:8]}
        print(f"== {name}: default {base:.1f} us; best:")
        for x in rows[:8]:
            print(f"   BLOCK_S {x['BLOCK_S']:4d} warps {x['num_warps']} stages {x['num_stages']}: {x['us']:7.1f} us "
                  f"(x{base / x['us']:.2f}), max diff {x['max_err']:.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
