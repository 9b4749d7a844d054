"""The live-text WebSocket benchmark (benchmarks/live.py): its arithmetic (live_stats.py), its client (live_session.py) against a fake
server, and one short run against the real daemon on the tiny checkpoint."""
from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

import pytest

from benchmarks.live_session import live_session
from benchmarks.live_stats import playback_gaps, sentence_plan, split_gaps, spread, summarize, word_pieces
from benchmarks.load.client import Target
from benchmarks.load.stats import playback_deficit
from tests.daemon_util import CV, needs_daemon

BPS = 24000 * 2  # pcm bytes per second
LOUD = (1000).to_bytes(2, "little") * 2400  # 0.1 s
QUIET = b"\x00\x00" * 2400


def test_words_go_out_with_the_space_after_them():
    assert word_pieces("Hello there. The end") == ["Hello ", "there. ", "The ", "end"]
    assert word_pieces("One.") == ["One."]
    assert word_pieces("") == []


def test_sentence_plan_follows_the_server_split():
    # "there. " completes the first sentence; the unfinished rest is spoken at input_text.end
    assert sentence_plan(word_pieces("Hello there. The second one is here. And the end")) == (1, 3)
    assert sentence_plan(word_pieces("Dr. Smith came. He left.")) == (2, 2)  # "Dr." ends nothing
    # the last word has no space after it: its sentence is only complete at the end
    assert sentence_plan(word_pieces("One two three.")) == (None, 1)


def test_playback_gaps_of_a_player_that_waits():
    # 0.5 s of audio, the next 0.5 s at 1.0 (a 0.5 s wait), 1 s more at 1.2, then the end (no audio)
    trace = [(0.0, BPS // 2), (1.0, BPS), (1.2, 2 * BPS), (3.0, 2 * BPS)]
    assert playback_gaps(trace, BPS) == [(0.5, 1.0)]
    # the player resumed at 1.0 with 0.5 s, got 1 s more at 1.2: dry at 2.5, audio again at 2.6
    gaps = playback_gaps(trace[:3] + [(2.6, 3 * BPS)], BPS)
    assert gaps == [(0.5, 1.0), (pytest.approx(2.5), 2.6)]
    assert split_gaps(gaps, 2.0) == ([(0.5, 1.0)], [gaps[1]])
    assert split_gaps(gaps, 0.5) == ([], gaps)  # a wait that begins at the end counts as after it
    assert playback_gaps([], BPS) == [] and playback_gaps([(5.0, BPS)], BPS) == []


def test_no_gaps_exactly_when_the_load_deficit_says_no_underrun():
    ahead = [(10.0, BPS), (10.5, 2 * BPS), (11.5, 3 * BPS)]
    late = [(0.0, 3840), (0.2, 3 * 3840), (0.25, 8 * 3840)]
    assert playback_gaps(ahead, BPS) == [] and playback_deficit(ahead, BPS) <= 0
    [(dry, back)] = playback_gaps(late, BPS)
    assert (dry, back) == (pytest.approx(0.08), 0.2)
    assert back - dry == pytest.approx(playback_deficit(late, BPS))  # one wait: the deficit is its length


def _rec(**kw):
    r = {"completed": True, "error": None, "first_audio_s": 0.5, "sentence_audio_s": 0.05, "end_done_s": 1.0,
         "samples": 24000, "audio_seconds": 1.0, "expect_samples": 24000, "underrun": False, "gap_after_end_s": 0.0,
         "gaps_before_end": 0, "connect_s": 0.002, "send_lag_s": 0.001, "unknown_events": 0}
    r.update(kw)
    return r


def test_summarize_a_level():
    failed = dict(completed=False, first_audio_s=None, sentence_audio_s=None, end_done_s=None, samples=0,
                  audio_seconds=None, underrun=None, gap_after_end_s=None, gaps_before_end=None)
    recs = ([_rec(first_audio_s=0.1 * i, end_done_s=0.2 * i) for i in range(1, 11)]
            + [_rec(underrun=True, gap_after_end_s=0.03), _rec(underrun=True, gap_after_end_s=0.12, gaps_before_end=2)]
            + [_rec(samples=12000, audio_seconds=0.4, unknown_events=3), _rec(first_audio_s=None, sentence_audio_s=None)]
            + [_rec(**failed, error="server_busy")] * 2 + [_rec(**failed, error="incomplete", connect_s=None)])
    s = summarize(recs, window_s=5.0)
    assert s["measured"] == 17 and s["sessions_per_s"] == 3.4
    assert s["completed"] == 14 and s["completed_share"] == round(14 / 17, 4)
    assert s["errors"] == {"server_busy": 2} and s["incomplete"] == 1
    f = s["first_audio_ms"]
    assert f["n"] == 13 and f["max"] == 1000.0 and f["p50"] == 500.0  # ten of 0.1..1.0 s and three of 0.5 s
    assert s["end_to_done_ms"]["max"] == 2000.0 and s["end_to_done_ms"]["n"] == 14
    assert s["silent"] == 1
    assert s["underruns"] == 2 and s["underrun_share"] == round(2 / 14, 4)
    assert s["gap_after_end_ms"] == {"p95": 120.0, "max": 120.0}
    assert s["gaps_while_text_arrived"] == 1
    assert s["length_mismatches"] == 1 and s["audio_seconds_mismatches"] == 1  # 12000 samples but 0.4 s said
    assert s["audio_s_per_session"] == {"mean": round((13 * 1.0 + 0.5) / 14, 3), "min": 0.5}
    assert s["connect_ms"]["n"] == 16 and s["unknown_events"] == 3
    empty = summarize([], 5.0)
    assert empty["measured"] == 0 and empty["first_audio_ms"]["p50"] is None and empty["completed_share"] is None


def test_spread():
    assert spread([0.3, 0.1, 0.2]) == {"p50": 200.0, "p95": 300.0, "max": 300.0, "n": 3}
    assert spread([]) == {"p50": None, "p95": None, "max": None, "n": 0}


def _fake_live(script):
    """Run live_session against an aiohttp WebSocket server whose handler is `script(ws, messages)`;
    `messages` collects what the client sent."""
    import aiohttp
    from aiohttp import web

    seen: list = []

    async def handler(request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await script(ws, seen)
        await ws.close()
        return ws

    async def go(text):
        app = web.Application()
        app.router.add_get("/v1/audio/speech/live", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        with tempfile.TemporaryDirectory() as tmp:
            sock = str(Path(tmp) / "s.sock")
            await web.UnixSite(runner, sock).start()
            try:
                async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as http:
                    return await live_session(http, "http://localhost/v1/audio/speech/live",
                                              {"voice": "vivian", "max_frames": 5}, text, words_per_s=20.0,
                                              timeout=10.0, threshold=32, expect_frames=None, sentences_mode=True)
            finally:
                await runner.cleanup()

    return go, seen


async def _until(ws, seen, pred):
    """Read client messages into `seen` until one matches."""
    async for msg in ws:
        seen.append(json.loads(msg.data))
        if pred(seen[-1]):
            return


def test_client_times_a_session_against_a_fake_server():
    """0.3 s of audio (silence first) when the first sentence is complete; an unknown event; after
    input_text.end, 0.4 s of work, then audio and done."""
    async def script(ws, seen):
        await _until(ws, seen, lambda m: m.get("text") == "there. ")
        await ws.send_json({"type": "audio.start", "sample_rate": 24000, "format": "pcm_s16le"})
        await ws.send_bytes(QUIET)
        await ws.send_bytes(LOUD)
        await ws.send_bytes(LOUD)
        await ws.send_json({"type": "text.done", "text": "Hello there."})
        await ws.send_json({"type": "speech.other", "text": "?"})  # an event this client does not know
        await _until(ws, seen, lambda m: m["type"] == "input_text.end")
        await asyncio.sleep(0.4)
        await ws.send_bytes(LOUD)
        await ws.send_json({"type": "text.done", "text": "The end"})
        await ws.send_json({"type": "done", "audio_seconds": 0.4})

    go, seen = _fake_live(script)
    r = asyncio.run(go("Hello there. The end"))
    assert r["completed"] and r["error"] is None, r
    assert seen[0] == {"type": "session.update", "voice": "vivian", "max_frames": 5}
    assert [m.get("text") for m in seen[1:5]] == ["Hello ", "there. ", "The ", "end"]
    assert r["samples"] == 4 * 2400 and r["audio_seconds"] == 0.4 and r["sentences"] == 2 and r["spoken"] == 2
    assert r["unknown_events"] == 1
    # "there. " goes out 50 ms after the first word; the loud frame follows it at once
    assert 0.04 < r["first_audio_s"] < 0.5 and 0.0 < r["sentence_audio_s"] < 0.45
    assert 0.39 < r["end_done_s"] < 2.0
    # 0.3 s of audio at ~0.05 s; the text ends at ~0.15 s; the player runs dry at ~0.35 s and the last
    # audio comes at ~0.55 s: a gap of ~0.2 s after the text ended
    assert r["underrun"] and r["gaps_before_end"] == 0 and 0.1 < r["gap_after_end_s"] < 1.5


def test_client_counts_an_error_event():
    async def script(ws, seen):
        await _until(ws, seen, lambda m: m["type"] == "input_text.append")
        await ws.send_json({"type": "error", "message": "the queue is full", "code": "busy"})

    go, _ = _fake_live(script)
    r = asyncio.run(go("Hello there. The end"))
    assert not r["completed"] and r["error"] == "server_busy" and r["detail"] == "the queue is full"
    assert r["first_audio_s"] is None and r["underrun"] is None


def test_client_counts_a_close_without_done():
    async def script(ws, seen):
        await _until(ws, seen, lambda m: m["type"] == "input_text.end")
        await ws.send_bytes(LOUD)

    go, _ = _fake_live(script)
    r = asyncio.run(go("Hi."))
    assert not r["completed"] and r["error"] == "closed" and r["samples"] == 2400


def test_client_connect_error():
    import aiohttp

    async def go():
        with tempfile.TemporaryDirectory() as tmp:
            conn = aiohttp.UnixConnector(path=str(Path(tmp) / "nobody.sock"))
            async with aiohttp.ClientSession(connector=conn) as http:
                return await live_session(http, "http://localhost/v1/audio/speech/live", {}, "Hi.", 10.0, 5.0, 32)

    r = asyncio.run(go())
    assert r["error"] == "connect" and not r["completed"] and r["connect_s"] is None
    assert Target(socket="x").describe() == "unix socket"


@needs_daemon
@pytest.mark.parametrize("mode", ["words", "sentences"])
def test_live_against_the_real_daemon(tmp_path, mode):
    """1 then 2 sessions of 22 words (two or more sentences) on the tiny checkpoint, 4 frames per request."""
    from benchmarks.live import main

    out = tmp_path / "live.json"
    code = main(["--model", str(CV), "--fixed-length", "--device", "cpu", "--slots", "4", "--frames", "4",
                 "--text-mode", mode,
                 "--words", "22", "--words-per-s", "20", "--sessions", "1,2", "--warmup", "0.5", "--window", "2.5",
                 "--drain-timeout", "30", "--timeout", "30", "--config-extra", "model.threads=1", "--save-sessions",
                 "--json", str(out), "--md", str(tmp_path / "live.md")])
    res = json.loads(out.read_text())
    log = (tmp_path / "live.daemon.log").read_text(errors="replace")
    assert code == 0, (res["error"], log[-3000:])
    assert res["generation_config"]["min_new_tokens"] == 5 and res["daemon_exit"] == 0
    assert str(res["config"]["runtime"]["max_slots"]) == "4" and res["prime"]["requests"] == 2
    assert [x["sessions"] for x in res["levels"]] == [1, 2]
    for x in res["levels"]:
        assert x["measured"] >= 1 and x["completed"] == x["measured"], (x.get("error_details"), log[-3000:])
        assert x["errors"] == {} and x["incomplete"] == 0 and x["silent"] == 0
        assert x["length_mismatches"] == 0 and x["audio_seconds_mismatches"] == 0
        f, s, e = x["first_audio_ms"], x["sentence_to_audio_ms"], x["end_to_done_ms"]
        assert f["n"] == x["completed"] and 0 < f["p50"] <= f["max"] < 30_000
        assert 0 < e["p50"] <= e["max"] < 30_000
        for r in x["records"]:
            # every request (an utterance or a sentence) is 4 frames; words mode: requests end at the frame cap
            # and the words they did not take are spoken next
            assert r["completed"] and r["spoken"] >= 1 and r["samples"] == r["spoken"] * 4 * 1920
            if mode == "sentences":
                assert r["sentences"] >= 2 and r["spoken"] == r["sentences"]
                # the first sentence is complete before the text ends: its audio starts earlier than the end
                assert r["sentence_audio_ms"] < r["first_audio_ms"] and s["p50"] < f["p50"]
    assert "| 2 | " in (tmp_path / "live.md").read_text()
