"""Streaming codec speed: eager vs device graph vs torch.compile (+ graph), per batch and chunk size.

    python -m benchmarks.codec_gpu --json codec_gpu.json --md codec_gpu.md            # CUDA, real size
    python -m benchmarks.codec_gpu --device cpu --codec tiny --batches 1,2 --chunks 1,4 \\
        --dtypes float32 --modes eager,compiled --reps 3                              # CPU smoke run

`--codec real` (default) is the real-size Qwen3-TTS-Tokenizer-12Hz decoder with RANDOM weights
(benchmarks.codec_cpu.random_decoder: speed depends on shapes, not values); `tiny` is the
test fixture; a folder loads that speech_tokenizer. Every measurement pushes `chunk` frames on
`batch` streams of `TorchCodec` (the backend the runtime's CodecStreams uses), continuing the same
streams from call to call, as the runtime does. Modes:

    eager            TorchCodec.push as is
    graph            TorchCodec.push captured once in a device graph (CUDA graph), then replayed
    compiled         the torch.compile'd step (engines.codec.backend_compiled), no graph
    compiled-graph   the compiled step captured in a CUDA graph (what the runtime does with
                     codec backend "torch-compiled" on a GPU)

Per (dtype, mode, batch, chunk): median ms per call (device-synchronised) and audio-seconds
decoded per second (batch * chunk * 0.08 s / call time). Also recorded: compile time, the max abs
difference of the compiled codec to eager on the same device and dtype (ragged streaming schedule),
the device name, torch / CUDA versions and the TF32 settings. On the CPU "graph" modes replay by
re-running the function (no CUDA graphs), so only eager and compiled are meaningful there.
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

log = logging.getLogger("benchmarks.codec_gpu")
MODES = ("eager", "graph", "compiled", "compiled-graph")
SAMPLE_RATE = 24000
TINY = Path(__file__).resolve().parents[1] / "tests" / "data" / "tiny"


def tiny_codec_dir() -> Path:
    """The tiny test codec, where tests/fixtures/build_fixtures.py writes it (shared by the tiny checkpoints)."""
    d = TINY / "codec"
    if not (d / "model.safetensors").is_file():
        raise SystemExit(f"no tiny codec under {TINY} (build the test fixtures first)")
    return d


def load_decoder(which: str, device: str, dtype: torch.dtype):
    from benchmarks.codec_cpu import random_decoder
    from engines.codec.decoder import load_codec_decoder

    if which == "real":
        dec = random_decoder().to(device=device, dtype=dtype)
        dec.pre_transformer.inv_freq = dec.pre_transformer.rope_inv_freq(torch.device(device))  # keep fp32
        return dec
    return load_codec_decoder(tiny_codec_dir() if which == "tiny" else which, device, dtype)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn, device: torch.device, reps: int, max_seconds: float) -> list[float]:
    """Milliseconds per call of fn (synchronised), `reps` calls or fewer past `max_seconds` (>= 3)."""
    out, t_end = [], time.perf_counter() + max_seconds
    for i in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            out.append(1e3 * (time.perf_counter() - t))
        if i >= 2 and time.perf_counter() > t_end:
            break
    return out


def measure(dec, mode: str, batch: int, chunk: int, reps: int, warmup: int, max_seconds: float,
            cache_dir: str | None) -> dict:
    """One (mode, batch, chunk) point on fresh streams."""
    from engines.codec.backend_torch import TorchCodec
    from engines.device.graphs import make_graph

    device = next(dec.parameters()).device
    codec = TorchCodec(dec, batch, compile=mode.startswith("compiled"), cache_dir=cache_dir)
    g = torch.Generator().manual_seed(batch * 1000 + chunk)
    codes = torch.randint(0, dec.config.codebook_size, (batch, dec.config.num_quantizers, chunk), generator=g)
    codes_in = codes.to(device)
    valid_in = torch.full((batch,), chunk, dtype=torch.long, device=device)
    fn = lambda: codec.push(codes_in, valid_in)  # noqa: E731
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(warmup):  # compile / autotune / allocate before any capture
            fn()
        sync(device)
        row = {"mode": mode, "batch": batch, "chunk": chunk}
        if mode.endswith("graph"):
            graph = make_graph(device)
            graph.capture(fn, warmup=1)
            sync(device)
            row["graph"] = graph.kind
            run = graph.replay
        else:
            run = fn
        row["setup_s"] = round(time.perf_counter() - t0, 2)
        if codec.fallback_reason:
            row["fallback"] = codec.fallback_reason
        times = time_calls(run, device, reps, max_seconds)
    ms = statistics.median(times)
    audio = batch * chunk * dec.samples_per_frame / SAMPLE_RATE
    row.update({"ms_per_call": round(ms, 3), "ms_best": round(min(times), 3), "calls": len(times),
                "audio_s_per_s": round(audio / (ms / 1e3), 2), "backend": codec.name})
    return row


def compiled_parity(dec, cache_dir: str | None) -> float:
    from engines.codec.backend_torch import TorchCodec
    from engines.codec.parity import ragged_parity

    return ragged_parity(lambda b: TorchCodec(dec, b), lambda b: TorchCodec(dec, b, compile=True, cache_dir=cache_dir),
                         dec)


def env_info(device: torch.device) -> dict:
    info = {"device": str(device), "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "host": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32, "threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
        info["capability"] = "%d.%d" % torch.cuda.get_device_capability(device)
    else:
        from engines.device.detect import cpu_name

        info["device_name"] = f"{cpu_name()} ({os.cpu_count()} cores)"
    return info


def markdown(res: dict) -> str:
    """One table per dtype: ms per call and audio-s/s per mode, speed-up of the best mode over eager."""
    rows, modes = res["results"], [m for m in MODES if any(r["mode"] == m for r in res["results"])]
    env = res["env"]
    lines = [f"# Streaming codec: {', '.join(modes)}", "",
             f"{env['device_name']}, torch {env['torch']}" + (f" + CUDA {env['cuda']}" if env["cuda"] else "")
             + f", codec {res['codec']} ({res['params_m']} M params), {env['date']}. "
             f"cuDNN TF32 {env['cudnn_allow_tf32']}, matmul TF32 {env['matmul_allow_tf32']}.", ""]
    for dt in res["dtypes"]:
        info = res["compile"].get(dt, {})
        if info:
            lines.append(f"{dt}: compile {info.get('compile_s')} s, compiled vs eager max abs "
                         f"{info.get('parity_max_abs', float('nan')):.3g}" + (f", FELL BACK: {info['fallback']}"
                                                                              if info.get("fallback") else ""))
            lines.append("")
        lines.append(f"| {dt} batch | chunk | " + " | ".join(f"{m} ms" for m in modes) + " | "
                     + " | ".join(f"{m} audio-s/s" for m in modes) + " | best vs eager |")
        lines.append("|" + "---|" * (2 + 2 * len(modes) + 1))
        for b in res["batches"]:
            for c in res["chunks"]:
                pts = {r["mode"]: r for r in rows if r["dtype"] == dt and r["batch"] == b and r["chunk"] == c}
                if not pts:
                    continue
                ms = [f"{pts[m]['ms_per_call']:.2f}" if m in pts else "-" for m in modes]
                sp = [f"{pts[m]['audio_s_per_s']:.1f}" if m in pts else "-" for m in modes]
                gain = ""
                if "eager" in pts:
                    best = min(pts.values(), key=lambda r: r["ms_per_call"])
                    gain = f"{pts['eager']['ms_per_call'] / best['ms_per_call']:.2f}x ({best['mode']})"
                lines.append(f"| {b} | {c} | " + " | ".join(ms) + " | " + " | ".join(sp) + f" | {gain} |")
        lines.append("")
    return "\n".join(lines)


def run(args) -> dict:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.tf32 != "default":
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = args.tf32 == "on"
    modes = [m for m in args.modes.split(",") if m] if args.modes else \
        (["eager", "graph", "compiled-graph"] if device.type == "cuda" else ["eager", "compiled"])
    bad = set(modes) - set(MODES)
    if bad:
        raise SystemExit(f"unknown modes {sorted(bad)}; choose from {', '.join(MODES)}")
    batches = [int(b) for b in args.batches.split(",")]
    chunks = [int(c) for c in args.chunks.split(",")]
    dtypes = [d for d in args.dtypes.split(",") if d]
    cache = args.cache or os.path.join(tempfile.gettempdir(), "tts-appliance-codec-bench-inductor")
    res = {"env": env_info(device), "codec": args.codec, "batches": batches, "chunks": chunks, "dtypes": dtypes,
           "modes": modes, "inductor_cache": cache, "compile": {}, "results": []}
    for dt in dtypes:
        dec = load_decoder(args.codec, str(device), getattr(torch, dt))
        res["params_m"] = round(sum(p.numel() for p in dec.parameters()) / 1e6, 1)
        res["samples_per_frame"] = dec.samples_per_frame
        if any(m.startswith("compiled") for m in modes):
            from engines.codec.backend_torch import TorchCodec

            probe = TorchCodec(dec, 2, compile=True, cache_dir=cache)
            info = {"compile_s": round(probe.warm(), 1)}
            if probe.fallback_reason:
                info["fallback"] = probe.fallback_reason
                log.warning("%s: compile failed (%s): compiled modes run eagerly", dt, probe.fallback_reason)
            else:
                info["parity_max_abs"] = compiled_parity(dec, cache)
            res["compile"][dt] = info
            print(f"# {dt}: {info}", flush=True)
        for b in batches:
            for c in chunks:
                for mode in modes:
                    try:
                        row = measure(dec, mode, b, c, args.reps, args.warmup, args.max_seconds, cache)
                    except torch.cuda.OutOfMemoryError as exc:
                        row = {"mode": mode, "batch": b, "chunk": c, "error": f"out of memory: {exc}"}
                    row["dtype"] = dt
                    res["results"].append(row)
                    print(json.dumps(row), flush=True)
                    gc.collect()
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                        res["env"]["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        del dec
    res["results"] = [r for r in res["results"] if "error" not in r] + [r for r in res["results"] if "error" in r]
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--codec", default="real", help="real (random weights), tiny, or a speech_tokenizer folder")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--chunks", default="1,8,16", help="frames per push (12.5 frames = 1 s of audio)")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--modes", default=None, help=f"comma list of {', '.join(MODES)} (default: eager,graph,"
                                                  "compiled-graph on CUDA; eager,compiled on CPU)")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per point (fewer past --max-seconds)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=2.0)
    ap.add_argument("--tf32", choices=["default", "on", "off"], default="default",
                    help="fp32 convs/matmuls in TF32 (torch's default: cuDNN on, matmul off)")
    ap.add_argument("--cache", default=None, help="inductor cache folder (default: a folder under the temp dir)")
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    res = run(args)
    md = markdown(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    if args.md:
        Path(args.md).write_text(md + "\n")
    print(md)
    return res


if __name__ == "__main__":
    main()
