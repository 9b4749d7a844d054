"""Open-loop streaming load against the real daemon: TTFA, end-to-end time and playback underruns per
arrival rate, optionally while a book job runs.

    # GPU: start the shipped daemon on random weights of the 1.7B shape, five rates
    python -m benchmarks.load --dummy 1.7b --device cuda --dtype bfloat16 --slots 64 --frames 60 \\
        --rates 1,4,10,20,30 --json load.json --md load.md
    # the same while a 300-segment book job runs through the jobs API
    python -m benchmarks.load --dummy 1.7b --device cuda --dtype bfloat16 --slots 64 --frames 60 \\
        --rates 1,4,10,20,30 --book 300 --json load_book.json --md load_book.md
    # a checkpoint folder on the CPU (the tiny test model; figures mean little there)
    python -m benchmarks.load --model tests/data/tiny/cv_small --fixed-length --device cpu --slots 4 \\
        --frames 4 --rates 1,2 --warmup 2 --window 5 --config-extra model.threads=1
    # a daemon that is already running (Unix socket or loopback TCP)
    python -m benchmarks.load --socket /run/tts-appliance/api.sock --rates 1,4
    python -m benchmarks.load --url http://127.0.0.1:8732 --rates 1,4

The daemon: unless --socket or --url names a running one, `python -m appliance.cli daemon` is started
as a subprocess on a generated config (the shipped defaults, plus model.path/device/dtype, --slots,
jobs.home and the socket in a temp folder, Wyoming off, the inbox watcher off, then every
--config-extra SECTION.KEY=VALUE), its output kept in --daemon-log; it is stopped with SIGTERM at
the end. --dummy writes random weights of the real shape as a checkpoint folder in the official
layout (benchmarks.dummy_checkpoint), so the real loading path is measured. Length: with --dummy (or
--model with --fixed-length) the served generation_config.json gets `min_new_tokens` = frames + 1, so
that with `max_frames` = --frames in every request each response is exactly frames x 1920 samples;
responses of another length are counted. A real checkpoint without --fixed-length stops where its
speech ends: lengths then vary and are reported.

Workload per rate: arrivals as a Poisson process (or --arrivals constant), each one a new connection
sending `POST /v1/audio/speech` {"input": an English prompt of 8-28 words, "voice": one of --voice
(default: every voice the daemon lists), "response_format": "pcm", "stream": true, "max_frames":
--frames}. A warm-up (--warmup s, not measured), then the measured window (--window s): requests
scheduled inside it are measured. Arrivals go on after the window until the measured requests have
finished (the load stays the same while they finish) or --drain-timeout runs out; those still running
then are cancelled and counted as incomplete. Before the first rate, --prime (default on) ramps one
request at a time up to the slot count so every batch size has been run once (graph capture happens
on first use). Rates run one after the other against the same daemon.

Measured on the client (this process; asyncio, raw HTTP/1.1, one connection per request,
time.perf_counter): TTFA = the request written -> the first sample with |x| > --silence-threshold read;
E2E = the request written -> the end of the response; underrun = a player starting at the first
audio received, in real time and without a buffer, runs out before the response ends (computed from
the arrival time of every read); the buffer that would have prevented it is reported too. Per rate:
TTFA p50/p95/p99/max, E2E p50/p95, underruns, peak requests in flight, completed share, errors by
kind (HTTP status, timeout, connect, truncated), achieved rate, client send lag (the client's own
health), engine frames and graph captures during the window (GET /health). With --book N, a book of
about N segments is submitted before the first rate and resubmitted whenever it ends; each window
reports the segments done in it and their audio seconds per second.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shlex
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from benchmarks.load.book import BookError, BookLoad
from benchmarks.load.client import Target, http_request
from benchmarks.load.daemon import (DaemonError, DaemonProcess, child_env, force_min_frames, link_checkpoint,
                                    set_dotted, write_dummy)
from benchmarks.load.level import Load, one_line, prime, run_level
from benchmarks.load.report import describe_device, git_commit, markdown, redact
from benchmarks.load.stats import SAMPLE_RATE, SAMPLES_PER_FRAME

log = logging.getLogger("load")


# -- the run ------------------------------------------------------------------------------------------
def daemon_config(args, workdir: Path, checkpoint: Path) -> dict:
    """The generated config: shipped defaults plus what this run needs, then --config-extra."""
    run = workdir / "run"
    if len(str(run / "api.sock")) > 100:  # AF_UNIX paths are limited to about 107 bytes
        run = Path(tempfile.mkdtemp(prefix="tts-load-run-", dir="/tmp"))  # removed with the daemon's files
    else:
        run.mkdir(mode=0o700)
    cfg = {"model": {"path": str(checkpoint), "device": args.device, "dtype": args.dtype},
           "jobs": {"home": str(workdir / "home"), "watch": False},
           "http": {"socket": str(run / "api.sock")},
           "wyoming": {"enabled": False},
           "service": {"runtime_dir": str(run)}}
    if args.slots:
        cfg["runtime"] = {"max_slots": args.slots}
    if args.dummy or args.fixed_length:  # random weights or forced lengths: the runaway guard cannot judge them
        cfg["jobs"]["guard"] = False
    if args.tcp_port is not None:
        cfg["http"].update(tcp=True, tcp_host="127.0.0.1", tcp_port=args.tcp_port)
    for item in args.config_extra:
        set_dotted(cfg, item)
    return cfg


async def measure(args, res: dict) -> None:
    """Everything against one daemon; fills `res` as it goes (so a failure keeps what was measured)."""
    workdir = daemon = book = keeper = effective = None
    me = asyncio.current_task()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, me.cancel)  # stop the daemon, keep the results
    try:
        if args.socket or args.url:
            target = Target(socket=args.socket) if args.socket else Target.from_url(args.url)
            status, _, health = await http_request(target, "GET", "/health", timeout=30.0)
            if status != 200 or not isinstance(health, dict) or health.get("status") != "ok":
                raise DaemonError(f"the daemon at {target.describe()} is not ready: /health answered {status}: "
                                  f"{str(health)[:300]}")
            res["daemon"] = "external"
            res["model"] = f"{Path(str(health.get('model'))).name} (external daemon)"
        else:
            workdir = Path(tempfile.mkdtemp(prefix="tts-load-", dir=args.workdir))
            # its own name: the engine cache (built codecs) is keyed by the folder's name
            checkpoint = workdir / (f"dummy-{args.dummy}" if args.dummy else Path(args.model).expanduser().resolve().name)
            if args.dummy:
                log.info("writing random %s weights as a checkpoint (%s, %s)", args.dummy, args.device, args.dtype)
                write_dummy(args.dummy, checkpoint, args.device, args.dtype, seed=0, timeout=args.start_timeout)
            else:
                link_checkpoint(Path(args.model).expanduser().resolve(), checkpoint)
            if args.fixed_length:  # every request and book segment runs to its own frame limit
                longest = max(args.frames, args.book_frames if args.book else 0)
                res["generation_config"] = force_min_frames(checkpoint, longest + 1)
            cfg = daemon_config(args, workdir, checkpoint)
            daemon = DaemonProcess(cfg, workdir, args.daemon_log)
            effective = daemon.effective_config()
            res["config"] = redact(effective, workdir, args.model)
            removed = child_env()[1]
            if removed:
                res["env_removed"] = removed
                log.info("not passed to the daemon: %s", ", ".join(removed))
            log.info("starting the daemon (log: %s)", args.daemon_log)
            t0 = time.perf_counter()
            daemon.start()
            target, health = await daemon.wait_ready(args.start_timeout)
            res["daemon"] = "started by the benchmark"
            res["daemon_start_s"] = round(time.perf_counter() - t0, 1)
            log.info("daemon ready in %.0f s", res["daemon_start_s"])
            if args.tcp_port is not None:  # measure over TCP; the socket was only for finding it
                target = Target(host="127.0.0.1", port=args.tcp_port)
        res["transport"] = target.describe()
        res["model_type"] = health.get("model_type")
        if health.get("sample_rate") not in (None, SAMPLE_RATE):
            raise DaemonError(f"the daemon's sample rate is {health['sample_rate']}, this benchmark assumes {SAMPLE_RATE}")
        voices = await pick_voices(args, target)
        res["workload"]["voices"] = voices
        slots = (health.get("engine") or {}).get("max_slots") or args.slots or 1
        res["slots"] = slots
        load = Load(args, target, voices, None)
        if args.prime:
            log.info("priming: ramping to %d concurrent requests", slots)
            res["prime"] = await prime(load, slots)
            log.info("primed in %.1f s", res["prime"]["wall_s"])
        if args.book:
            spec = {"voice": voices[0], "language": args.language or "english", "format": "flac", "seed": 1}
            fixed = args.fixed_length and daemon is not None  # our checkpoint: min_new_tokens covers the book
            if fixed:
                spec["sampling"] = {"max_new_tokens": args.book_frames + 1}
            db = Path(effective["jobs"]["home"]).expanduser() / "queue.db" if daemon else None
            book = load.book = BookLoad(target, args.book, spec, db)
            job = await book.submit_next()
            res["book"] = {"segments_requested": args.book, "segments": job["total"], "frames_per_segment":
                           args.book_frames if fixed else None, "submit_shape": book.shape}
            log.info("book job %s: %s segments (%s)", job["id"], job["total"], book.shape)
            keeper = asyncio.create_task(_keep_book(book, args.book_poll))
        for i, rate in enumerate(args.rates):
            if daemon is not None and not daemon.alive():
                raise DaemonError(f"the daemon exited (status {daemon.proc.returncode}); log {args.daemon_log}:\n"
                                  f"{daemon.log_tail()}")
            log.info("rate %g/s: %.0f s warm-up + %.0f s window", rate, args.warmup, args.window)
            level = await run_level(load, rate, i)
            res["levels"].append(level)
            log.info("rate %g/s: %s", rate, one_line(level))
        if book:
            res["book"].update(books_submitted=len(book.jobs), errors=book.errors)
    finally:
        if keeper:
            keeper.cancel()
        if book:
            await book.cancel()
        if daemon:
            res["daemon_exit"] = daemon.stop(args.stop_timeout)
            if daemon.proc is not None and daemon.proc.returncode not in (0, None):
                log.warning("daemon exit status %s; log tail:\n%s", daemon.proc.returncode, daemon.log_tail(30))
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
            run = Path((effective or {}).get("service", {}).get("runtime_dir") or workdir)
            if run.name.startswith("tts-load-run-"):
                shutil.rmtree(run, ignore_errors=True)


async def _keep_book(book: BookLoad, period: float) -> None:
    """Poll the book (and resubmit it when it ends) between the windows' own samples."""
    while True:
        await asyncio.sleep(period)
        try:
            await book.sample()
        except Exception as exc:  # noqa: BLE001 - a broken poll must not end the run; it is reported
            book.errors.append(f"{type(exc).__name__}: {exc}")
            if len(book.errors) > 20:
                log.warning("book polling keeps failing (last: %s); no more polls", exc)
                return


async def pick_voices(args, target: Target) -> list[str]:
    status, _, body = await http_request(target, "GET", "/v1/voices", timeout=30.0)
    listed = [v["name"] for v in body.get("voices", [])] if status == 200 and isinstance(body, dict) else []
    if args.voice:
        want = [v.strip() for v in args.voice.split(",") if v.strip()]
        unknown = [v for v in want if listed and v not in listed]
        if unknown:
            raise DaemonError(f"voice(s) {', '.join(unknown)} not offered by the daemon; available: {', '.join(listed)}")
        return want
    if not listed:
        raise DaemonError("the daemon lists no voices (a Base checkpoint?): give --voice NAME of a saved voice, or "
                          "serve a CustomVoice checkpoint")
    return listed


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.load", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--dummy", choices=["0.6b", "1.7b"], help="start the daemon on random weights of this shape")
    src.add_argument("--model", help="start the daemon on this checkpoint folder (CustomVoice)")
    src.add_argument("--socket", help="use the daemon already listening on this Unix socket")
    src.add_argument("--url", help="use the daemon already listening here (http://127.0.0.1:PORT)")
    ap.add_argument("--device", help="model.device for the daemon: cuda, cuda:N, cpu (default cuda when starting one)")
    ap.add_argument("--dtype", help="model.dtype (default bfloat16 on CUDA, float32 on the CPU)")
    ap.add_argument("--slots", type=int, help="runtime.max_slots (default: the shipped config's)")
    ap.add_argument("--config-extra", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="more daemon settings (repeatable), e.g. runtime.max_queue=64")
    ap.add_argument("--tcp-port", type=int, help="serve and measure over loopback TCP on this port instead of the socket")
    ap.add_argument("--fixed-length", action=argparse.BooleanOptionalAction, default=None,
                    help="write min_new_tokens = frames + 1 into the served generation_config.json so every "
                         "response has exactly --frames frames, and count those that do not (default: on with "
                         "--dummy, off with --model; with --socket/--url: only the check, for a daemon whose "
                         "checkpoint is set up so)")
    ap.add_argument("--rates", default="1,4,10,20,30", help="comma list of arrival rates, requests/s")
    ap.add_argument("--arrivals", choices=["poisson", "constant"], default="poisson")
    ap.add_argument("--frames", type=int, default=60, help="max_frames per request (80 ms each; default 60 = 4.8 s)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds of load before each window (not measured)")
    ap.add_argument("--window", type=float, default=30.0, help="measured window, seconds")
    ap.add_argument("--drain-timeout", type=float, default=120.0,
                    help="seconds after the window for measured requests to finish (then: incomplete)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one request may take")
    ap.add_argument("--voice", help="comma list of voices (default: every voice the daemon lists)")
    ap.add_argument("--language", help="add this 'language' to each request (default: none, the model's auto)")
    ap.add_argument("--silence-threshold", type=float, default=0.001,
                    help="a sample counts as audio above this fraction of full scale (TTFA)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the arrival times, prompts and voices")
    ap.add_argument("--prime", action=argparse.BooleanOptionalAction, default=True,
                    help="ramp to the slot count once before the first rate")
    ap.add_argument("--book", type=int, metavar="SEGMENTS", help="keep a book job of about SEGMENTS segments running")
    ap.add_argument("--book-frames", type=int, default=150, help="frames per book segment with fixed length")
    ap.add_argument("--book-poll", type=float, default=1.0, help="seconds between book progress polls")
    ap.add_argument("--start-timeout", type=float, default=1800.0, help="seconds for the checkpoint and daemon start")
    ap.add_argument("--stop-timeout", type=float, default=90.0, help="seconds after SIGTERM before SIGKILL")
    ap.add_argument("--workdir", help="where the checkpoint and the daemon's home go (a temp folder inside it, "
                                      "removed at the end; default: the system's temp folder)")
    ap.add_argument("--daemon-log", help="daemon output (default: next to --json/--md, else a temp file)")
    ap.add_argument("--save-requests", action="store_true", help="every measured request in the JSON")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--md", help="write the markdown table here")
    args = ap.parse_args(argv)
    try:
        args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        ap.error(f"--rates {args.rates!r}: give numbers, e.g. 1,4,10")
    if not args.rates or any(r <= 0 for r in args.rates):
        ap.error("--rates: give one or more rates > 0")
    for name in ("frames", "window", "timeout", "book_frames", "book_poll", "start_timeout"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0")
    for name in ("warmup", "drain_timeout"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.slots is not None and args.slots < 1 or args.book is not None and args.book < 1:
        ap.error("--slots and --book must be >= 1")
    external = bool(args.socket or args.url)
    if external and (args.config_extra or args.slots or args.tcp_port is not None or args.book_frames != 150):
        ap.error("--config-extra, --slots, --tcp-port and --book-frames configure a daemon this benchmark starts; "
                 "with --socket/--url set them in that daemon's config")
    if args.url:
        try:
            Target.from_url(args.url)
        except ValueError as exc:
            ap.error(str(exc))
    for item in args.config_extra:
        try:
            set_dotted({}, item)
        except ValueError as exc:
            ap.error(str(exc))
    if not external:
        args.device = args.device or "cuda"
    if external:
        args.dtype = args.dtype or "dtype not given"
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.fixed_length is None:
        args.fixed_length = bool(args.dummy)
    args.length_known = args.fixed_length  # external daemons: only if their checkpoint is set up so
    if not args.daemon_log and not external:
        near = args.json or args.md
        args.daemon_log = (str(Path(near).with_suffix("")) + ".daemon.log" if near
                           else tempfile.mkstemp(prefix="tts-load-daemon-", suffix=".log")[1])
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    for out in (args.json, args.md, args.daemon_log):  # fail now, not after the run
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s load: %(message)s", stream=sys.stderr)
    res = {"benchmark": "open-loop streaming load (benchmarks/load.py)",
           "command": "python -m benchmarks.load " + shlex.join(argv),
           "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git_commit": git_commit(),
           "device": describe_device(args.device), "device_arg": args.device, "dtype": args.dtype,
           "model": f"dummy-{args.dummy} (random weights, seed 0)" if args.dummy else
                    Path(args.model).name if args.model else "external daemon's",
           "fixed_length": args.fixed_length,
           "workload": {"frames": args.frames, "audio_s_per_request": args.frames * SAMPLES_PER_FRAME / SAMPLE_RATE,
                        "expect_samples": args.frames * SAMPLES_PER_FRAME if args.length_known else None,
                        "arrivals": args.arrivals, "warmup_s": args.warmup, "window_s": args.window,
                        "drain_timeout_s": args.drain_timeout, "request_timeout_s": args.timeout,
                        "prompt_words": [8, 28], "language": args.language, "response_format": "pcm",
                        "silence_threshold": args.silence_threshold, "seed": args.seed, "rates": args.rates},
           "config_extra": args.config_extra, "levels": [], "error": None}
    code = 0
    try:
        asyncio.run(measure(args, res))
    except (DaemonError, BookError, OSError, ValueError, asyncio.TimeoutError) as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        print(f"load: {res['error']}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        res["error"] = "interrupted"
        code = 130
    except asyncio.CancelledError:
        res["error"] = "terminated (SIGTERM)"
        code = 143
    except Exception as exc:  # a bug here: still write what was measured, with the traceback
        res["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        print(f"load: {res['error']}", file=sys.stderr)
        code = 1
    if args.daemon_log and not (args.socket or args.url):
        res["daemon_log"] = Path(args.daemon_log).name
    text = json.dumps(res, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    md = markdown(res)
    if args.md:
        Path(args.md).write_text(md, encoding="utf-8")
    sys.stdout.write(md)
    if code == 0 and not res["levels"]:
        code = 1
    return code


if __name__ == "__main__":
    raise SystemExit(main())
