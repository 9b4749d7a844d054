"""The engine in a process of its own (engines.process): same audio as in-process, errors keep their
kind, cancel and live text cross the boundary, a killed engine fails only its requests and comes back,
a start-up failure is one line."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from engines.api import EngineSpec, SamplingParams, SynthesisRequest
from engines.model.errors import VoiceNotFound
from engines.process.proxy import EngineProcess, EngineStartError, EngineUnavailable
from engines.runtime.text_feed import TextFeed

from conftest import TINY

CV = TINY / "cv_small"
REF = TINY / "audio" / "ref_a_24k.wav"


def spec(model=CV, **kw) -> EngineSpec:
    """The engine these tests run in a process and in their own; its codec in the model's dtype (fp32): the
    audio compared to 1e-4 is the process boundary's proof, and a bf16 codec (runtime.codec_dtype auto on a CPU
    with bf16 dot instructions) rounds a row differently beside other rows (tests/test_codec_dtype.py)."""
    return EngineSpec(**{"model": str(model), "device": "cpu", "dtype": "float32", "max_slots": 4, "threads": 1,
                         "codec_dtype": "model", **kw})


def req(text="Hello there, how are you today?", frames=24, seed=5, **kw) -> SynthesisRequest:
    return SynthesisRequest(text=text, voice=kw.pop("voice", "vivian"), language="english",
                            sampling=SamplingParams(seed=seed, max_new_tokens=frames + 1), **kw)


@pytest.fixture(scope="module")
def engine():
    e = EngineProcess(spec())
    e.start()
    e.wait_ready(300)
    yield e
    e.stop()


def test_same_codes_and_audio_as_in_process(engine, one_thread):
    from engines.load import load_runner

    reqs = [req(seed=s, text=t) for s, t in ((1, "One small sentence."), (2, "Another one, a little longer."))]
    handles = [engine.submit(r) for r in reqs]
    remote = [(np.concatenate(list(h)), h.codes) for h in handles]
    local = load_runner(spec()).synthesize(reqs)
    for (audio, codes), res in zip(remote, local):
        np.testing.assert_array_equal(codes, res.codes)
        assert audio.shape == res.audio.shape
        np.testing.assert_allclose(audio, res.audio, atol=1e-4)


def test_errors_keep_their_kind(engine):
    with pytest.raises(VoiceNotFound, match="unknown voice 'bob'; available: .*vivian"):
        engine.submit(req(voice="bob")).result()


def test_cancel_ends_the_request(engine):
    h = engine.submit(req(frames=400))
    it = iter(h)
    next(it)
    h.cancel()
    rest = list(it)  # ends (no error) well before 400 frames
    assert sum(c.size for c in rest) < 300 * 1920
    deadline = time.monotonic() + 300  # (a failure guard)
    while engine.stats()["active_slots"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats()["active_slots"] == 0


def test_text_arriving_crosses_the_boundary(engine):
    feed = TextFeed("Hello ")
    h = engine.submit(req(text="", text_feed=feed, frames=200))

    def write():
        for word in ("there, ", "this ", "text ", "is ", "still ", "arriving."):
            time.sleep(0.05)
            feed.append(word)
        feed.end()

    t = threading.Thread(target=write)
    t.start()
    audio = np.concatenate(list(h))
    t.join()
    assert audio.size > 0
    assert feed.taken == len(feed.text)  # the engine was given every word


def test_stats_are_relayed(engine):
    list(engine.submit(req(frames=4)))
    s = engine.stats()
    assert s["alive"] and s["max_slots"] == 4 and s["frames"] > 0


def test_clone_voice_in_the_engine():
    e = EngineProcess(spec(TINY / "base_small"))
    e.start()
    try:
        e.wait_ready(300)
        voice = e.clone_voice(str(REF), "A reference sentence.")
        assert voice.spk_embedding.device.type == "cpu" and voice.ref_codes is not None
        audio = e.submit(req(voice=voice, frames=6)).result().audio
        assert audio.size > 0
    finally:
        e.stop()


def test_killed_engine_fails_its_requests_and_comes_back():
    e = EngineProcess(spec())
    e.start()
    e.wait_ready(300)
    try:
        h = e.submit(req(frames=1500))
        next(iter(h))
        os.kill(e.proc.pid, signal.SIGKILL)
        with pytest.raises(EngineUnavailable, match="killed by SIGKILL"):
            h.result()
        with pytest.raises(EngineUnavailable):  # while it starts again
            e.submit(req())
        deadline = time.monotonic() + 300  # (a failure guard)
        while not e.running and time.monotonic() < deadline:
            time.sleep(0.1)
        assert e.running and e.starts == 2
        assert e.submit(req(frames=4)).result().audio.size > 0
    finally:
        e.stop()


@pytest.mark.parametrize("bad, says", [
    (dict(model="no/such/checkpoint"), "cannot start: .*no/such/checkpoint"),
    (dict(device="cuda:7"), "engine on cuda:7 cannot start: (?!.*cuda:0)"),
])
def test_start_failure_is_one_line(bad, says):
    """(A process on a GPU sees it alone, as its cuda:0 (engines.names.own_gpu): what it says names the GPU as
    the daemon does.)"""
    s = spec(**{k: v for k, v in bad.items() if k == "model"})
    if "device" in bad:
        s = EngineSpec(**{**s.__dict__, "device": bad["device"]})
    e = EngineProcess(s, restart=False)
    e.start()
    with pytest.raises(EngineStartError, match=says) as info:
        e.wait_ready(300)
    assert "\n" not in str(info.value)
    assert e.proc.poll() is not None


def test_a_cloned_voice_result_is_cut_like_the_official_across_the_boundary():
    """The reference cut of a voice cloned with its text (the official whole-file formula, which keeps one
    reference sample for some lengths: `handle.lead`) reaches results made in an engine process too."""
    from engines.load import load_runner

    e = EngineProcess(spec(TINY / "base_small"))
    e.start()
    try:
        e.wait_ready(300)
        from engines.model.voice import reference_cut

        voice = e.clone_voice(str(REF), "A reference sentence.")
        n_ref = voice.ref_codes.shape[0]
        # generated lengths where the official cut keeps one reference sample (its float rounding)
        frames = [f for f in range(2, 300) if reference_cut(n_ref, n_ref + f, (n_ref + f) * 1920) < n_ref * 1920][:2]
        assert frames, n_ref
        reqs = [req(voice=voice, frames=f, seed=s) for s, f in enumerate(frames + [5])]
        remote = [h.result() for h in [e.submit(r) for r in reqs]]
        local = load_runner(spec(TINY / "base_small")).synthesize(reqs)
        for a, b in zip(remote, local):
            np.testing.assert_array_equal(a.codes, b.codes)
            assert a.audio.shape == b.audio.shape
            np.testing.assert_allclose(a.audio, b.audio, atol=1e-4)
    finally:
        e.stop()


def test_a_preempted_batch_request_starts_over_in_the_front_too(one_thread):
    """A batch request whose slot went to a stream starts over in the engine; the front forgets the audio of
    its first try (`restart`), so its result is the one it would have had."""
    from engines.load import load_runner

    reqs = [req(seed=s, frames=150, text=t) for s, t in ((1, "The first book line is long enough."),
                                                         (2, "The second book line is long as well."))]
    want = load_runner(spec(max_slots=2)).synthesize(reqs)
    e = EngineProcess(spec(max_slots=2))
    e.start()
    try:
        e.wait_ready(300)
        batch = [e.submit(r, priority=1) for r in reqs]
        deadline = time.monotonic() + 300  # (a failure guard)
        while e.stats(fresh=True).get("frames", 0) < 140:  # past a batch chunk
            assert time.monotonic() < deadline, e.stats(fresh=True)
            time.sleep(0.01)
        e.submit(req(frames=4)).result()
        assert e.stats(fresh=True)["preempted"] >= 1
        for h, w in zip(batch, want):
            got = h.result()
            np.testing.assert_array_equal(got.codes, w.codes)
            assert got.audio.shape == w.audio.shape
    finally:
        e.stop()


def test_both_engines_are_the_one_engine_interface(engine):
    from engines.api import Engine
    from engines.load import load_runner

    assert isinstance(engine, Engine) and isinstance(load_runner(spec()), Engine)


def test_a_burst_is_spread_over_engine_processes_at_once():
    """A worker hands a pool of two engine processes every slot's worth of segments at once, faster than
    the engines report their load (every 0.25 s): the pool counts what it handed each engine, so the
    burst is split evenly instead of going to the engine whose last report looked emptiest."""
    from appliance.engine_pool import BATCH_PRIORITY, EnginePool

    engines = [EngineProcess(spec(max_slots=2)) for _ in range(2)]
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready(300)
        pool = EnginePool(engines, catalog=object())
        handles = [pool.submit(req(seed=i, frames=4), BATCH_PRIORITY) for i in range(8)]
        given = [len(live) for live in pool._live]
        for h in handles:
            h.result()
        frames = [e.stats(fresh=True)["frames"] for e in engines]
    finally:
        for e in engines:
            e.stop()
    assert given == [4, 4]
    assert frames[0] > 0 and frames[1] > 0 and max(frames) <= 2 * min(frames), frames
