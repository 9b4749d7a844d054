"""Text that is still arriving (engines.runtime.text_feed): the model's streaming-text mode in the runner.

A request fed word by word, slowly enough that its row waits for text, must give exactly the codes of the
reference loop on the whole text in streaming-text mode: a held step changes nothing, and the model never
ends early because text was late."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from engines.api import SamplingParams, SynthesisRequest
from engines.model.errors import TTSError, UnsupportedMode
from engines.runtime.runner import EngineRunner
from engines.runtime.text_feed import TextFeed
from tests.test_runtime import TINY, engine, reference

TEXT = "Hello world, this is a test of text that keeps arriving while it is spoken."


def test_ready_gives_complete_words_only():
    f = TextFeed("Hello wor")
    assert f.ready() == ("Hello", False)
    f.append("ld, how ")
    assert f.ready() == ("Hello world, how", False)
    f.append("are")
    assert f.ready() == ("Hello world, how", False)
    f.end()
    assert f.ready() == ("Hello world, how are", True)
    with pytest.raises(ValueError):
        f.append("more")
    assert TextFeed("one").ready() == ("", False)
    assert TextFeed("你好世界").ready() == ("你好世", False)  # no spaces: all but the last character


def test_prompt_token_ids_grow_by_prefix_at_word_boundaries():
    prompts = engine().prompts
    words = TEXT.split(" ")
    full = prompts.text_ids(TEXT)
    for i in range(1, len(words)):
        part = prompts.text_ids(" ".join(words[:i]))
        assert full[:len(part)] == part


def _feed_slowly(feed: TextFeed, text: str, runner: EngineRunner, every: int = 3, first: int = 2) -> threading.Thread:
    """A producer thread for `feed`: the first words now, then the rest one by one; every `every` words it waits
    until the runner has held a row for text (so holds surely happen, however fast the machine)."""
    words = text.split(" ")

    def wait_for_a_hold():
        seen, deadline = runner.holds, time.monotonic() + 300  # (a guard: a loaded machine holds later, not never)
        while runner.holds == seen and time.monotonic() < deadline:
            time.sleep(0.005)

    def run():
        for i, w in enumerate(words[first:]):
            if i % every == 0:
                wait_for_a_hold()
            feed.append(w + " ")
        wait_for_a_hold()
        feed.end()

    feed.append(" ".join(words[:first]) + " ")
    return threading.Thread(target=run, daemon=True)


def _speak_fed(runner: EngineRunner, sp: SamplingParams):
    """TEXT fed slowly to one request on a running `runner` -> its result (the runner is stopped after)."""
    runner.start()
    try:
        feed = TextFeed()
        producer = _feed_slowly(feed, TEXT, runner)
        h = runner.submit(SynthesisRequest(text="", voice="vivian", language="english", sampling=sp, text_feed=feed))
        producer.start()
        res = h.result()
        producer.join()
    finally:
        runner.stop()
    return res


def _reference_streaming(eng, text, sampling, voice="vivian"):
    req = SynthesisRequest(text=text, voice=voice, language="english", non_streaming_text=False, sampling=sampling)
    return reference(eng, [req])[0]


@pytest.mark.parametrize("greedy", [True, False])
def test_slow_text_gives_the_whole_text_codes(greedy):
    eng = engine()
    mk = SamplingParams.greedy if greedy else SamplingParams
    sp = mk(max_new_tokens=40, seed=7)
    codes_ref, wav_ref = _reference_streaming(eng, TEXT, sp)
    runner = EngineRunner(eng, max_slots=2, max_context=256)
    res = _speak_fed(runner, sp)
    assert runner.holds > 0, "the text came fast enough never to hold the row: the test checks nothing"
    assert np.array_equal(res.codes, codes_ref)
    assert res.audio.shape == wav_ref.shape and np.abs(res.audio - wav_ref).max() < 1e-4


def test_fed_and_whole_requests_together_equal_reference():
    """Feeds and ordinary requests share the batch (joining and leaving mid-flight): each gives its own
    reference codes; a held row does not disturb its neighbours."""
    eng = engine()
    texts = [TEXT, "Short one said quickly.", "Another sentence that arrives in pieces, word by word."]
    sps = [SamplingParams.greedy(max_new_tokens=20 + 5 * i, seed=i) for i in range(3)]
    refs = [_reference_streaming(eng, t, sp)[0] for t, sp in zip(texts, sps)]
    plain = [SynthesisRequest(text=t, voice="vivian", language="english", sampling=SamplingParams.greedy(
        max_new_tokens=15, seed=9)) for t in ("Guten Tag.", "Numbers: one two three.")]
    plain_ref = [c for c, _ in reference(eng, plain)]
    runner = EngineRunner(eng, max_slots=3, max_context=256)
    runner.start()
    try:
        feeds = [TextFeed() for _ in texts]
        producers = [_feed_slowly(f, t, runner, every=2 + i) for i, (f, t) in enumerate(zip(feeds, texts))]
        hs = [runner.submit(SynthesisRequest(text="", voice="vivian", language="english", sampling=sp, text_feed=f))
              for f, sp in zip(feeds, sps)]
        hs += [runner.submit(r, priority=1) for r in plain]
        for p in producers:
            p.start()
        out = [h.result() for h in hs]
    finally:
        runner.stop()
    for res, ref in zip(out, refs + plain_ref):
        assert np.array_equal(res.codes, ref)


def test_a_runner_waiting_only_for_text_sleeps():
    eng = engine()
    runner = EngineRunner(eng, max_slots=2, max_context=256)
    runner.start()
    try:
        feed = TextFeed("Hello there ")
        h = runner.submit(SynthesisRequest(text="", voice="vivian", language="english",
                                           sampling=SamplingParams.greedy(max_new_tokens=30), text_feed=feed))
        deadline = time.monotonic() + 300  # (a failure guard)
        while runner.holds == 0:
            assert time.monotonic() < deadline, "the row never waited for words"
            time.sleep(0.01)
        time.sleep(0.2)
        steps = runner.steps
        time.sleep(0.5)
        assert runner.steps - steps <= 1  # no busy stepping while only waiting for words
        feed.append("my friend.")
        feed.end()
        res = h.result()
    finally:
        runner.stop()
    assert res.codes.shape[0] > 0 and runner.steps > steps


def test_cloned_voice_with_reference_text_is_refused():
    eng = engine("base_small")
    voice = eng.make_voice(str(TINY / "audio" / "ref_a_24k.wav"), "A reference sentence.")
    runner = EngineRunner(eng, max_slots=1, max_context=256)
    feed = TextFeed("Hello there ")
    feed.end()
    h = runner.submit(SynthesisRequest(text="", voice=voice, language="english", text_feed=feed))
    while not h.done:
        runner.step_once()
    with pytest.raises(UnsupportedMode, match="reference text"):
        h.result()


def test_a_feed_with_no_complete_word_is_an_error():
    runner = EngineRunner(engine(), max_slots=1, max_context=256)
    h = runner.submit(SynthesisRequest(text="", voice="vivian", text_feed=TextFeed("Hel")))
    while not h.done:
        runner.step_once()
    with pytest.raises(TTSError, match="no complete word"):
        h.result()


@pytest.mark.gpu
def test_gpu_graphs_hold_rows_and_match_the_reference():
    """On CUDA in fp32 with captured decode graphs: a fed request held for text gives the reference codes."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    eng = engine(device="cuda")
    sp = SamplingParams.greedy(max_new_tokens=40, seed=7)
    codes_ref, _ = _reference_streaming(eng, TEXT, sp)
    runner = EngineRunner(eng, max_slots=4, max_context=256, compile=False)
    runner.prepare()
    res = _speak_fed(runner, sp)
    assert runner.holds > 0 and runner.graphs
    assert np.array_equal(res.codes, codes_ref)
