"""Client-side time to first audio (TTFA) over the daemon's real Unix socket.

    python -m benchmarks.socket_ttfa --model tests/data/tiny/cv_small --device cpu --concurrency 1,2
    python -m benchmarks.socket_ttfa --dummy 1.7b --device cuda --concurrency 1,32 --json ttfa.json --md ttfa.md

Serves the daemon's own HTTP app (appliance.servers, the EngineHost streaming path) on a Unix socket
in this process around an EngineRunner, built from `--model DIR` (a checkpoint folder) or `--dummy`
(random weights of the real 0.6B/1.7B shapes). For each concurrency N, a separate client process
keeps N connections busy in a closed loop, each POSTing /v1/audio/speech (response_format=pcm,
stream=true) `--requests` times after one unmeasured warm-up request; TTFA runs from the request
being written to the first PCM bytes read. Every request is forced to exactly `--frames` frames (EOS
masked, benchmarks.bench.request), so random weights stream as long as a real model would.
Reports p50/p95 per concurrency (and the engine-side mean for comparison) as JSON and markdown.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("socket_ttfa")


# -- client side (a separate process: the server's GIL stays out of the measurement) --------------
async def _one(reader, writer, body: bytes) -> tuple[float, int]:
    """One request on a kept-alive connection: (seconds to the first body bytes, body bytes)."""
    writer.write(b"POST /v1/audio/speech HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    t0 = time.perf_counter()
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b" ", 2)[1]
    if status != b"200":
        length = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")]
        detail = await reader.readexactly(int(length[0].split(b":")[1])) if length else b""
        raise RuntimeError(f"HTTP {status.decode()}: {detail.decode(errors='replace')[:300]}")
    first, total = None, 0
    while True:  # chunked transfer encoding
        size = int((await reader.readline()).split(b";")[0], 16)
        if size == 0:
            await reader.readline()
            return first if first is not None else math.nan, total
        left = size
        while left:
            data = await reader.read(left)
            if not data:
                raise RuntimeError("the server closed the stream early")
            if first is None:
                first = time.perf_counter() - t0
            left -= len(data)
        total += size
        await reader.readexactly(2)


async def _clients(spec: dict) -> dict:
    count, ttfa, audio_bytes, errors = iter(range(spec["concurrency"] * spec["requests"])), [], [0], []

    async def client(k: int):
        reader, writer = await asyncio.open_unix_connection(spec["socket"], limit=1 << 20)
        try:
            for i in count:
                body = json.dumps({**spec["payload"], "seed": i}).encode()
                try:
                    t, n = await asyncio.wait_for(_one(reader, writer, body), spec["timeout_s"])
                except (RuntimeError, asyncio.TimeoutError, OSError) as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    return
                ttfa.append(t)
                audio_bytes[0] += n
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(spec["concurrency"])))
    return {"ttfa_s": ttfa, "bytes": audio_bytes[0], "wall_s": time.perf_counter() - t0, "errors": errors}


def run_clients(spec: dict) -> dict:
    """Run the client process for one concurrency level and return its JSON answer."""
    p = subprocess.run([sys.executable, "-m", "benchmarks.socket_ttfa", "--client", json.dumps(spec)], cwd=ROOT,
                       capture_output=True, text=True, timeout=spec["timeout_s"] * (spec["requests"] + 1) + 60)
    if p.returncode != 0:
        raise RuntimeError(f"client process failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    out = json.loads(p.stdout)
    if out["errors"]:
        raise RuntimeError(f"{len(out['errors'])} requests failed, first: {out['errors'][0]}")
    return out


# -- server side -----------------------------------------------------------------------------------
def device_name(device: str) -> str:
    import torch

    from engines.device.detect import cpu_name

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"{cpu_name()} ({torch.get_num_threads()} threads)"


def build_runner(args, slots: int):
    """(engine, started EngineRunner) with graphs for every batch bucket captured up front."""
    import torch

    from benchmarks.bench import request as fixed_request
    from engines.runtime.runner import EngineRunner

    if args.dummy:
        from benchmarks.dummy_engine import dummy_engine

        engine = dummy_engine(args.dummy, args.device, args.dtype)
    else:
        from engines.engine import TTSEngine

        engine = TTSEngine.load(args.model, device=args.device, dtype=args.dtype)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    runner = EngineRunner(engine, max_slots=slots, max_queue=4096,
                          max_context=256 * ((args.frames + 100) // 256 + 1))
    runner.prepare()  # every graph captured before the first request
    runner.synthesize([fixed_request(4, i) for i in range(2)])
    runner.start()
    return engine, runner


def make_daemon(engine, runner, frames: int, slots: int, tmp: Path):
    """The daemon object the HTTP app serves, around our runner; requests last exactly `frames` frames."""
    from appliance.config import Config
    from appliance.daemon import Daemon
    from appliance.engine_host import EngineHost
    from appliance.settings import settings
    from benchmarks.bench import request as fixed_request

    class FixedLengthHost(EngineHost):
        def request(self, text, seed=None, **kw):
            req = super().request(text, seed=seed, **kw)
            return replace(req, sampling=fixed_request(frames, seed or 0).sampling)

    cfg = Config()
    cfg.jobs.home, cfg.jobs.enabled, cfg.wyoming.enabled = str(tmp / "home"), False, False
    cfg.service.runtime_dir = str(tmp)
    cfg.runtime.max_slots, cfg.runtime.max_queue = slots, 4096
    s = settings(cfg)
    d = Daemon(s)
    d.host = FixedLengthHost(s, d.metrics)
    d.host.engine, d.host.runner = engine, runner
    d.state, d.accepting = "ok", True
    return d


class Server:
    """The daemon's Servers on an event loop in a thread of this process."""

    def __init__(self, daemon):
        from appliance.servers import Servers

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="http", daemon=True)
        self.servers = Servers(daemon)

    def __enter__(self) -> str:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.servers.start(), self.loop).result(60)
        return self.servers.http_path

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.servers.stop(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def percentile(values: list, q: float) -> float:
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def measure(args) -> dict:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    levels = [int(c) for c in args.concurrency.split(",")]
    slots = args.slots or max(levels)
    engine, runner = build_runner(args, slots)
    res = {"device": device_name(args.device), "device_type": args.device.split(":")[0],
           "model": f"dummy-{args.dummy}" if args.dummy else Path(args.model).name, "dtype": args.dtype,
           "frames": args.frames, "slots": slots, "response_format": "pcm", "results": []}
    payload = {"model": "tts-1", "input": args.text, "voice": args.voice, "language": args.language,
               "response_format": "pcm", "stream": True}
    try:
        with tempfile.TemporaryDirectory(prefix="ttfa-") as tmp:  # short: AF_UNIX paths are limited
            daemon = make_daemon(engine, runner, args.frames, slots, Path(tmp))
            with Server(daemon) as sock:
                for c in levels:
                    spec = {"socket": sock, "concurrency": c, "payload": payload, "timeout_s": args.timeout}
                    run_clients({**spec, "requests": 1})  # warm-up: connections, first-use paths
                    m = daemon.metrics
                    n0, s0 = m.ttfa_totals()
                    out = run_clients({**spec, "requests": args.requests})
                    t = [1e3 * x for x in out["ttfa_s"]]
                    res["results"].append({
                        "concurrency": c, "requests": len(t), "ttfa_p50_ms": statistics.median(t),
                        "ttfa_p95_ms": percentile(t, 0.95), "ttfa_mean_ms": statistics.fmean(t),
                        "ttfa_max_ms": max(t),
                        "engine_ttfa_mean_ms": 1e3 * (m.ttfa_totals()[1] - s0) / max(m.ttfa_totals()[0] - n0, 1),
                        "wall_s": out["wall_s"], "audio_s_per_s": out["bytes"] / 2 / engine.sample_rate / out["wall_s"]})
                    log.info("concurrency %d: p50 %.1f ms, p95 %.1f ms", c, res["results"][-1]["ttfa_p50_ms"],
                             res["results"][-1]["ttfa_p95_ms"])
    finally:
        runner.stop()
    return res


def markdown(r: dict) -> str:
    lines = [f"### Socket TTFA, {r['model']} {r['dtype']} on {r['device']} ({r['frames']} frames per request, "
             f"{r['slots']} slots)", "",
             "| concurrency | requests | TTFA p50 | TTFA p95 | engine-side mean | audio-s/s |", "|---|---|---|---|---|---|"]
    for x in r["results"]:
        lines.append(f"| {x['concurrency']} | {x['requests']} | {x['ttfa_p50_ms']:.1f} ms | {x['ttfa_p95_ms']:.1f} ms "
                     f"| {x['engine_ttfa_mean_ms']:.1f} ms | {x['audio_s_per_s']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", help="checkpoint folder (CustomVoice: the voice must be one of its speakers)")
    src.add_argument("--dummy", choices=["0.6b", "1.7b"], help="random weights of a real shape")
    ap.add_argument("--device", default="cuda", help="cpu, cuda, cuda:N")
    ap.add_argument("--dtype", help="default: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument("--concurrency", default="1,32", help="comma list of concurrent clients")
    ap.add_argument("--requests", type=int, default=10, help="measured requests per client and level")
    ap.add_argument("--frames", type=int, default=100, help="frames per request (12.5 per audio second)")
    ap.add_argument("--slots", type=int, help="engine slots (default: the largest concurrency)")
    ap.add_argument("--voice", default="vivian")
    ap.add_argument("--language", default="english")
    ap.add_argument("--text", default=None, help="text to speak (default: benchmarks.bench.TEXT)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one request may take")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--md", help="write the markdown table here")
    ap.add_argument("--client", help=argparse.SUPPRESS)  # internal: run one level's clients (JSON spec)
    args = ap.parse_args(argv)
    if args.client:
        print(json.dumps(asyncio.run(_clients(json.loads(args.client)))))
        return
    if not (args.model or args.dummy):
        ap.error("give --model DIR (a checkpoint folder, e.g. tests/data/tiny/cv_small) or --dummy 0.6b|1.7b")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for name in ("appliance", "engines", "aiohttp"):
        logging.getLogger(name).setLevel(logging.WARNING)
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.text is None:
        from benchmarks.bench import TEXT

        args.text = TEXT
    res = measure(args)
    text = json.dumps(res, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    md = markdown(res)
    if args.md:
        Path(args.md).write_text(md, encoding="utf-8")
    sys.stdout.write(text + "\n" + md)


if __name__ == "__main__":
    main()
