"""Benchmark the streaming codec backends on this machine: torch vs ONNX Runtime (CPU).

    python -m benchmarks.codec_cpu --codec real --threads 1 --chunks 1,4,12
    python -m benchmarks.codec_cpu --codec tests/data/tiny/cv_small/speech_tokenizer
    # a call's rows split over 2 threads of one torch thread each (the daemon's CPU codec on 2 cores)
    python -m benchmarks.codec_cpu --codec real --threads 1 --row-threads 2 --batch 40 --chunks 1 --backends torch

`--codec real` builds the Qwen3-TTS-Tokenizer-12Hz decoder of the published config
(benchmarks.dummy_engine.RELEASED_CODEC: pre-transformer hidden 512, intermediate 1024, 8 layers, 16 heads of
64, latent 1024, decoder_dim 1536, codebook_dim 512, upsampling (8,5,4,3)+(2,2)) with RANDOM weights: speed
depends on shapes, not on values; `--codec defaults` the heavier CodecDecoderConfig defaults (hidden 1024,
intermediate 3072). A folder path loads that codec. Prints one line per (backend, chunk, batch) with audio-seconds decoded per second.
"""
from __future__ import annotations

import argparse
import logging
import os
import tempfile
from pathlib import Path

import torch

from engines.codec.decoder import CodecDecoder, load_codec_decoder
from engines.model.config import CodecDecoderConfig

from engines.codec.export import export_step
from engines.codec.backend_onnx import OnnxCodec
from engines.codec.backend_torch import TorchCodec
from engines.device.detect import cpu_name
from engines.codec.parity import speed, stream_parity

log = logging.getLogger(__name__)


def random_decoder(cfg: CodecDecoderConfig | None = None, seed: int = 0) -> CodecDecoder:
    """A decoder of `cfg` (default: the released shape) with random but well-scaled weights, fp32 CPU, eval."""
    from benchmarks.dummy_engine import RELEASED_CODEC

    torch.manual_seed(seed)
    dec = CodecDecoder(cfg or RELEASED_CODEC)
    with torch.no_grad():
        for name, p in dec.named_parameters():
            if name.endswith("embedding_sum"):
                p.normal_(0, 1)
    return dec.eval().requires_grad_(False)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--codec", default="real", help="'real' (the released shape, random weights), 'defaults' "
                                                    "(CodecDecoderConfig's) or a speech_tokenizer folder")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads for both backends")
    ap.add_argument("--chunks", default="1,4,12", help="frames per push (12.5 frames = 1 s of audio)")
    ap.add_argument("--batch", type=int, default=1, help="streams per push")
    ap.add_argument("--seconds", type=float, default=3.0, help="timing window per measurement")
    ap.add_argument("--backends", default="torch,onnxruntime")
    ap.add_argument("--row-threads", type=int, default=1, help="torch: a push's rows split over this many threads")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    dec = (random_decoder() if args.codec == "real" else random_decoder(CodecDecoderConfig()) if args.codec == "defaults"
           else load_codec_decoder(args.codec, "cpu", torch.float32))
    n_params = sum(p.numel() for p in dec.parameters()) / 1e6
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# machine: {cpu_name()}, {os.cpu_count()} cores, load {load:.1f}, threads {args.threads}, "
          f"row threads {args.row_threads}, "
          f"torch {torch.__version__}; codec {args.codec} ({n_params:.1f} M params)")
    with tempfile.TemporaryDirectory() as tmp:
        makers = {"torch": lambda b: TorchCodec(dec, b, row_threads=args.row_threads)}
        if "onnxruntime" in args.backends:
            path = export_step(dec, Path(tmp) / "codec_step.onnx")
            makers["onnxruntime"] = lambda b: OnnxCodec(path, b, dec.samples_per_frame, threads=args.threads)
            err = stream_parity(makers["onnxruntime"], dec)
            print(f"# onnxruntime vs torch, streamed chunks 1,3,8,2: max abs {err:.2e}")
        for chunk in [int(c) for c in args.chunks.split(",")]:
            for name in args.backends.split(","):
                r = speed(makers[name], dec, chunk=chunk, batch=args.batch, seconds=args.seconds)
                print(f"{name:<12} chunk {chunk:>3} batch {args.batch}: {r['audio_s_per_s']:8.2f} audio-s/s median, "
                      f"{r['audio_s_per_s_best']:8.2f} best ({r['ms_per_push']:.1f} ms median push, "
                      f"{r['pushes']} pushes)", flush=True)


if __name__ == "__main__":
    main()
