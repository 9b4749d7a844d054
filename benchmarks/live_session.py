"""One live-text session over the WebSocket (GET /v1/audio/speech/live), measured on the client: the
record benchmarks/live.py sums up (benchmarks/live_stats.summarize)."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Optional

from benchmarks.live_stats import playback_gaps, sentence_plan, split_gaps, word_pieces
from benchmarks.load.client import FirstLoud, Target
from benchmarks.load.stats import BYTES_PER_SAMPLE, SAMPLE_RATE, SAMPLES_PER_FRAME

ROUTE = "/v1/audio/speech/live"


def ws_endpoint(target: Target):
    """(aiohttp connector, URL of the live route) for the daemon's Unix socket or TCP address."""
    import aiohttp

    if target.socket:
        return aiohttp.UnixConnector(path=target.socket, limit=0), f"http://localhost{ROUTE}"
    return aiohttp.TCPConnector(limit=0), f"http://{target.host}:{target.port}{ROUTE}"


async def live_session(http, url: str, update: dict, text: str, words_per_s: float, timeout: float,
                       threshold: int, expect_frames: Optional[int] = None, rec: Optional[dict] = None,
                       sentences_mode: bool = False) -> dict:
    """One live session, measured, into the record `rec` (a new dict if None; filled in place, so a
    caller that cancels the task still holds it) which it returns.

    `http`: an aiohttp.ClientSession; `update`: the session.update fields (none sent if empty); the
    text goes out as `word_pieces`, piece k at k / words_per_s s after the first. Fields: completed
    (`done` came), error (None, 'http_<status>', 'connect', 'server_<code>', 'closed', 'timeout',
    'protocol', 'incomplete' when cancelled) and detail; first_audio_s (first word sent -> first loud
    sample received), sentence_audio_s (the piece completing the first sentence sent -> the same), end_done_s
    (input_text.end sent -> `done`; sentences mode only), connect_s, samples, audio_seconds (the server's),
    sentences (planned), spoken (text.done events: requests), expect_samples (spoken x expect_frames
    frames), underrun (a playback gap that began after
    input_text.end), gap_after_end_s, gaps_before_end, send_lag_s (the worst lateness of a piece),
    unknown_events.
    """
    import aiohttp

    rec = {} if rec is None else rec
    pieces = word_pieces(text)
    first_idx, sentences = sentence_plan(pieces)
    rec.update({"completed": False, "error": None, "first_audio_s": None, "sentence_audio_s": None,
                "end_done_s": None, "connect_s": None, "samples": 0, "audio_seconds": None, "sentences": sentences,
                "expect_samples": sentences * expect_frames * SAMPLES_PER_FRAME if expect_frames else None,
                "underrun": None, "gap_after_end_s": None, "gaps_before_end": None, "send_lag_s": 0.0,
                "unknown_events": 0, "words": len(pieces), "spoken": 0})
    marks: dict = {}  # perf_counter times: first, sentence, end (sent); audio, done (received)
    events: list[tuple[float, int]] = []

    async def send(ws) -> None:
        try:
            if update:
                await ws.send_str(json.dumps({"type": "session.update", **update}))
            t0 = time.perf_counter()
            for k, piece in enumerate(pieces):
                due = t0 + k / words_per_s
                if due > time.perf_counter():
                    await asyncio.sleep(due - time.perf_counter())
                await ws.send_str(json.dumps({"type": "input_text.append", "text": piece}))
                now = time.perf_counter()
                rec["send_lag_s"] = max(rec["send_lag_s"], now - due)
                marks.setdefault("first", now)
                if k == first_idx:
                    marks["sentence"] = now
            await ws.send_str(json.dumps({"type": "input_text.end"}))
            marks["end"] = time.perf_counter()
            marks.setdefault("sentence", marks["end"])
        except (ConnectionError, aiohttp.ClientError):
            pass  # the server closed the session; the reader says why

    async def receive(ws) -> None:
        loud, total = FirstLoud(threshold), 0
        async for msg in ws:
            now = time.perf_counter()
            if msg.type == aiohttp.WSMsgType.BINARY:
                total += len(msg.data)
                events.append((now, total))
                if "audio" not in marks and loud.feed(msg.data):
                    marks["audio"] = now
                continue
            if msg.type != aiohttp.WSMsgType.TEXT:
                rec["error"], rec["detail"] = "protocol", f"WebSocket message of type {msg.type!r}"
                return
            try:
                event = json.loads(msg.data)
                kind = event.get("type")
            except (ValueError, AttributeError):
                rec["error"], rec["detail"] = "protocol", f"not a JSON object: {msg.data[:120]!r}"
                return
            if kind == "done":
                marks["done"] = now
                rec["audio_seconds"] = event.get("audio_seconds")
                break
            if kind == "error":
                rec["error"] = f"server_{event.get('code') or 'error'}"
                rec["detail"] = str(event.get("message"))[:300]
                return
            if kind == "audio.start":
                if event.get("sample_rate") != SAMPLE_RATE or event.get("format") != "pcm_s16le":
                    rec["error"], rec["detail"] = "protocol", f"unexpected audio.start {event}"
                    return
            elif kind == "text.done":
                rec["spoken"] += 1
            else:
                rec["unknown_events"] += 1  # the protocol grows; other events are not ours to judge
        rec["samples"] = total // BYTES_PER_SAMPLE
        if "done" not in marks:
            rec["error"], rec["detail"] = "closed", f"the server closed the session without done ({ws.close_code})"
            return
        if "end" not in marks:  # done before all text was sent: not the protocol
            rec["error"], rec["detail"] = "protocol", "done before input_text.end was sent"
            return
        if total % BYTES_PER_SAMPLE:
            rec["detail"] = f"odd audio length {total}"
        rec["completed"] = True

    async def go() -> None:
        t_open = time.perf_counter()
        try:
            ws = await http.ws_connect(url, autoping=True, heartbeat=None, max_msg_size=0)
        except aiohttp.WSServerHandshakeError as exc:
            rec["error"], rec["detail"] = f"http_{exc.status}", str(exc.message)[:300]
            return
        except (aiohttp.ClientError, OSError) as exc:
            rec["error"], rec["detail"] = "connect", f"{type(exc).__name__}: {exc}"
            return
        rec["connect_s"] = time.perf_counter() - t_open
        async with ws:
            sender = asyncio.create_task(send(ws))
            try:
                await receive(ws)
            finally:
                if not sender.done():
                    sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)

    try:
        await asyncio.wait_for(go(), timeout)
    except asyncio.TimeoutError:
        rec["error"] = "timeout"
    except asyncio.CancelledError:
        rec["error"] = "incomplete"
        raise
    except (ConnectionError, aiohttp.ClientError) as exc:
        rec["error"], rec["detail"] = "closed", f"{type(exc).__name__}: {exc}"
    if rec["completed"]:
        if "audio" in marks:
            rec["first_audio_s"] = marks["audio"] - marks["first"]
            if sentences_mode:
                rec["sentence_audio_s"] = marks["audio"] - marks["sentence"]
        if expect_frames:
            rec["expect_samples"] = rec["spoken"] * expect_frames * SAMPLES_PER_FRAME
        rec["end_done_s"] = marks["done"] - marks["end"]
        before, after = split_gaps(playback_gaps(events, SAMPLE_RATE * BYTES_PER_SAMPLE), marks["end"])
        rec.update(underrun=bool(after), gap_after_end_s=sum(b - a for a, b in after), gaps_before_end=len(before))
    elif rec["error"] is None:
        rec["error"] = "protocol"
    return rec
