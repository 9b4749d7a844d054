"""One one-row decoder layer timed alone: the compiled torch form against the persistent layer kernel
(engines.runtime.layer_kernel), at the real shapes, each as 120 calls in one captured graph (median of
replays, per call; the calls cycle over enough copies of the weights that they come from memory, not L2),
across warps, block sizes and loading ahead of the barriers; plus the kernel's phases launched one by one and
the compiled layer's kernels (torch profiler, one weight copy: from L2).

    python -m benchmarks.layer_kernel --json out.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import torch

from benchmarks.graph_timing import per_call_us
from engines.model.config import DecoderStackConfig
from engines.model.layers import DecoderStack
from engines.runtime import layer_kernel
from engines.runtime.decode_step import StackWeights, make_layer

CALLS, REPS = 120, 20  # calls per captured graph, replays
SHAPES = {  # name: hidden, FFN, context (positions already in the cache)
    "predictor": (1024, 3072, 8),
    "talker-0.6b": (1024, 3072, 450),
    "talker-1.7b": (2048, 6144, 450),
}


def weights(hidden: int, inter: int) -> StackWeights:
    names = {f.name for f in dataclasses.fields(DecoderStackConfig)}
    kw = dict(hidden_size=hidden, num_hidden_layers=1, intermediate_size=inter, num_attention_heads=16,
              num_key_value_heads=8, head_dim=128, max_position_embeddings=2048)
    st = DecoderStack(DecoderStackConfig(**{k: v for k, v in kw.items() if k in names}))
    for p in st.parameters():
        p.data.normal_(0, 0.02)
    return StackWeights.of(st.to("cuda", torch.bfloat16), 2048)


def kernel_times(fn, calls: int = 10) -> list:
    """GPU time (us) of each kernel of one call run eagerly, in launch order, averaged over `calls` calls."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type.name == "CUDA" and "Memset" not in e.name]
    per = len(ev) // calls
    return [(ev[i].name[:40], round(sum(e.time_range.elapsed_us() for e in ev[i::per]) / calls, 1))
            for i in range(per)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--acc", default="16384")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    out = {"device": torch.cuda.get_device_name(), "rows": []}
    torch._dynamo.config.cache_size_limit = 64
    for name, (hid, inter, ctx) in SHAPES.items():
        w0 = weights(hid, inter)
        mb = sum(t.numel() * t.element_size() for t in w0.layers[0] if t is not None) / 1e6
        ws = [w0] + [weights(hid, inter) for _ in range(int(200 // mb))]  # > 50 MB of L2 apart
        kc = torch.randn(1, 8, 2048, 128, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        x = torch.randn(1, 1, hid, device="cuda", dtype=torch.bfloat16)
        pos = torch.tensor([[ctx]], device="cuda")
        torch_layer = torch.compile(make_layer(16, 8, 128, 1e-6, gemv=True, kernel=True), fullgraph=True)
        row = {"shape": name, "weights_mb": mb, "weight_copies": len(ws)}
        row["torch_us"] = per_call_us(lambda i: torch_layer(x, ws[i].layers[0], kc, vc, pos, w0.cos, w0.sin),
                                      CALLS, REPS, len(ws))
        counter = layer_kernel.new_counter(torch.device("cuda"))
        call = lambda i, split=False: layer_kernel.decoder_layer(  # noqa: E731
            x, ws[i].layers[0], kc, vc, pos, w0.cos, w0.sin, 16, 8, 1e-6, counter, split=split)
        for warps in (int(v) for v in args.warps.split(",")):
            for acc in (int(v) for v in args.acc.split(",")):
                layer_kernel.NUM_WARPS, layer_kernel.ACC_ELEMS = warps, acc
                for pre in (False, True):
                    layer_kernel.PRELOAD = pre
                    row[f"kernel_w{warps}_a{acc}{'_pre' if pre else ''}_us"] = per_call_us(call, CALLS, REPS, len(ws))
            row[f"split_w{warps}_us"] = per_call_us(lambda i: call(i, True), CALLS, REPS, len(ws))
        layer_kernel.NUM_WARPS, layer_kernel.ACC_ELEMS, layer_kernel.PRELOAD = 8, 16384, True
        row["split_phases_us"] = kernel_times(lambda: call(0, True))
        row["torch_kernels_us"] = kernel_times(lambda: torch_layer(x, w0.layers[0], kc, vc, pos, w0.cos, w0.sin))
        row["floor_us_at_3.35TBps"] = row["weights_mb"] / 3.35e6 * 1e6
        print(json.dumps(row), flush=True)
        out["rows"].append(row)
    if args.json:
        open(args.json, "w").write(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
