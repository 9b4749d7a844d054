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
import logging
import sys
from pathlib import Path

from benchmarks.load.book import BookError, BookLoad
from benchmarks.load.harness import (add_daemon_args, add_window_args, base_result, check_alive, check_daemon_args, pick_voices,
                                     run_cli, served)
from benchmarks.load.level import Load, one_line, prime, run_level
from benchmarks.load.report import markdown
from benchmarks.load.stats import SAMPLE_RATE, SAMPLES_PER_FRAME

log = logging.getLogger("load")
PROG = "python -m benchmarks.load"


# -- the run ------------------------------------------------------------------------------------------
async def measure(args, res: dict) -> None:
    """Everything against one daemon; fills `res` as it goes (so a failure keeps what was measured)."""
    longest = max(args.frames, args.book_frames if args.book else 0)  # every request and book segment runs to its own limit
    async with served(args, res, longest + 1) as srv:
        book = keeper = None
        target, daemon = srv.target, srv.daemon
        try:
            voices = await pick_voices(args, target)
            res["workload"]["voices"] = voices
            slots = (srv.health.get("engine") or {}).get("max_slots") or args.slots or 1
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
                db = Path(srv.config["jobs"]["home"]).expanduser() / "queue.db" if daemon else None
                book = load.book = BookLoad(target, args.book, spec, db)
                job = await book.submit_next()
                res["book"] = {"segments_requested": args.book, "segments": job["total"], "frames_per_segment":
                               args.book_frames if fixed else None, "submit_shape": book.shape}
                log.info("book job %s: %s segments (%s)", job["id"], job["total"], book.shape)
                keeper = asyncio.create_task(_keep_book(book, args.book_poll))
            for i, rate in enumerate(args.rates):
                check_alive(daemon, args.daemon_log)
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


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_daemon_args(ap, PROG)
    ap.add_argument("--rates", default="1,4,10,20,30", help="comma list of arrival rates, requests/s")
    ap.add_argument("--arrivals", choices=["poisson", "constant"], default="poisson")
    ap.add_argument("--frames", type=int, default=60, help="max_frames per request (80 ms each; default 60 = 4.8 s)")
    add_window_args(ap, "request", "ramp to the slot count once before the first rate")
    ap.add_argument("--book", type=int, metavar="SEGMENTS", help="keep a book job of about SEGMENTS segments running")
    ap.add_argument("--book-frames", type=int, default=150, help="frames per book segment with fixed length")
    ap.add_argument("--book-poll", type=float, default=1.0, help="seconds between book progress polls")
    ap.add_argument("--save-requests", action="store_true", help="every measured request in the JSON")
    args = ap.parse_args(argv)
    try:
        args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        ap.error(f"--rates {args.rates!r}: give numbers, e.g. 1,4,10")
    if not args.rates or any(r <= 0 for r in args.rates):
        ap.error("--rates: give one or more rates > 0")
    for name in ("frames", "window", "timeout", "book_frames", "book_poll"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0")
    for name in ("warmup", "drain_timeout"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.book is not None and args.book < 1:
        ap.error("--book must be >= 1")
    check_daemon_args(ap, args, daemon_only=(("--book-frames", args.book_frames != 150),))
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    res = base_result(args, argv, "open-loop streaming load (benchmarks/load.py)", PROG)
    res["workload"] = {"frames": args.frames, "audio_s_per_request": args.frames * SAMPLES_PER_FRAME / SAMPLE_RATE,
                       "expect_samples": args.frames * SAMPLES_PER_FRAME if args.length_known else None,
                       "arrivals": args.arrivals, "warmup_s": args.warmup, "window_s": args.window,
                       "drain_timeout_s": args.drain_timeout, "request_timeout_s": args.timeout,
                       "prompt_words": [8, 28], "language": args.language, "response_format": "pcm",
                       "silence_threshold": args.silence_threshold, "seed": args.seed, "rates": args.rates}
    return run_cli(args, res, measure, markdown, "load", expected=(BookError,))


if __name__ == "__main__":
    raise SystemExit(main())
