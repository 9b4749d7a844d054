"""Live text over the WebSocket (GET /v1/audio/speech/live) against the real daemon: time from the first
word sent to the first audio, and from the last word to the end, at 1, 16, ... concurrent sessions.

    # GPU: the shipped daemon on random weights of the 1.7B shape, 1 then 16 concurrent sessions
    python -m benchmarks.live --dummy 1.7b --device cuda --dtype bfloat16 --slots 64 --sessions 1,16 \\
        --json live.json --md live.md
    # the same text typed by a person (3 words per second) instead of a language model (15)
    python -m benchmarks.live --dummy 1.7b --device cuda --dtype bfloat16 --slots 64 --sessions 1,16 \\
        --words-per-s 3 --json live_typist.json --md live_typist.md
    # a checkpoint folder on the CPU (the tiny test model; figures mean little there)
    python -m benchmarks.live --model tests/data/tiny/cv_small --fixed-length --device cpu --slots 4 \\
        --frames 4 --words 12 --sessions 1,2 --warmup 1 --window 4 --config-extra model.threads=1
    # a daemon that is already running (Unix socket or loopback TCP)
    python -m benchmarks.live --socket /run/tts-appliance/api.sock --sessions 1,16
    python -m benchmarks.live --url http://127.0.0.1:8732 --sessions 1,16

The daemon is chosen, started and stopped as by the open-loop load benchmark (benchmarks/load/; the
same options: --dummy, --model, --socket, --url, --device, --dtype, --slots, --config-extra, --tcp-port,
--fixed-length, --daemon-log). Length: every sentence is one engine request; with --dummy (or --model
with --fixed-length) the served generation_config.json gets `min_new_tokens` = frames + 1 and every
session sends `max_frames` = --frames (default 60 = 4.8 s then), so each sentence is exactly that long
and sessions of another length are counted. Without fixed length, `max_frames` is sent only if --frames
is given.

Workload per level of --sessions (each level in turn, against the same daemon): that many sessions at
once, each one over and over: open the WebSocket, send session.update (a voice of --voice or of the
daemon's list, round-robin; --language; max_frames), then an English text of --words words (from the
load benchmark's corpus, starting at a sentence, ending with a full stop) one word at a time at
--words-per-s, as `input_text.append` of the word and the space after it (the last word without one),
then input_text.end; read until `done` (or `error`). Event types this client does not know are counted
and ignored. A warm-up (--warmup s, not measured), then the measured window (--window s): sessions
started inside it are measured; the sessions go on after the window until the measured ones have ended
or --drain-timeout runs out (those still running are then cancelled and counted as incomplete). A
session that failed is followed by the next one after 0.5 s. Before the first level, --prime (default
on) ramps POST /v1/audio/speech streams one at a time up to the largest level, so each batch size has
run once (graphs are captured on first use).

Measured on the client (this process, asyncio and aiohttp, time.perf_counter, per session): first audio
= the first word sent -> the first sample with |x| > --silence-threshold received; sentence -> audio =
the word that completed the first sentence sent (a sentence ends once whitespace follows its mark, as
the server splits; input_text.end when none is complete before it) -> that same first audio (the
server's part of the first figure); end = the last
word (input_text.end) sent -> `done` received; audio seconds. Gaps: a player that starts at the first
sample, plays in real time without a buffer and waits whenever it runs dry: a wait that begins after
input_text.end was sent is an underrun (the server had all the text), one that begins earlier is
counted apart (the text was still arriving). Per level: first audio p50/p95/max, sentence -> audio,
end p50/p95/max, underruns and their gap, completed share, errors by kind ('http_<status>' at the
handshake, 'connect', 'server_<code>' for an error event, 'closed' when the server closed without
`done`, 'timeout' after --timeout, 'protocol'), the engine's audio-s/s during the window (GET /health).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import time
from collections import Counter

from benchmarks.live_session import live_session, ws_endpoint
from benchmarks.live_stats import summarize
from benchmarks.load.client import Target, engine_stats
from benchmarks.load.harness import (add_daemon_args, add_window_args, base_result, check_alive, check_daemon_args, pick_voices,
                                     run_cli, served)
from benchmarks.load.level import Load, engine_window, lag_monitor, prime
from benchmarks.load.report import fmt, stopped_note
from benchmarks.load.stats import ms, percentile
from benchmarks.load.text import WORDS, prompt

log = logging.getLogger("live")
PROG = "python -m benchmarks.live"
FIXED_FRAMES = 60  # --frames with a fixed length when none is given (4.8 s per sentence)
RETRY_PAUSE_S = 0.5  # after a failed session, before the next one


# -- one level ------------------------------------------------------------------------------------------
class Live:
    """What every level shares: the HTTP session, the route, the voices, the options."""

    def __init__(self, args, target: Target, http, url: str, voices: list[str]):
        self.args, self.target, self.http, self.url, self.voices = args, target, http, url, voices
        self.threshold = max(0, int(args.silence_threshold * 32768))
        self.started = 0  # sessions opened (voices go round-robin)

    def update(self) -> dict:
        a, u = self.args, {"voice": self.voices[self.started % len(self.voices)]}
        self.started += 1
        if a.language:
            u["language"] = a.language
        if a.frames:
            u["max_frames"] = a.frames
        u["text_mode"] = a.text_mode
        return u


async def run_level(live: Live, sessions: int, index: int) -> dict:
    """`sessions` concurrent sessions back to back: warm-up, the measured window, the drain."""
    a = live.args
    t_start = time.perf_counter()
    warm_end, win_end = t_start + a.warmup, t_start + a.warmup + a.window
    deadline = win_end + a.drain_timeout
    measured, phases = [], Counter()
    state = {"outstanding": 0}
    idle = asyncio.Event()
    lags: list[float] = []
    stop_lag = asyncio.Event()
    lag_task = asyncio.create_task(lag_monitor(stop_lag, lags))
    expect = a.frames if a.length_known else None

    async def worker(w: int) -> None:
        rng = random.Random(a.seed * 1_000_003 + index * 1_009 + w)
        await asyncio.sleep(min(1.0, a.warmup) * w / sessions)  # not all in lockstep
        while time.perf_counter() < win_end:
            now = time.perf_counter()
            phase = "warmup" if now < warm_end else "measured"
            phases[phase] += 1
            rec = {"phase": phase, "worker": w, "t_start_s": round(now - t_start, 4)}
            if phase == "measured":
                measured.append(rec)
                state["outstanding"] += 1
            try:
                await live_session(live.http, live.url, live.update(), prompt(rng, a.words, a.words), a.words_per_s,
                                   a.timeout, live.threshold, expect, rec=rec,
                                   sentences_mode=a.text_mode == "sentences")
            finally:
                if phase == "measured":
                    state["outstanding"] -= 1
                    if state["outstanding"] == 0 and time.perf_counter() >= win_end:
                        idle.set()
            if rec["error"]:
                await asyncio.sleep(RETRY_PAUSE_S)
        # after the window: the same load while measured sessions finish
        while not idle.is_set():
            phases["cooldown"] += 1
            rec = {}
            await live_session(live.http, live.url, live.update(), prompt(rng, a.words, a.words), a.words_per_s,
                               a.timeout, live.threshold, expect, rec=rec,
                               sentences_mode=a.text_mode == "sentences")
            if rec["error"]:
                await asyncio.sleep(RETRY_PAUSE_S)

    async def window_marks() -> dict:  # engine counters at the window's edges
        marks = {}
        for edge, at in (("start", warm_end), ("end", win_end)):
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            marks[edge] = {"engine": await engine_stats(live.target), "t": time.perf_counter()}
        return marks

    marks_task = asyncio.create_task(window_marks())
    workers = [asyncio.create_task(worker(w)) for w in range(sessions)]
    await asyncio.sleep(max(0.0, win_end - time.perf_counter()))
    if state["outstanding"] == 0:
        idle.set()
    try:
        await asyncio.wait_for(idle.wait(), max(0.0, deadline - time.perf_counter()))
    except asyncio.TimeoutError:
        log.warning("%d sessions: %d measured sessions still running after the %.0f s drain timeout: cancelled",
                    sessions, state["outstanding"], a.drain_timeout)
    idle.set()
    for task in workers:
        task.cancel()
    for result in await asyncio.gather(*workers, return_exceptions=True):
        if isinstance(result, Exception):  # a bug in the client, not a cancelled worker: say so
            marks_task.cancel()
            stop_lag.set()
            raise result
    marks = await marks_task
    stop_lag.set()
    await lag_task
    if not measured:
        log.warning("%d sessions: no session started inside the %.0f s window (each lasts longer than warm-up and "
                    "window): give a longer --window", sessions, a.window)

    out = {"sessions": sessions, **summarize(measured, a.window), "started": dict(phases),
           "client_loop_lag_ms": {"p99": ms(percentile(lags, 0.99)), "max": ms(max(lags) if lags else None)}}
    engine = engine_window(marks["start"], marks["end"])
    if engine:
        out["engine"] = engine
    details = Counter(f"{r['error']}: {r.get('detail', '')[:120]}" for r in measured if r.get("detail"))
    if details:
        out["error_details"] = dict(details.most_common(5))
    out["records"] = [_compact(r) for r in measured] if a.save_sessions else None
    return out


def _compact(r: dict) -> dict:
    out = {k: r.get(k) for k in ("phase", "worker", "t_start_s", "error", "completed", "samples", "sentences", "spoken",
                                 "underrun", "gaps_before_end")}
    for k in ("first_audio_s", "sentence_audio_s", "end_done_s", "connect_s", "gap_after_end_s", "send_lag_s"):
        out[k[:-2] + "_ms"] = ms(r.get(k))
    return out


def one_line(x: dict) -> str:
    f, e = x["first_audio_ms"], x["end_to_done_ms"]
    return (f"{x['measured']} measured, {x['completed']} completed; first audio p50 {f['p50']} p95 {f['p95']} "
            f"max {f['max']} ms; end p50 {e['p50']} p95 {e['p95']} ms; underruns {x['underruns']}; "
            f"errors {x['errors'] or 'none'}")


# -- the run ----------------------------------------------------------------------------------------------
async def measure(args, res: dict) -> None:
    """Every level against one daemon; fills `res` as it goes (so a failure keeps what was measured)."""
    import aiohttp

    async with served(args, res, args.frames + 1 if args.frames else None) as srv:
        voices = await pick_voices(args, srv.target)
        res["workload"]["voices"] = voices
        res["slots"] = (srv.health.get("engine") or {}).get("max_slots") or args.slots
        if args.prime:
            most = max(args.sessions)
            log.info("priming: ramping to %d concurrent streams", most)
            res["prime"] = await prime(Load(args, srv.target, voices, None), most)
            log.info("primed in %.1f s", res["prime"]["wall_s"])
        connector, url = ws_endpoint(srv.target)
        async with aiohttp.ClientSession(connector=connector) as http:
            live = Live(args, srv.target, http, url, voices)
            for i, n in enumerate(args.sessions):
                check_alive(srv.daemon, args.daemon_log)
                log.info("%d sessions: %.0f s warm-up + %.0f s window", n, args.warmup, args.window)
                level = await run_level(live, n, i)
                res["levels"].append(level)
                log.info("%d sessions: %s", n, one_line(level))


def markdown(res: dict) -> str:
    w = res["workload"]
    frames = f"{w['frames']} frames per sentence" if w["frames"] else "sentences as long as the model makes them"
    lines = [f"### Live text over the WebSocket: {res['model']}, {res['dtype']}, {res['device']}", "",
             f"`{res['command']}`", "",
             f"{w['words']} words per session sent one at a time at {w['words_per_s']:g} words/s, {frames}; per "
             f"level {w['warmup_s']:g} s warm-up, then sessions started in a {w['window_s']:g} s window are measured; "
             f"{res.get('slots') or '?'} slots; over {res.get('transport', '?')}; daemon {res.get('daemon', '?')}. "
             "First audio = first word sent -> first non-silent sample received; sentence -> audio = the word that "
             "completed the first sentence sent -> the same sample; end = last word (input_text.end) sent -> done; "
             "underrun = a real-time player without a buffer, starting at the first audio, runs dry after the "
             "text has ended.", ""]
    head = ("| sessions | measured | completed | first audio p50 / p95 / max ms | sentence -> audio p50 / p95 ms "
            "| end p50 / p95 / max ms | underruns (gap max ms) | audio s per session | errors |")
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    notes = []
    for x in res["levels"]:
        f, s, e = x["first_audio_ms"], x["sentence_to_audio_ms"], x["end_to_done_ms"]
        errors = ", ".join(f"{k}: {v}" for k, v in x["errors"].items())
        if x["incomplete"]:
            errors = (errors + ", " if errors else "") + f"incomplete: {x['incomplete']}"
        share = "-" if x["completed_share"] is None else f"{100 * x['completed_share']:.1f}%"
        under = ("-" if x["underrun_share"] is None else
                 f"{x['underruns']} ({100 * x['underrun_share']:.1f}%)"
                 + (f" ({fmt(x['gap_after_end_ms']['max'])})" if x["underruns"] else ""))
        lines.append(f"| {x['sessions']} | {x['measured']} | {share} | {fmt(f['p50'])} / {fmt(f['p95'])} / "
                     f"{fmt(f['max'])} | {fmt(s['p50'])} / {fmt(s['p95'])} | {fmt(e['p50'])} / {fmt(e['p95'])} / "
                     f"{fmt(e['max'])} | {under} | {fmt(x['audio_s_per_session']['mean'], nd=2)} | {errors or '-'} |")
        n = x["sessions"]
        if not x["measured"]:
            notes.append(f"{n} sessions: no session started inside the window (each lasts longer than warm-up and "
                         "window: give a longer --window)")
        if x["length_mismatches"]:
            notes.append(f"{n} sessions: {x['length_mismatches']} sessions of another length than requests x "
                         f"{w['frames']} frames")
        if x["audio_seconds_mismatches"]:
            notes.append(f"{n} sessions: {x['audio_seconds_mismatches']} `done` events whose audio_seconds differ "
                         "from the audio received")
        if x["silent"]:
            notes.append(f"{n} sessions: {x['silent']} completed sessions had no sample above the silence threshold")
        if x["gaps_while_text_arrived"]:
            notes.append(f"{n} sessions: in {x['gaps_while_text_arrived']} completed sessions the player ran dry "
                         "while text was still arriving (waiting for the next sentence; not counted as underruns)")
        lag = x["client_loop_lag_ms"]["p99"]
        send = x["send_lag_ms"]["p99"]
        if lag is not None and lag > 5.0 or send is not None and send > 20.0:
            notes.append(f"{n} sessions: the client's event loop woke {fmt(lag)} ms late and sent words "
                         f"{fmt(send)} ms late at p99: the client may have added to the figures")
        eng = x.get("engine") or {}
        if eng.get("graphs_captured_in_window"):
            notes.append(f"{n} sessions: the engine captured {eng['graphs_captured_in_window']} new graphs during "
                         "the window (first use of a batch size): their capture time is in the figures")
        if x["unknown_events"]:
            notes.append(f"{n} sessions: {x['unknown_events']} events of types this benchmark does not know "
                         "(ignored)")
    if not res["fixed_length"]:
        notes.append("lengths are not fixed (a real checkpoint stops where its speech ends)")
    if res.get("prime"):
        p = res["prime"]
        notes.append(f"primed with {p['requests']} streams ramped to the largest level in {p['wall_s']} s"
                     + (f" (errors: {p['errors']})" if p["errors"] else ""))
    notes += stopped_note(res)
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_daemon_args(ap, PROG)
    ap.add_argument("--sessions", default="1,16", help="comma list of concurrent session counts, one level each")
    ap.add_argument("--words", type=int, default=40, help="words of text per session")
    ap.add_argument("--text-mode", choices=("words", "sentences"), default="words",
                    help="the session's text_mode: words (the model's streaming-text mode; the default) or "
                         "sentences (each sentence spoken once complete)")
    ap.add_argument("--words-per-s", type=float, default=15.0,
                    help="words sent per second (15: a language model's output; 3: a person typing)")
    ap.add_argument("--frames", type=int,
                    help=f"max_frames per sentence (80 ms each; default with a fixed length {FIXED_FRAMES}, "
                         "else not sent)")
    add_window_args(ap, "session", "ramp streams to the largest level once before the first level")
    ap.add_argument("--save-sessions", action="store_true", help="every measured session in the JSON")
    args = ap.parse_args(argv)
    try:
        args.sessions = [int(n) for n in args.sessions.split(",") if n.strip()]
    except ValueError:
        ap.error(f"--sessions {args.sessions!r}: give whole numbers, e.g. 1,16")
    if not args.sessions or any(n < 1 for n in args.sessions):
        ap.error("--sessions: give one or more counts >= 1")
    if not 1 <= args.words <= len(WORDS):
        ap.error(f"--words must be 1..{len(WORDS)}")
    for name in ("words_per_s", "window", "timeout"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0")
    for name in ("warmup", "drain_timeout"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.frames is not None and args.frames < 1:
        ap.error("--frames must be >= 1")
    check_daemon_args(ap, args)
    if args.fixed_length and args.frames is None:
        args.frames = FIXED_FRAMES
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    res = base_result(args, argv, "live text over the WebSocket (benchmarks/live.py)", PROG)
    res["workload"] = {"words": args.words, "words_per_s": args.words_per_s, "text_s": (args.words - 1) / args.words_per_s,
                       "frames": args.frames, "text_mode": args.text_mode, "warmup_s": args.warmup, "window_s": args.window,
                       "drain_timeout_s": args.drain_timeout, "session_timeout_s": args.timeout,
                       "language": args.language, "silence_threshold": args.silence_threshold, "seed": args.seed,
                       "sessions": args.sessions}
    return run_cli(args, res, measure, markdown, "live")


if __name__ == "__main__":
    raise SystemExit(main())
