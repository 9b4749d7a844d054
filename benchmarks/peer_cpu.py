"""One stream on the CPU, ours beside the pure-C peer (github.com/gabriele-mastrapasqua/qwen3-tts), same checkpoint.

    python -m benchmarks.peer_cpu --peer https://github.com/gabriele-mastrapasqua/qwen3-tts.git
    python -m benchmarks.peer_cpu --peer PATH              # a checkout (built here if needed) or a git repository
    python -m benchmarks.peer_cpu --peer none --linear auto,model,int8   # ours only

What it does: writes the random-weight 0.6B checkpoint in the official layout (benchmarks.dummy_checkpoint:
bf16 talker, float32 codec of the released shape, as the published checkpoints store them); fetches the peer
(a git URL or repository is cloned into the work folder, without its `samples/` audio; a folder is used as
it is), builds it (`make blas SIMD=...`, the widest level this CPU has) and runs its `--self-test`; starts the
shipped daemon on the same checkpoint, one daemon process per `runtime.linear` value (its defaults otherwise:
`model.threads: auto`, the codec's dtype auto; the checkpoint's EOS masked so requests make exactly the frames
asked); then alternates, for every repetition and frame count: the peer with
bf16 weights, the peer with `--int8`, and ours in each weight format. The peer is never vendored: where it
cannot be fetched or built, its rows say why and ours still run.

Measured per run, the same way for both: x realtime = audio seconds / seconds from the request to its last
audio (prompt prefill and codec included, model loading apart: the peer's own "RTF" line, which counts from
the start of its generation; ours from the request's send over the daemon's socket to its last audio byte, after
a warm-up request), and the first audio (streamed: the peer's `--stream` "TTFA" line, its first chunk of 2
frames; ours the first audio byte of the streamed pcm answer).
Medians over `--reps`. Both get the cores this process may use (the peer's `-j`; ours through model.threads
auto's split of them): run the whole command under `taskset -c 0-N` for fewer.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

log = logging.getLogger("peer_cpu")
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the quiet forest."
VOICE, LANGUAGE = "vivian", "english"
SAMPLE_RATE = 24000


# ----- the peer -------------------------------------------------------------------------------------------
def simd_level(flags: frozenset) -> Optional[str]:
    """The peer's `make blas SIMD=` level for a CPU with `flags` (None: its default, AVX2 + FMA or the host's)."""
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"} <= flags:
        return "avx512bf16"
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags:
        return "avx512vnni"
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return "avx512"
    return None


def _run(cmd: list, cwd=None, timeout: float = 1800.0) -> subprocess.CompletedProcess:
    log.info("$ %s", " ".join(map(str, cmd)))
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _tail(text: str, n: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-n:])


def fetch_peer(source: str, workdir: Path) -> tuple[Optional[Path], str]:
    """(the peer's source folder, how it was got) or (None, why not). A folder with a Makefile is used as it
    is; a git URL or a (bare) repository is cloned into `workdir` without `samples/` (audio files a mirror may
    lack)."""
    src = Path(source).expanduser()
    if src.is_dir() and (src / "Makefile").is_file():
        return src.resolve(), f"the checkout at {src}"
    if not shutil.which("git"):
        return None, "git is not installed (needed to fetch the peer)"
    dest = workdir / "peer"
    steps = [["git", "clone", "--quiet", "--no-checkout", str(src) if src.exists() else source, str(dest)],
             ["git", "-C", str(dest), "sparse-checkout", "set", "--no-cone", "/*", "!/samples/"],
             ["git", "-C", str(dest), "checkout", "--quiet"]]
    for cmd in steps:
        try:
            r = _run(cmd, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"{' '.join(cmd[:2])} failed: {exc}"
        if r.returncode != 0:
            return None, f"{' '.join(cmd[:3])} failed: {_tail(r.stderr)}"
    commit = _run(["git", "-C", str(dest), "rev-parse", "--short", "HEAD"]).stdout.strip()
    return dest, f"cloned from {source} at {commit}"


def build_peer(src: Path, flags: frozenset) -> tuple[Optional[Path], str]:
    """Build the peer in `src` (`make blas SIMD=<level>`) and check its `--self-test`: (binary, caps) or (None, why)."""
    binary = src / "qwen_tts"
    level = simd_level(flags)
    if not binary.is_file():
        if not shutil.which("make") or not (shutil.which("cc") or shutil.which("gcc")):
            return None, "no C toolchain (make, gcc): apt-get install build-essential libopenblas-dev"
        cmd = ["make", "blas", f"-j{os.cpu_count() or 1}"] + ([f"SIMD={level}"] if level else [])
        r = _run(cmd, cwd=src, timeout=1800)
        if r.returncode != 0 or not binary.is_file():
            hint = " (libopenblas-dev installed?)" if "openblas" in (r.stderr + r.stdout).lower() else ""
            return None, f"`{' '.join(cmd)}` failed{hint}: {_tail(r.stderr or r.stdout)}"
    test = _run([str(binary), "--self-test"], timeout=600)
    if test.returncode != 0 or "PASSED" not in test.stdout + test.stderr:
        return None, f"its --self-test failed: {_tail(test.stdout + test.stderr)}"
    caps = _run([str(binary), "--caps"], timeout=60)
    return binary, " / ".join(line.strip() for line in (caps.stdout + caps.stderr).splitlines()
                              if re.match(r"\s*(matvec|int8 dot|bf16 dot|matvec threads)", line))


def peer_run(binary: Path, ckpt: Path, frames: int, threads: int, seed: int, int8: bool, out: Path) -> dict:
    """One streamed request through the peer's command line: x realtime (its RTF line) and first audio (TTFA)."""
    cmd = [str(binary), "-d", str(ckpt), "--text", TEXT, "-s", VOICE, "-l", LANGUAGE, "-m", str(frames),
           "-j", str(threads), "--seed", str(seed), "--stream", "-o", str(out)] + (["--int8"] if int8 else [])
    r = _run(cmd, timeout=3600)
    text = r.stdout + r.stderr
    rtf = re.search(r"Audio: ([\d.]+)s generated in ([\d.]+)s \(RTF ([\d.]+)\)", text)
    ttfa = re.search(r"TTFA: (\d+) ms", text)
    made = re.search(r"Generated (\d+) frames", text)
    if r.returncode != 0 or not rtf:
        return {"error": f"exit {r.returncode}: {_tail(text)}"}
    return {"x_realtime": 1.0 / float(rtf.group(3)), "first_audio_s": int(ttfa.group(1)) / 1000 if ttfa else None,
            "frames": int(made.group(1)) if made else None}


# ----- ours -----------------------------------------------------------------------------------------------
def our_daemons(ckpt: Path, linears: list[str], frames: int, workdir: Path, threads: str = "auto") -> dict:
    """{runtime.linear value: started DaemonProcess}: the shipped daemon (`tts-appliance daemon`, its defaults
    for this machine: model.threads auto, the codec's dtype auto) on a copy of the checkpoint whose EOS is masked
    past `frames` (a request's max_frames then gives exactly that many), one daemon per format. Each format has a
    process of its own: in one process, a second engine that has run leaves torch's OpenMP threads of its own,
    and the first engine's fp16 products then lost ~30% (measured: a stream 0.38x alone, 0.27x beside an idle
    second engine), which is not what a user's daemon meets. `threads`: model.threads (auto: the daemon's split)."""
    from benchmarks.load.daemon import DaemonProcess, force_min_frames, link_checkpoint

    fixed = workdir / "ours-fixed-length"
    link_checkpoint(ckpt, fixed)
    force_min_frames(fixed, frames + 1)
    daemons = {}
    for fmt in linears:
        home = workdir / f"ours-{fmt}"
        run = Path(tempfile.mkdtemp(prefix="peer-cpu-run-", dir="/tmp"))  # a socket path short enough
        cfg = {"model": {"path": str(fixed), "device": "cpu", "max_frames": frames, "threads": threads},
               "runtime": {"linear": fmt},
               "jobs": {"home": str(home / "home"), "enabled": False, "watch": False, "guard": False},
               "http": {"socket": str(run / "api.sock")}, "wyoming": {"enabled": False},
               "service": {"runtime_dir": str(run)}}
        daemons[fmt] = DaemonProcess(cfg, home, home / "daemon.log")
        daemons[fmt].start()
    return daemons


async def our_ready(daemons: dict, timeout: float = 900.0) -> dict:
    """{format: (Target, its weights' format as the engine log names it)} once every daemon answers, after
    one unmeasured warm-up request each."""
    out = {}
    for fmt, d in daemons.items():
        target, _ = await d.wait_ready(timeout)
        await our_run(target, 2, 0)
        named = re.search(r"decoder layers: (\S+) weights", d.log_path.read_text(encoding="utf-8", errors="replace"))
        out[fmt] = (target, named.group(1) if named else fmt)
    return out


async def our_run(target, frames: int, seed: int) -> dict:
    """One streamed request (pcm) to the daemon: x realtime from the request's send to its last audio byte,
    first audio = its first audio byte (benchmarks.load.client.stream_speech)."""
    from benchmarks.load.client import stream_speech

    payload = {"input": TEXT, "voice": VOICE, "language": LANGUAGE, "response_format": "pcm", "stream": True,
               "max_frames": frames, "seed": seed}
    rec = await stream_speech(target, payload, timeout=3600.0, threshold=0)
    if not rec["completed"]:
        return {"error": f"{rec['error']}: {rec.get('detail', '')}"[:300]}
    return {"x_realtime": rec["samples"] / SAMPLE_RATE / rec["e2e_s"], "first_audio_s": rec["ttfb_s"],
            "frames": rec["samples"] // 1920}


# ----- the table ------------------------------------------------------------------------------------------
def summary(runs: list) -> dict:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[-1]["error"] if runs else "not run"}
    ttfa = [r["first_audio_s"] for r in ok if r.get("first_audio_s") is not None]
    return {"x_realtime": round(statistics.median(r["x_realtime"] for r in ok), 3),
            "first_audio_s": round(statistics.median(ttfa), 2) if ttfa else None,
            "runs": len(ok), "frames": sorted({r.get("frames") for r in ok} - {None})}


def markdown(res: dict) -> str:
    frames = res["frames"]
    lines = [f"CPU: {res['cpu']} ({res['simd']}), {res['threads']} threads, torch {res['torch']}, "
             f"load average {res['load_before']} before / {res['load_after']} after", "",
             "| engine, one stream | " + " / ".join(f"x realtime ({f} frames)" for f in frames)
             + " | first audio (streamed) |", "|---|---|---|"]
    for name, row in res["rows"].items():
        cells = [row.get(str(f), {}) for f in frames]
        if all("error" in c for c in cells):
            lines.append(f"| {name} | skipped: {cells[0]['error']} | |")
            continue
        speed = " / ".join(f"{c['x_realtime']:.3f}x" if "x_realtime" in c else "-" for c in cells)
        ttfa = " / ".join(f"{c['first_audio_s']:.2f} s" if c.get("first_audio_s") is not None else "-" for c in cells)
        lines.append(f"| {name} | {speed} | {ttfa} |")
    return "\n".join(lines) + "\n"


async def _alternate(binary, peer_note, ckpt, daemons, frames, reps, threads, workdir, runs: dict) -> None:
    """Every repetition and frame count: the peer in bf16, the peer with --int8, ours in each format (`runs`:
    {row name: {frames: [results]}}, filled in place)."""
    ours = await our_ready(daemons)
    names = {fmt: f"ours, runtime.linear {fmt} ({weights} weights)" for fmt, (_, weights) in ours.items()}
    peers = {"pure-C peer, bf16 weights": False, "pure-C peer, --int8": True}
    runs.update({name: {f: [] for f in frames} for name in [*peers, *names.values()]})
    for rep in range(reps):
        for f in frames:
            for name, int8 in peers.items():
                runs[name][f].append(peer_run(binary, ckpt, f, threads, 1 + rep, int8, workdir / "peer.wav")
                                     if binary else {"error": peer_note})
            for fmt, (target, _) in ours.items():
                runs[names[fmt]][f].append(await our_run(target, f, 1 + rep))
            log.info("rep %d, %d frames: %s", rep + 1, f, {n: r[f][-1] for n, r in runs.items()})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peer_cpu", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", required=True, help="the peer: a git URL, a git repository, a checkout folder, or none")
    ap.add_argument("--frames", default="48,96", help="frames per request (12.5 a second), comma list")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--linear", default="auto", help="our runtime.linear values, comma list (auto first)")
    ap.add_argument("--threads", default="auto", help="our model.threads (default auto, the daemon's split)")
    ap.add_argument("--workdir", help="where the checkpoint and the peer's clone go (default: a temp folder, removed)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    import torch

    from benchmarks.load.daemon import write_dummy
    from engines.device.detect import cpu_cores, cpu_flags, cpu_name, simd_summary

    threads = cpu_cores()  # both engines: the peer's -j, ours through model.threads auto
    frames = [int(f) for f in args.frames.split(",")]
    linears = [x.strip() for x in args.linear.split(",") if x.strip()]
    workdir = Path(tempfile.mkdtemp(prefix="peer-cpu-", dir=args.workdir))
    res = {"benchmark": "one stream on the CPU, ours beside the pure-C peer", "command": "python -m benchmarks.peer_cpu "
           + " ".join(argv if argv is not None else sys.argv[1:]), "cpu": cpu_name(), "simd": simd_summary(),
           "threads": threads, "torch": torch.__version__, "frames": frames, "reps": args.reps, "text": TEXT,
           "load_before": round(os.getloadavg()[0], 1), "rows": {}}
    try:
        ckpt = workdir / "dummy-0.6b"
        write_dummy("0.6b", ckpt, "cpu", "bfloat16", seed=0)
        binary, peer_note = None, "--peer none"
        if args.peer != "none":
            src, peer_note = fetch_peer(args.peer, workdir)
            if src is not None:
                binary, peer_note = build_peer(src, cpu_flags())
        res["peer"] = {"source": args.peer, "binary": str(binary) if binary else None, "note": peer_note}
        log.info("peer: %s", peer_note)
        daemons = our_daemons(ckpt, linears, max(frames), workdir, args.threads)
        try:
            asyncio.run(_alternate(binary, peer_note, ckpt, daemons, frames, args.reps, threads, workdir, runs := {}))
        finally:
            for d in daemons.values():
                d.stop()
        res["rows"] = {name: {str(f): summary(r[f]) | {"each": r[f]} for f in frames} for name, r in runs.items()}
        res["load_after"] = round(os.getloadavg()[0], 1)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    text = markdown(res)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
