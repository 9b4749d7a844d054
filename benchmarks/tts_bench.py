"""tts-bench, the open-loop client of the Nari Qwen3-TTS server (github nari-labs/benchmarks, folder tts_bench),
run unmodified against this daemon: its WebSocket transport (`nari.speech.v1` on /v1/audio/speech/ws: one word
per input_text.append every 10 ms, each acknowledged) and its HTTP transport (POST /v1/audio/speech, pcm
streamed), one rate per tts-bench run as it asks, the daemon started once around them (or one already running,
--url). tts-bench measures TTFB, audible TTFA, end to end, underruns, and for the WebSocket the latency after
the last word; its report of each run is printed and kept in OUT/TRANSPORT-rpsRATE/report.txt.

tts-bench is not part of this repository. Install it in a virtual environment of its own, outside the checkout
(it wants Python 3.12; it runs on 3.11 too with pip's --ignore-requires-python):
    python3.12 -m venv /tmp/tts-bench-venv && /tmp/tts-bench-venv/bin/pip install PATH/TO/benchmarks/tts_bench
or, on a machine without the internet (the GPU machine), from wheels made here by benchmarks/tts_bench_wheels.sh.
Its prompts: a JSONL written from benchmarks.load.text's corpus (tts-bench's own set is downloaded from
the Hugging Face hub by `bench dataset prepare`; give it with --dataset where it is at hand).

    python -m benchmarks.tts_bench --dummy 1.7b --device cuda --bench "python3 -m tts_bench" --frames 60 \\
        --rates 1,4,10,20 --transports websocket,http --warmup 10 --duration 30 --out out/tts_bench
    python -m benchmarks.tts_bench --model tests/data/tiny/cv_small --device cpu --bench /tmp/tts-bench-venv/bin/bench \\
        --frames 40 --rates 1 --warmup 0 --duration 10 --out /tmp/tts-bench-cpu --config-extra model.threads=1

With --dummy (random weights) every request runs to --frames frames (min_new_tokens in the served
generation_config.json, as benchmarks.load does); --frames also goes to tts-bench as the request parameter
max_frames, in the HTTP body and in request.start.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shlex
import socket
import sys
from pathlib import Path

from benchmarks.load.harness import add_daemon_args, base_result, check_daemon_args, served
from benchmarks.load.text import CORPUS

log = logging.getLogger("benchmarks.tts_bench")


def write_prompts(path: Path) -> Path:
    path.write_text("".join(json.dumps({"id": f"corpus-{i:02d}", "text": t}) + "\n" for i, t in enumerate(CORPUS)),
                    encoding="utf-8")
    return path


def bench_argv(args, transport: str, rate: float, base_url: str, dataset: Path, out: Path) -> list:
    return [*shlex.split(args.bench), "run", "--target", "nari", "--transport", transport, "--base-url", base_url,
            "--voice", args.voice or "Ryan", "--language", args.language or "English", "--dataset", str(dataset),
            "--rps", f"{rate:g}", "--warmup", f"{args.warmup:g}s", "--duration", f"{args.duration:g}s",
            "--timeout", f"{args.timeout:g}s", "--seed", "0", "--output", str(out),
            "--request-param", f"max_frames={args.frames}"]


async def measure(args, res: dict) -> None:
    out = Path(args.out)
    dataset = Path(args.dataset) if args.dataset else write_prompts(out / "prompts.jsonl")
    fixed = args.frames + 1 if args.fixed_length else None
    async with served(args, res, min_new_tokens=fixed) as s:
        if s.target.socket:
            raise ValueError("tts-bench speaks TCP: give --url, or --tcp-port to the daemon it starts")
        base_url = f"http://{s.target.host}:{s.target.port}"
        for rate in args.rates:
            for transport in args.transports:
                where = out / f"{transport}-rps{rate:g}"
                argv = bench_argv(args, transport, rate, base_url, dataset, where)
                log.info("running: %s", shlex.join(argv))
                proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                            stderr=asyncio.subprocess.STDOUT)
                text = (await proc.communicate())[0].decode(errors="replace")
                (out / f"{transport}-rps{rate:g}.log").write_text(text, encoding="utf-8")
                sys.stdout.write(f"\n== {transport}, {rate:g} requests/s: exit {proc.returncode}\n{text}")
                res["levels"].append({"transport": transport, "rps": rate, "exit": proc.returncode,
                                      "command": shlex.join(argv), "output": str(where)})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_daemon_args(ap, "python -m benchmarks.tts_bench")
    ap.add_argument("--bench", default="bench", help="tts-bench's command (default: bench on PATH)")
    ap.add_argument("--out", required=True, help="a new folder for tts-bench's results (one folder per run)")
    ap.add_argument("--rates", default="1", help="comma list of request rates, one tts-bench run each")
    ap.add_argument("--transports", default="websocket,http", help="comma list: websocket, http")
    ap.add_argument("--frames", type=int, default=60, help="max_frames of each request (80 ms each)")
    ap.add_argument("--warmup", type=float, default=10.0, help="tts-bench's warm-up, seconds")
    ap.add_argument("--duration", type=float, default=30.0, help="tts-bench's measured window, seconds")
    ap.add_argument("--timeout", type=float, default=120.0, help="tts-bench's per-request timeout, seconds")
    ap.add_argument("--dataset", help="tts-bench's prompts (JSONL of id and text; default: our corpus)")
    args = ap.parse_args(argv)
    args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
    args.transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    if set(args.transports) - {"websocket", "http"} or not args.rates or min(args.rates) <= 0:
        ap.error("--transports takes websocket and http; --rates positive numbers")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        ap.error(f"--out {out} is not empty: tts-bench never reuses an output folder")
    out.mkdir(parents=True, exist_ok=True)
    args.json = args.json or str(out / "result.json")
    if not (args.url or args.socket) and args.tcp_port is None:
        with socket.socket() as sock:  # a loopback port nobody listens on now
            sock.bind(("127.0.0.1", 0))
            args.tcp_port = sock.getsockname()[1]
    check_daemon_args(ap, args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    res = base_result(args, sys.argv[1:] if argv is None else argv, "tts-bench (nari-labs) against the daemon",
                      "python -m benchmarks.tts_bench")
    try:
        asyncio.run(measure(args, res))
    except Exception as exc:  # keep what ran; say why it stopped
        res["error"] = f"{type(exc).__name__}: {exc}"
        log.error("%s", res["error"])
    Path(args.json).write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    return 1 if res["error"] or any(level["exit"] for level in res["levels"]) else 0


if __name__ == "__main__":
    sys.exit(main())
