"""The talker's decode attention alone at a book step's shape: the one-program kernel and the split kernel, both
caches, launch settings swept; GPU time per call, the bandwidth it reaches, its error against the torch form.

    python -m benchmarks.attention_bench --rows 256,512 --context 450 --json attention.json

Each case: random keys and values (never zeros) in a cache of `--slots` positions per row laid out as the engine
lays it out (engines.model.kv_cache: an fp8 cache keeps its values with the positions contiguous; `fp8-vec`
is the layout before that, each vector contiguous), every row at a position in [context, context + 50) as
benchmarks.ab_step.advance places them, one new token. The call is captured 20 times in one CUDA graph and
replayed (benchmarks.graph_timing; median of the replays). Bytes: the keys and values each call must read (and
the fp8 scales), over its time. The split kernel's launch settings are swept at one split and the split counts
at the default launch; `--quick` times only the default settings.
"""
from __future__ import annotations

import argparse
import itertools
import json

import torch

from benchmarks.graph_timing import per_call_us
from engines.model import kv_cache
from engines.runtime import attention_split
from engines.runtime.attention import decode_attention, reference_attention
from engines.runtime.attention_split import split_attention

H, KV, D = 16, 8, 128


def make_case(rows: int, slots: int, context: int, cache: str, dev, seed: int = 0) -> dict:
    """Inputs of one talker attention call; cache: bf16, fp8 (values positions-contiguous) or fp8-vec."""
    g = torch.Generator(device=dev).manual_seed(seed)
    dt = torch.bfloat16
    qkv = torch.randn(rows, 1, (H + 2 * KV) * D, device=dev, generator=g).to(dt)
    w = (torch.rand(D, device=dev, generator=g) + 0.5).to(dt)
    ang = torch.arange(slots, device=dev)[:, None] * torch.arange(D, device=dev)[None] * 1e-3
    cos, sin = ang.cos().float().contiguous(), ang.sin().float().contiguous()
    pos = torch.tensor([context + (i * 37) % 50 for i in range(rows)], device=dev).view(rows, 1)
    k = torch.randn(rows, KV, slots, D, device=dev, generator=g).to(dt)
    v = torch.randn(rows, KV, slots, D, device=dev, generator=g).to(dt)
    tensors = {"k": k, "v": v, "ks": None, "vs": None}
    if cache != "bf16":
        (kq, ks), (vq, vs) = kv_cache.quantize(k), kv_cache.quantize(v)
        if cache == "fp8":
            vq = _positions_contiguous(vq)
        tensors = {"k": kq, "v": vq, "ks": ks, "vs": vs}
        del k, v
    per_pos = (1 if cache != "bf16" else 2) * D * 2 + (8 if cache != "bf16" else 0)  # K + V (+ scales) bytes
    read = float((pos.float() + 1).sum()) * KV * per_pos
    return {"args": (qkv, w, w, cos, sin, pos), "cache": tensors, "bytes": read, "kind": cache}


def _positions_contiguous(x):
    """A copy of x `[.., S, D]` stored `[.., D, S]` (an allocated fp8 cache's value layout)."""
    return x.transpose(-1, -2).clone(memory_format=torch.contiguous_format).transpose(-1, -2)


def call(case: dict, kernel: str, splits=None, launch=None):
    c = case["cache"]
    if kernel == "one":
        return decode_attention(*case["args"], c["k"], c["v"], H, KV, 1e-6, c["ks"], c["vs"], launch=launch)
    return split_attention(*case["args"], c["k"], c["v"], H, KV, 1e-6, c["ks"], c["vs"], splits=splits, launch=launch)


def error(case: dict, kernel: str, splits=None, launch=None) -> float:
    """Largest difference from the torch form over the same cache (copies), relative to the output's largest."""
    c = case["cache"]
    copy = lambda x: None if x is None else (_positions_contiguous(x)  # noqa: E731
                                             if x.dim() == 4 and x.stride(2) == 1 else x.clone())
    ref = reference_attention(*case["args"], copy(c["k"]), copy(c["v"]), H, KV, 1e-6, copy(c["ks"]), copy(c["vs"]))
    got = call({**case, "cache": {k: copy(x) for k, x in c.items()}}, kernel, splits, launch)
    ref = ref.float()
    return float((got.float() - ref).abs().max() / ref.abs().max())


def measure(case: dict, kernel: str, splits=None, launch=None) -> dict:
    row = {"cache": case["kind"], "kernel": kernel, "splits": splits, **(launch or {})}
    try:
        row["err"] = error(case, kernel, splits, launch)
        row["us"] = per_call_us(lambda i: call(case, kernel, splits, launch), 20, 5)
    except Exception as e:  # a setting the compiler refuses (shared memory, registers)
        row["failed"] = f"{type(e).__name__}: {str(e)[:200]}"
        return row
    row["tb_s"] = case["bytes"] / row["us"] / 1e6
    return row


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="256,512")
    ap.add_argument("--context", type=int, default=450)
    ap.add_argument("--slots", type=int, default=1024, help="cache positions per row (its row stride)")
    ap.add_argument("--caches", default="bf16,fp8,fp8-vec")
    ap.add_argument("--quick", action="store_true", help="default launch settings only")
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    out = {"device": torch.cuda.get_device_name(), "context": args.context, "slots": args.slots, "rows": {}}
    sweep = [] if args.quick else [dict(BLOCK_S=bs, num_warps=w, num_stages=st)
                                   for bs, w, st in itertools.product((32, 64, 128), (4, 8), (2, 3))]
    for rows in (int(r) for r in args.rows.split(",")):
        res = []
        for cache in args.caches.split(","):
            case = make_case(rows, args.slots, args.context, cache, dev)
            start = len(res)
            res.append(measure(case, "one"))
            rule = attention_split.splits_for(rows, KV, args.slots, dev)
            for n in sorted({1, 2, 4, rule}):
                res.append(measure(case, "split", n))
            if cache != "fp8-vec" and rows == 256:
                res += [measure(case, "split", 1, launch) for launch in sweep]
            for r in res[start:]:
                print(f"rows {rows} {json.dumps(r)}", flush=True)
            del case
            torch.cuda.empty_cache()
            out["rows"][rows] = res
            if args.json:  # after every cache kind: a run cut short keeps what it measured
                with open(args.json, "w") as f:
                    json.dump(out, f, indent=1)
    print("\n| rows | cache | kernel | splits | BLOCK_S/warps/stages | us per call | TB/s | max err (rel) |")
    print("|---|---|---|---|---|---|---|---|")
    for rows, res in out["rows"].items():
        for r in res:
            launch = "/".join(str(r[k]) for k in ("BLOCK_S", "num_warps", "num_stages") if k in r) or "default"
            if "failed" in r:
                print(f"| {rows} | {r['cache']} | {r['kernel']} | {r['splits']} | {launch} | "
                      f"failed: {r['failed'][:60]} | | |")
                continue
            print(f"| {rows} | {r['cache']} | {r['kernel']} | {r['splits']} | {launch} | {r['us']:.1f} | "
                  f"{r['tb_s']:.2f} | {r['err']:.1e} |")


if __name__ == "__main__":
    main()
