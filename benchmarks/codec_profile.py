"""Where the codec's GPU time goes, at the shapes the batch codec lane uses (real size, random weights).

    python -m benchmarks.codec_profile --rows 64 --frames 64 --json out.json

Reports, for one streaming call of `rows` x `frames` (what one batch-lane call decodes):
- stage times of the one-shot decode (quantizer + pre-conv, transformer, ConvNeXt upsampling, each
  decoder block, output), CUDA events around each stage;
- the whole streaming step (`stream_step`) eager, with cuDNN's benchmark mode, and the one-shot decode;
- per-conv shape micro benchmarks: conv1d on [B, C, T] vs conv2d on a channels-last view vs an
  explicit GEMM over shifted views, with and without cuDNN's benchmark mode;
- the top kernels of the eager streaming step (torch profiler).
Each figure is a median of CUDA-event timings after warm-up; us per frame-row = call time / (rows x frames).
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def median_ms(fn, reps: int = 10, warmup: int = 3) -> float:
    """Median of `reps` event-timed calls after `warmup` untimed ones (benchmarks.codec_gpu.time_calls)."""
    from benchmarks.codec_gpu import time_calls

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return statistics.median(time_calls(fn, torch.device("cuda"), reps, float("inf")))


def stage_times(dec, codes) -> dict:
    """One-shot decode split at its stages, each timed with events (ms)."""
    marks, names = [], []

    def mark(name):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        marks.append(e)
        names.append(name)

    def run():
        marks.clear(), names.clear()
        mark("start")
        x = dec.pre_conv(dec.quantizer(codes))
        mark("quantizer+pre_conv")
        x = dec.pre_transformer(x.transpose(1, 2)).transpose(1, 2)
        mark("transformer")
        for trans, block in dec.upsample:
            x = block(trans(x))
        mark("convnext_upsample")
        for i, m in enumerate(dec.decoder):
            x = m(x)
            mark(f"decoder[{i}]:{type(m).__name__}")
        return x

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    acc: dict = {}
    for _ in range(5):
        run()
        torch.cuda.synchronize()
        for i in range(1, len(marks)):
            acc.setdefault(names[i], []).append(marks[i - 1].elapsed_time(marks[i]))
    return {k: round(statistics.median(v), 3) for k, v in acc.items()}


def parity(dec) -> dict:
    """Max abs difference of the fast stack to the reference: streamed in ragged pieces (bf16 or the run's
    dtype, and a fp32 copy of the decoder with TF32 off), against each one's one-shot reference decode."""
    from benchmarks.codec_gpu import load_decoder
    from engines.codec.parity import ragged_parity
    from engines.codec.backend_torch import TorchCodec

    out = {}
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for name, d in (("run_dtype", dec), ("float32", load_decoder("real", "cuda", torch.float32))):
            out[name] = ragged_parity(lambda b, d=d: TorchCodec(d, b, fast=False),
                                      lambda b, d=d: TorchCodec(d, b, fast=True), d)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    return out


def conv_shapes(dec) -> list:
    """(C_in, C_out, kernel, dilation, samples per frame at that layer) of the decoder's big convs."""
    out, rate = [], 1
    for r in dec.config.upsampling_ratios:
        rate *= r
    c0 = dec.decoder[0].conv
    out.append((c0.in_channels, c0.out_channels, c0.kernel_size[0], 1, rate))
    for blk in dec.decoder[1:-2]:
        trans = blk.block[1]
        rate *= trans.stride
        for ru in blk.block[2:]:
            c = ru.conv1.conv
            out.append((c.in_channels, c.out_channels, c.kernel_size[0], c.dilation[0], rate))
    return out


def conv_micro(shapes, frames_rows: int, dtype) -> list:
    res = []
    for cin, cout, k, d, rate in shapes:
        t = frames_rows * rate
        # split into rows of at most 64 frames, as the lane does (B rows of T samples)
        b = max(1, frames_rows // 64)
        t = t // b
        x = torch.randn(b, cin, t + (k - 1) * d, device="cuda", dtype=dtype)
        w = torch.randn(cout, cin, k, device="cuda", dtype=dtype) * 0.05
        xl = x.transpose(1, 2).contiguous()  # [B, T, C]
        w2 = w[:, :, None, :].contiguous(memory_format=torch.channels_last)
        x4 = x[:, :, None, :].contiguous(memory_format=torch.channels_last)
        wk = w.permute(2, 1, 0).contiguous()  # [k, Cin, Cout]

        def gemm():
            acc = torch.matmul(xl[:, 0:t], wk[0])
            for j in range(1, k):
                acc += torch.matmul(xl[:, j * d:j * d + t], wk[j])
            return acc

        def unfold():
            cols = torch.cat([xl[:, j * d:j * d + t] for j in range(k)], dim=-1)  # [B, T, k*C]
            return torch.matmul(cols, wk.reshape(k * cin, cout))

        row = {"cin": cin, "cout": cout, "k": k, "dil": d, "samples": b * t}
        gmac = b * t * cin * cout * k / 1e9
        for bench in (False, True):
            torch.backends.cudnn.benchmark = bench
            tag = "bench" if bench else "heur"
            row[f"conv1d_{tag}"] = median_ms(lambda: F.conv1d(x, w, dilation=d))
            row[f"conv2d_cl_{tag}"] = median_ms(lambda: F.conv2d(x4, w2, dilation=(1, d)))
        torch.backends.cudnn.benchmark = False
        row["gemm_shifted"] = median_ms(gemm)
        row["gemm_unfold"] = median_ms(unfold)
        best = min(v for kk, v in row.items() if isinstance(v, float))
        row["tflops_best"] = round(2 * gmac / best, 1)
        res.append({kk: (round(v, 4) if isinstance(v, float) else v) for kk, v in row.items()})
        print(json.dumps(res[-1]), flush=True)
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--json")
    ap.add_argument("--micro", action="store_true", help="also the per-conv-shape micro benchmarks")
    ap.add_argument("--profile-reference", action="store_true", help="also the reference step's top kernels")
    args = ap.parse_args(argv)
    from benchmarks.codec_gpu import load_decoder
    from engines.codec.fast import FastStack
    from engines.codec.streaming import StreamingCodecDecoder, stream_step

    dtype = getattr(torch, args.dtype)
    dec = load_decoder("real", "cuda", dtype)
    r, n = args.rows, args.frames
    fr = r * n
    codes = torch.randint(0, 2048, (r, 16, n), device="cuda")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": r, "frames": n,
           "dtype": args.dtype}
    with torch.inference_mode():
        out["stages_ms"] = stage_times(dec, codes)
        print(json.dumps(out["stages_ms"]), flush=True)
        out["parity"] = parity(dec)
        print(json.dumps(out["parity"]), flush=True)
        sd = StreamingCodecDecoder(dec, r)
        bufs, pos = sd.rows(r)
        nv = torch.full((r,), n, dtype=torch.long, device="cuda")
        steps = {"stream_reference": lambda: stream_step(dec, codes, nv, pos, bufs),
                 "stream_fast": lambda: stream_step(dec, codes, nv, pos, bufs, fast=True),
                 "oneshot_reference": lambda: dec(codes), "oneshot_fast": lambda: dec(codes, fast=True)}
        whole = {k: median_ms(fn) for k, fn in steps.items()}
        dec.__dict__["_fast"] = FastStack(dec, polyphase=False)
        whole["stream_fast_dilated"] = median_ms(steps["stream_fast"])
        dec.__dict__["_fast"] = FastStack(dec)
        out["whole_ms"] = {k: round(v, 3) for k, v in whole.items()}
        out["whole_us_per_frame_row"] = {k: round(1e3 * v / fr, 2) for k, v in whole.items()}
        out["speedup_fast_vs_reference"] = round(whole["stream_reference"] / whole["stream_fast"], 2)
        out["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        print(json.dumps(out["whole_us_per_frame_row"]), flush=True)
        from torch.profiler import ProfilerActivity, profile

        for name in ("stream_fast",) + (("stream_reference",) if args.profile_reference else ()):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                steps[name]()
                torch.cuda.synchronize()
            tab = prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=70)
            out[f"top_kernels_{name}"] = tab
            print(name, tab, flush=True)
        if args.micro:
            out["conv_micro"] = conv_micro(conv_shapes(dec), fr, dtype)
        print(f"codec call {r} rows x {n} frames, {args.dtype}: us per frame-row "
              + ", ".join(f"{k} {v}" for k, v in out["whole_us_per_frame_row"].items())
              + f"; fast = x{out['speedup_fast_vs_reference']} of the reference stream step", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
