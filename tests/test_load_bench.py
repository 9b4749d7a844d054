"""The open-loop load benchmark (benchmarks/load/): its arithmetic, its HTTP client against a fake
server, and one short run against the real daemon on the tiny checkpoint."""
from __future__ import annotations

import asyncio
import json
import math
import random
import tempfile
from pathlib import Path

import pytest

from benchmarks.load.client import FirstLoud, Target, stream_speech
from benchmarks.load.stats import arrivals, arrivals_until, percentile, playback_deficit, summarize, underran
from benchmarks.load.text import book_text, prompt
from tests.daemon_util import CV, needs_daemon

BPS = 24000 * 2  # pcm bytes per second


def test_percentile_nearest_rank():
    v = list(range(1, 101))  # 1..100
    assert percentile(v, 0.50) == 50
    assert percentile(v, 0.95) == 95
    assert percentile(v, 0.99) == 99
    assert percentile(v, 1.0) == 100
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([3, 1, 2], 0.5) == 2  # unsorted input
    assert percentile([], 0.5) is None


def test_no_underrun_when_audio_stays_ahead():
    # 1 s of audio at once, more at 0.5 s and 1.5 s, the end at 2.0 s: always ahead of the player
    trace = [(10.0, 1 * BPS), (10.5, 2 * BPS), (11.5, 3 * BPS), (12.0, 3 * BPS)]
    assert playback_deficit(trace, BPS) == pytest.approx(-0.5)
    assert not underran(trace, BPS)


def test_underrun_when_a_chunk_comes_late():
    # one 80 ms frame, then nothing until 0.2 s: the player ran dry for 120 ms
    trace = [(0.0, 3840), (0.2, 3 * 3840), (0.25, 8 * 3840), (0.25, 8 * 3840)]
    assert playback_deficit(trace, BPS) == pytest.approx(0.12)
    assert underran(trace, BPS)


def test_underrun_counts_a_late_end_of_response():
    # all audio (1 s) in the first read, but the response only ends 1.5 s later: the player waited
    trace = [(0.0, BPS), (1.5, BPS)]
    assert playback_deficit(trace, BPS) == pytest.approx(0.5)
    assert not underran([(0.0, BPS), (0.9, BPS)], BPS)
    assert math.isnan(playback_deficit([], BPS))


def test_poisson_schedule_is_seeded_and_has_the_rate():
    a = arrivals_until(10.0, 200.0, "poisson", seed=3)
    assert a == arrivals_until(10.0, 200.0, "poisson", seed=3)
    assert a != arrivals_until(10.0, 200.0, "poisson", seed=4)
    assert all(x < y for x, y in zip(a, a[1:])) and 0 < a[0] and a[-1] < 200.0
    assert abs(len(a) - 2000) < 2000 * 0.08  # Poisson: sd ~ sqrt(2000) = 45
    gaps = [y - x for x, y in zip(a, a[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(0.1, rel=0.08)
    assert sum(g > 0.2 for g in gaps) / len(gaps) == pytest.approx(math.exp(-2), abs=0.03)  # exponential tail


def test_constant_schedule_and_bad_input():
    assert arrivals_until(4.0, 1.0, "constant") == [0.0, 0.25, 0.5, 0.75]
    with pytest.raises(ValueError):
        next(arrivals(0.0))
    with pytest.raises(ValueError):
        next(arrivals(1.0, "bursty"))


def _rec(**kw):
    r = {"completed": True, "error": None, "ttfa_s": 0.05, "e2e_s": 1.0, "underrun": False, "deficit_s": -0.1,
         "samples": 7680, "send_lag_s": 0.001}
    r.update(kw)
    return r


def test_summarize_counts_errors_underruns_and_lengths():
    recs = ([_rec(ttfa_s=0.01 * i) for i in range(1, 11)]
            + [_rec(underrun=True, deficit_s=0.2), _rec(samples=3840)]
            + [_rec(completed=False, error="http_503", ttfa_s=None, e2e_s=None, underrun=None, deficit_s=None)] * 3
            + [_rec(completed=False, error="incomplete", ttfa_s=None, e2e_s=None, underrun=None, deficit_s=None)])
    s = summarize(recs, window_s=4.0, expect_samples=7680)
    assert s["measured"] == 16 and s["achieved_rate"] == 4.0
    assert s["completed"] == 12 and s["completed_share"] == 0.75
    assert s["errors"] == {"http_503": 3} and s["incomplete"] == 1
    assert s["underruns"] == 1 and s["underrun_share"] == round(1 / 12, 4)
    assert s["length_mismatches"] == 1 and s["lengths_samples"] == {"3840": 1, "7680": 11}
    assert s["ttfa_ms"]["max"] == 100.0 and s["ttfa_ms"]["n"] == 12
    assert s["buffer_needed_ms"]["max"] == 200.0
    empty = summarize([], 4.0, 7680)
    assert empty["measured"] == 0 and empty["ttfa_ms"]["p50"] is None and empty["completed_share"] is None


def test_first_loud_sample_across_split_reads():
    f = FirstLoud(threshold=32)
    assert not f.feed(b"\x00\x00" * 10 + b"\x10")  # odd byte: half a sample kept
    assert not f.feed(b"\x00")  # completes 0x0010 = 16: still quiet
    assert f.feed(b"\x00\x01")  # 256: loud
    assert FirstLoud(32).feed((-200).to_bytes(2, "little", signed=True))


def test_prompts_and_book_text():
    rng = random.Random(5)
    for _ in range(200):
        assert 8 <= len(prompt(rng).split()) <= 28
    from jobs.ingest import load_document
    from jobs.settings import JobSpec
    from jobs.submit import document_chapters

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "book.txt"
        path.write_text(book_text(60), encoding="utf-8")
        chapters = document_chapters(load_document(path), JobSpec(language="english"))
    assert sum(len(segs) for _, segs in chapters) == 60


def test_client_times_chunks_from_a_fake_server():
    """Chunked pcm: silence first, loud audio 150 ms later; TTFA waits for the loud sample."""
    silence, loud = b"\x00\x00" * 1920, (1000).to_bytes(2, "little") * 1920

    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: audio/pcm\r\nX-Sample-Rate: 24000\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        for delay, data in ((0.0, silence), (0.15, loud), (0.0, loud)):
            await asyncio.sleep(delay)
            writer.write(b"%x\r\n" % len(data) + data + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def go():
        with tempfile.TemporaryDirectory() as tmp:
            sock = str(Path(tmp) / "s.sock")
            server = await asyncio.start_unix_server(handle, sock)
            async with server:
                return await stream_speech(Target(socket=sock), {"input": "x"}, timeout=10, threshold=32)

    r = asyncio.run(go())
    assert r["completed"] and r["status"] == 200 and r["samples"] == 3 * 1920
    assert r["ttfb_s"] < 0.1 and 0.14 < r["ttfa_s"] < 1.0
    assert r["underrun"] and r["deficit_s"] > 0.05  # 80 ms of silence then a 150 ms gap


@needs_daemon
def test_load_against_the_real_daemon(tmp_path):
    """Rate 2/s for a 3 s window on the tiny checkpoint (4 frames per request, a 6-segment book alongside)."""
    from benchmarks.load.main import main

    out = tmp_path / "load.json"
    code = main(["--model", str(CV), "--fixed-length", "--device", "cpu", "--slots", "4", "--frames", "4",
                 "--rates", "2", "--warmup", "1", "--window", "3", "--drain-timeout", "30", "--timeout", "30",
                 "--config-extra", "model.threads=1", "--book", "6", "--book-frames", "4", "--save-requests",
                 "--json", str(out), "--md", str(tmp_path / "load.md")])
    res = json.loads(out.read_text())
    log = (tmp_path / "load.daemon.log").read_text(errors="replace")
    assert code == 0, (res["error"], log[-3000:])
    for key in ("command", "device", "model", "config", "workload", "levels", "prime", "book", "generation_config"):
        assert key in res, key
    assert res["generation_config"]["min_new_tokens"] == 5
    assert str(res["config"]["runtime"]["max_slots"]) == "4" and res["daemon_exit"] == 0
    assert "$WORKDIR" in res["config"]["jobs"]["home"]
    [level] = res["levels"]
    for key in ("ttfa_ms", "e2e_s", "underruns", "underrun_share", "peak_in_flight", "completed_share", "errors",
                "achieved_rate", "length_mismatches", "book"):
        assert key in level, key
    assert level["measured"] >= 1 and level["completed"] == level["measured"], level.get("error_details")
    assert level["length_mismatches"] == 0 and level["errors"] == {} and level["incomplete"] == 0
    assert all(r["completed"] and r["samples"] == 4 * 1920 for r in level["requests"])
    assert level["ttfa_ms"]["p50"] is not None and level["peak_in_flight"] >= 1
    assert res["book"]["segments"] == 6 and res["book"]["submit_shape"] in ("spec-part", "form-fields")
    assert "segments_per_s" in level["book"]
    assert "| 2 (" in (tmp_path / "load.md").read_text()


@pytest.mark.parametrize("newer", [True, False])
def test_book_submit_tries_the_spec_part_then_form_fields(newer):
    """Against both body shapes of POST /v1/jobs (aiohttp parses the multipart, as the daemon does)."""
    from aiohttp import web

    from benchmarks.load.book import submit_book

    seen = []

    async def jobs(request):
        parts, reader = {}, await request.multipart()
        while (part := await reader.next()) is not None:
            parts[part.name] = (part.filename, await part.text())
        seen.append(parts)
        if newer and set(parts) != {"file", "spec"} or not newer and "spec" in parts:
            return web.json_response({"error": {"message": "unknown field(s) spec"}}, status=400)
        return web.json_response({"id": "j1", "state": "queued", "progress": {"done": 0, "total": 3}}, status=201)

    async def go():
        app = web.Application()
        app.router.add_post("/v1/jobs", jobs)
        runner = web.AppRunner(app)
        await runner.setup()
        with tempfile.TemporaryDirectory() as tmp:
            sock = str(Path(tmp) / "s.sock")
            await web.UnixSite(runner, sock).start()
            try:
                return await submit_book(Target(socket=sock), "Chapter 1\n\nSome text.\n",
                                         {"voice": "vivian", "seed": 2, "sampling": {"max_new_tokens": 9}})
            finally:
                await runner.cleanup()

    summary, shape = asyncio.run(go())
    assert summary["id"] == "j1" and shape == ("spec-part" if newer else "form-fields")
    assert seen[0]["file"] == ("load-book.txt", "Chapter 1\n\nSome text.\n")
    assert json.loads(seen[0]["spec"][1]) == {"voice": "vivian", "seed": 2, "sampling": {"max_new_tokens": 9}}
    if not newer:
        assert {k: v[1] for k, v in seen[1].items() if k != "file"} == {"voice": "vivian", "seed": "2",
                                                                      "max_new_tokens": "9"}
