"""What the daemon benchmarks share (benchmarks/load/ and benchmarks/live.py): the options that choose
and configure the daemon, starting it (or checking one that runs) around a measurement, the voices
it offers, and the command-line shell that writes the JSON and markdown whatever happened.

    ap = argparse.ArgumentParser(...)
    add_daemon_args(ap, "python -m benchmarks.NAME")
    ...                                   # the benchmark's own options
    args = ap.parse_args(argv)
    check_daemon_args(ap, args)
    res = base_result(args, argv, "what it measures", "python -m benchmarks.NAME")
    return run_cli(args, res, measure, markdown, "NAME")   # measure(args, res): `async with served(...)`
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
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable, Optional

from benchmarks.load.client import Target, http_request
from benchmarks.load.daemon import (DaemonError, DaemonProcess, child_env, force_min_frames, link_checkpoint,
                                    set_dotted, write_dummy)
from benchmarks.load.report import describe_device, git_commit, redact
from benchmarks.load.stats import SAMPLE_RATE

log = logging.getLogger(__name__)
RUN_PREFIX = "tts-load-run-"  # a short runtime folder in /tmp when the workdir's path is too long for a socket


def add_window_args(ap: argparse.ArgumentParser, unit: str, prime_help: str) -> None:
    """The options of a measured level: warm-up, window, drain, per-`unit` timeout, seed, priming."""
    ap.add_argument("--warmup", type=float, default=10.0, help=f"seconds of {unit}s before each window (not measured)")
    ap.add_argument("--window", type=float, default=30.0, help="measured window, seconds")
    ap.add_argument("--drain-timeout", type=float, default=120.0,
                    help=f"seconds after the window for measured {unit}s to finish (then: incomplete)")
    ap.add_argument("--timeout", type=float, default=300.0, help=f"seconds one {unit} may take")
    ap.add_argument("--seed", type=int, default=0, help="seed of the arrival times, texts and voices")
    ap.add_argument("--prime", action=argparse.BooleanOptionalAction, default=True, help=prime_help)


def add_daemon_args(ap: argparse.ArgumentParser, prog: str) -> None:
    """The options that pick the daemon (--dummy, --model, --socket, --url; one is required), configure
    one this benchmark starts, and name the outputs."""
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
                         "request (each sentence of a live session) has exactly --frames frames, and count "
                         "answers of another length (default: on with "
                         "--dummy, off with --model; with --socket/--url: only the check, for a daemon whose "
                         "checkpoint is set up so)")
    ap.add_argument("--voice", help="comma list of voices (default: every voice the daemon lists)")
    ap.add_argument("--language", help="add this 'language' to each request (default: none, the model's auto)")
    ap.add_argument("--silence-threshold", type=float, default=0.001,
                    help="a sample counts as audio above this fraction of full scale (first audio)")
    ap.add_argument("--start-timeout", type=float, default=1800.0, help="seconds for the checkpoint and daemon start")
    ap.add_argument("--stop-timeout", type=float, default=90.0, help="seconds after SIGTERM before SIGKILL")
    ap.add_argument("--workdir", help="where the checkpoint and the daemon's home go (a temp folder inside it, "
                                      "removed at the end; default: the system's temp folder)")
    ap.add_argument("--daemon-log", help="daemon output (default: next to --json/--md, else a temp file)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--md", help="write the markdown table here")
    ap.set_defaults(prog_name=prog)


def check_daemon_args(ap: argparse.ArgumentParser, args, daemon_only: tuple = ()) -> None:
    """Validate the options of add_daemon_args and fill in their defaults (device, dtype, fixed_length,
    length_known, daemon_log). `daemon_only`: more (flag, is-set) pairs that only make sense for a
    daemon this benchmark starts."""
    if args.slots is not None and args.slots < 1:
        ap.error("--slots must be >= 1")
    if args.start_timeout <= 0:
        ap.error("--start-timeout must be > 0")
    external = bool(args.socket or args.url)
    own = [("--config-extra", bool(args.config_extra)), ("--slots", bool(args.slots)),
           ("--tcp-port", args.tcp_port is not None), *daemon_only]
    if external and any(used for _, used in own):
        ap.error(f"{', '.join(flag for flag, _ in own)} configure a daemon this benchmark starts; "
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


def daemon_config(args, workdir: Path, checkpoint: Path) -> dict:
    """The generated config: shipped defaults plus what this run needs, then --config-extra."""
    run = workdir / "run"
    if len(str(run / "api.sock")) > 100:  # AF_UNIX paths are limited to about 107 bytes
        run = Path(tempfile.mkdtemp(prefix=RUN_PREFIX, dir="/tmp"))  # removed with the daemon's files
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


@dataclass
class Served:
    """The daemon a measurement runs against: where to reach it and its /health answer; for one this
    benchmark started, the process and its effective configuration too."""

    target: Target
    health: dict
    daemon: Optional[DaemonProcess] = None
    config: Optional[dict] = None


@asynccontextmanager
async def served(args, res: dict, min_new_tokens: Optional[int] = None) -> AsyncIterator[Served]:
    """The daemon of --socket/--url (checked with GET /health), or one started for the block on a
    checkpoint written or linked into a temp folder (`min_new_tokens` into its generation_config.json
    with --fixed-length) and stopped with SIGTERM after it. Notes what it did in `res` as it goes.
    SIGTERM to this process cancels the calling task: the block ends, the daemon is stopped."""
    workdir = daemon = effective = None
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
            if args.fixed_length and min_new_tokens:  # every request runs to its own frame limit
                res["generation_config"] = force_min_frames(checkpoint, min_new_tokens)
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
        yield Served(target, health, daemon, effective)
    finally:
        if daemon:
            res["daemon_exit"] = daemon.stop(args.stop_timeout)
            if daemon.proc is not None and daemon.proc.returncode not in (0, None):
                log.warning("daemon exit status %s; log tail:\n%s", daemon.proc.returncode, daemon.log_tail(30))
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
            run = Path((effective or {}).get("service", {}).get("runtime_dir") or workdir)
            if run.name.startswith(RUN_PREFIX):
                shutil.rmtree(run, ignore_errors=True)


def check_alive(daemon: Optional[DaemonProcess], log_path) -> None:
    """DaemonError (with its log's tail) if the daemon this benchmark started has exited."""
    if daemon is not None and not daemon.alive():
        raise DaemonError(f"the daemon exited (status {daemon.proc.returncode}); log {log_path}:\n{daemon.log_tail()}")


async def pick_voices(args, target: Target) -> list[str]:
    """--voice (each checked against the daemon's list), else every voice the daemon lists."""
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


def base_result(args, argv: list, benchmark: str, prog: str) -> dict:
    """The start of a result: what ran, where, on what (the benchmark adds 'workload')."""
    return {"benchmark": benchmark, "command": f"{prog} " + shlex.join(argv),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git_commit": git_commit(),
            "device": describe_device(args.device), "device_arg": args.device, "dtype": args.dtype,
            "model": f"dummy-{args.dummy} (random weights, seed 0)" if args.dummy else
                     Path(args.model).name if args.model else "external daemon's",
            "fixed_length": args.fixed_length, "config_extra": args.config_extra, "levels": [], "error": None}


def run_cli(args, res: dict, measure: Callable[..., Awaitable[None]], markdown: Callable[[dict], str],
            name: str, expected: tuple = ()) -> int:
    """Run `measure(args, res)` and write --json and --md (and the markdown on stdout) whatever
    happened: an error, SIGTERM or Ctrl-C keeps what was measured, with res['error'] saying why it
    stopped (a traceback too unless the error is a DaemonError, OSError, ValueError, timeout or one of
    `expected`). Returns the exit status (1 also when no level was measured)."""
    for out in (args.json, args.md, args.daemon_log):  # fail now, not after the run
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name}: %(message)s", stream=sys.stderr)
    code = 0
    try:
        asyncio.run(measure(args, res))
    except (DaemonError, OSError, ValueError, asyncio.TimeoutError, *expected) as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        print(f"{name}: {res['error']}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        res["error"] = "interrupted"
        code = 130
    except asyncio.CancelledError:
        res["error"] = "terminated (SIGTERM)"
        code = 143
    except Exception as exc:  # a bug here: still write what was measured, with the traceback
        res["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        print(f"{name}: {res['error']}", file=sys.stderr)
        code = 1
    if args.daemon_log and not (args.socket or args.url):
        res["daemon_log"] = Path(args.daemon_log).name
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    md = markdown(res)
    if args.md:
        Path(args.md).write_text(md, encoding="utf-8")
    sys.stdout.write(md)
    if code == 0 and not res["levels"]:
        code = 1
    return code
