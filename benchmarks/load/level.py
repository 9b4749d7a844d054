"""One arrival rate of the open-loop load benchmark (benchmarks/load.py): the schedule, the requests,
the measured window and its summary; and the priming ramp before the first rate."""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from typing import Optional

from benchmarks.load.book import BookLoad
from benchmarks.load.client import Target, engine_stats, stream_speech
from benchmarks.load.stats import SAMPLE_RATE, SAMPLES_PER_FRAME, arrivals, ms, percentile, summarize
from benchmarks.load.text import prompt

log = logging.getLogger("load")


class Load:
    """What every rate shares: where the daemon is, the request template, the options."""

    def __init__(self, args, target: Target, voices: list[str], book: Optional[BookLoad]):
        self.args, self.target, self.voices, self.book = args, target, voices, book
        self.threshold = max(0, int(args.silence_threshold * 32768))
        self.expect = args.frames * SAMPLES_PER_FRAME if args.length_known else None

    def payload(self, rng: random.Random) -> dict:
        p = {"input": prompt(rng), "voice": rng.choice(self.voices), "response_format": "pcm", "stream": True,
             "max_frames": self.args.frames}
        if self.args.language:
            p["language"] = self.args.language
        return p



async def lag_monitor(stop: asyncio.Event, out: list, period: float = 0.005) -> None:
    """How late the client's event loop wakes up (its own health: a busy client would delay reads)."""
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(period)
        out.append(time.perf_counter() - t - period)


async def run_level(load: Load, rate: float, index: int) -> dict:
    a = load.args
    rng = random.Random(a.seed * 1_000_003 + index)
    schedule = arrivals(rate, a.arrivals, seed=rng.randrange(2**31))
    t_start = time.perf_counter()
    warm_end, win_end = t_start + a.warmup, t_start + a.warmup + a.window
    deadline = win_end + a.drain_timeout
    measured, tasks, phases = [], {}, Counter()
    state = {"inflight": 0, "peak": 0, "outstanding": 0, "measuring": False}
    idle = asyncio.Event()
    idle.set()
    lags: list[float] = []
    stop_lag = asyncio.Event()
    lag_task = asyncio.create_task(lag_monitor(stop_lag, lags))

    async def one(rec: dict, payload: dict, phase: str) -> None:
        state["inflight"] += 1
        if state["measuring"]:
            state["peak"] = max(state["peak"], state["inflight"])
        try:
            await stream_speech(load.target, payload, a.timeout, load.threshold, rec=rec)
        except asyncio.CancelledError:
            pass  # the record says 'incomplete'
        finally:
            state["inflight"] -= 1
            if phase == "measured":
                state["outstanding"] -= 1
                if state["outstanding"] == 0:
                    idle.set()

    async def window_marks() -> dict:  # book and engine counters at the window's edges
        marks = {}
        for edge, at in (("start", warm_end), ("end", win_end)):
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            marks[edge] = {"engine": await engine_stats(load.target), "t": time.perf_counter()}
            marks[edge]["book"] = await load.book.sample() if load.book else None
        return marks

    marks_task = asyncio.create_task(window_marks())
    for offset in schedule:
        t_target = t_start + offset
        if t_target >= deadline:
            break
        now = time.perf_counter()
        if t_target >= win_end:  # after the window: keep the load on while measured requests finish
            try:
                await asyncio.wait_for(idle.wait(), max(0.0, min(t_target, deadline) - now))
                break
            except asyncio.TimeoutError:
                if time.perf_counter() >= deadline:
                    break
        elif t_target > now:
            await asyncio.sleep(t_target - now)
        phase = "warmup" if t_target < warm_end else "measured" if t_target < win_end else "cooldown"
        phases[phase] += 1
        rec = {"phase": phase, "t_sched_s": round(offset, 4), "send_lag_s": time.perf_counter() - t_target}
        if phase == "measured":
            measured.append(rec)
            state["outstanding"] += 1
            state["measuring"] = True
            idle.clear()
        task = asyncio.create_task(one(rec, load.payload(rng), phase))
        tasks[task] = rec
    if not idle.is_set():
        try:
            await asyncio.wait_for(idle.wait(), max(0.0, deadline - time.perf_counter()))
        except asyncio.TimeoutError:
            log.warning("rate %g: %d measured requests still running after the %.0f s drain timeout: cancelled",
                        rate, state["outstanding"], a.drain_timeout)
    state["measuring"] = False
    for task, rec in tasks.items():
        if rec["phase"] == "measured" and not task.done():
            task.cancel()
    rest = [t for t in tasks if not t.done()]
    if rest:  # warm-up and cool-down requests: let them end so the next rate starts from idle
        _, pending = await asyncio.wait(rest, timeout=min(a.timeout, 120.0))
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=10.0)
    marks = await marks_task
    stop_lag.set()
    await lag_task

    s = summarize(measured, a.window, load.expect)
    out = {"rate": rate, **s, "peak_in_flight": state["peak"], "sent": dict(phases),
           "client_loop_lag_ms": {"p99": ms(percentile(lags, 0.99)), "max": ms(max(lags) if lags else None)}}
    engine = engine_window(marks["start"], marks["end"])
    if engine:
        out["engine"] = engine
    if load.book:
        out["book"] = book_window(marks["start"]["book"], marks["end"]["book"])
    details = Counter(f"{r['error']}: {r.get('detail', '')[:120]}" for r in measured if r.get("detail"))
    if details:
        out["error_details"] = dict(details.most_common(5))
    out["requests"] = [_compact(r) for r in measured] if a.save_requests else None
    return out


def engine_window(m0: dict, m1: dict) -> Optional[dict]:
    """The engine's audio-s/s and new graph captures between two marks {"engine": GET /health's engine,
    "t": perf_counter}; None when a mark has no frame count."""
    e0, e1, span = m0["engine"], m1["engine"], m1["t"] - m0["t"]
    if "frames" not in e0 or "frames" not in e1 or span <= 0:
        return None
    out = {"audio_s_per_s": round((e1["frames"] - e0["frames"]) * SAMPLES_PER_FRAME / SAMPLE_RATE / span, 2),
           "graphs_captured_in_window": (e1.get("graphs") or 0) - (e0.get("graphs") or 0)}
    p0, p1 = e0.get("ttfa_phases_s"), e1.get("ttfa_phases_s")
    if p0 and p1 and p1["n"] > p0["n"]:  # the engine's share of TTFA, mean per stream in the window
        n = p1["n"] - p0["n"]
        out["engine_ttfa_mean_ms"] = {k: round((p1[k] - p0[k]) / n * 1000, 2) for k in p1 if k != "n"} | {"n": n}
    return out


def book_window(b0: Optional[dict], b1: Optional[dict]) -> dict:
    if not b0 or not b1 or b1["t"] <= b0["t"]:
        return {"error": "no book samples"}
    span = b1["t"] - b0["t"]
    done = b1["done"] - b0["done"]
    audio = b1["audio_s"] - b0["audio_s"] if b0["audio_s"] is not None and b1["audio_s"] is not None else None
    return {"segments_done": done, "segments_per_s": round(done / span, 3),
            "audio_s_per_s": round(audio / span, 2) if audio is not None else None,
            "audio_source": b1["audio_source"], "books_submitted": b1["books"], "span_s": round(span, 2),
            "state_at_end": b1["state"]}


def _compact(r: dict) -> dict:
    keep = ("phase", "t_sched_s", "status", "error", "completed", "samples", "underrun")
    out = {k: r.get(k) for k in keep}
    for k in ("send_lag_s", "ttfb_s", "ttfa_s", "e2e_s", "deficit_s"):
        out[k.replace("_s", "_ms")] = ms(r.get(k))
    return out


async def prime(load: Load, slots: int) -> dict:
    """Ramp to `slots` concurrent requests, one more each time the last one's audio starts (a 503 is
    retried), then wait for all: every batch size runs once before anything is measured."""
    t0, tasks, errors = time.perf_counter(), [], Counter()
    rng = random.Random(load.args.seed - 1)
    for _ in range(slots):
        for _attempt in range(100):
            first, rec = asyncio.Event(), {}
            task = asyncio.create_task(stream_speech(load.target, load.payload(rng), load.args.timeout,
                                                     load.threshold, rec=rec, first_byte=first))
            try:
                await asyncio.wait_for(first.wait(), load.args.timeout)
            except asyncio.TimeoutError:
                pass
            if rec.get("status") == 503:
                errors["503 (retried)"] += 1
                await asyncio.sleep(0.2)
                continue
            tasks.append((task, rec))
            break
    if tasks:
        await asyncio.wait([t for t, _ in tasks], timeout=load.args.timeout)
    for t, rec in tasks:
        if not t.done():
            t.cancel()
            errors["incomplete"] += 1
        elif rec.get("error"):
            errors[rec["error"]] += 1
    pending = [t for t, _ in tasks if not t.done()]
    if pending:
        await asyncio.wait(pending, timeout=10.0)
    return {"requests": len(tasks), "wall_s": round(time.perf_counter() - t0, 2), "errors": dict(errors)}


def one_line(x: dict) -> str:
    t = x["ttfa_ms"]
    return (f"{x['measured']} measured, {x['completed']} completed; TTFA p50 {t['p50']} p95 {t['p95']} "
            f"p99 {t['p99']} ms; underruns {x['underruns']}; peak in flight {x['peak_in_flight']}; "
            f"errors {x['errors'] or 'none'}")
