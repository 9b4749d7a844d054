"""The batched runtime (slots, continuous batching, streaming codec) against the eager reference path.

CPU tests run the same scheduler and decode step as the GPU path, without graph capture; the `gpu`
tests run the captured-graph path on CUDA.
"""
from __future__ import annotations

import threading
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import torch

from engines.api import SamplingParams, SynthesisRequest
from engines.engine import TTSEngine
from engines.runtime.decode_step import POLL_LAYERS
from engines.runtime.runner import EngineBusy, EngineRunner
from engines.runtime.scheduler import AdmissionQueue, SlotMap, length_bucket, pick_bucket

TINY = Path(__file__).parent / "data" / "tiny"
TEXTS = ["Hello world, this is a test.", "Guten Tag.", "A much longer sentence that keeps going for a while.",
         "Short one.", "Numbers: one two three four five."]


@lru_cache(maxsize=None)
def engine(name="cv_small", device="cpu", dtype="float32"):
    return TTSEngine.load(TINY / name, device=device, dtype=dtype)


def requests(n, greedy=True, frames=12, voice="vivian", **kw):
    mk = SamplingParams.greedy if greedy else SamplingParams
    return [SynthesisRequest(text=TEXTS[i % len(TEXTS)], voice=voice, language="english",
                             sampling=mk(max_new_tokens=frames + (i % 3) * 3, seed=100 + i), **kw) for i in range(n)]


def reference(eng, reqs):
    return [(g.codes.numpy(), eng.decode(g.codes, ref)) for g, ref in eng.generate_codes(reqs)]


def test_scheduler_helpers():
    assert pick_bucket(3, (1, 2, 4, 8)) == 4 and pick_bucket(9, (1, 2, 4, 8)) == 8
    assert length_bucket(257, 256, 2048) == 512 and length_bucket(5000, 256, 2048) == 2048
    q = AdmissionQueue(2)
    q.push("batch", 1)
    q.push("batch2", 1)
    assert not q.full(1) and not q.full(0)  # batch work is never refused, and its backlog does not turn streams away
    q.push("stream", 0)
    q.push("stream2", 0)
    assert q.full(0) and q.waiting(0) == 2 and q.waiting(1) == 2
    assert q.remove_if(lambda x: x == "stream2") == ["stream2"] and not q.full(0)
    assert q.pop() == "stream" and q.pop() == "batch" and q.pop() == "batch2" and q.pop() is None
    m = SlotMap(3)
    a, b, c = m.add("a"), m.add("b"), m.add("c")
    assert (a, b, c) == (0, 1, 2) and not m.has_room()
    assert m.remove(0) == (2, 0) and m.seqs == ["c", "b"]
    assert m.remove(1) is None and m.seqs == ["c"]


@pytest.mark.parametrize("slots,overlap,fuse", [(1, True, "layer"), (3, True, "layer"), (8, True, "layer"),
                                                (3, False, "layer"), (3, True, "pass")])
def test_runner_greedy_codes_equal_reference(slots, overlap, fuse):
    """Any slot count (so requests queue, join mid-flight and leave), with or without reading a step back while
    the next one runs, per-layer or per-pass regions, gives the reference codes and audio."""
    eng = engine()
    reqs = requests(5)
    ref = reference(eng, reqs)
    out = EngineRunner(eng, max_slots=slots, max_context=256, overlap=overlap, fuse=fuse).synthesize(reqs)
    for (codes, wav), res in zip(ref, out):
        assert np.array_equal(res.codes, codes)
        assert res.audio.shape == wav.shape
        assert np.abs(res.audio - wav).max() < 1e-4  # streamed in growing chunks vs one-shot


@pytest.mark.parametrize("topk_cap,fuse", [(64, "layer"), (0, "layer"), (64, "pass")])
def test_runner_sampled_same_seed_same_codes_any_batch(topk_cap, fuse):
    """Sampling (top-k 50 from the checkpoint) gives the reference loop's codes for any batch, whether the
    step sorts only the best 64 ids (topk_cap) or the whole vocabulary."""
    eng = engine()
    reqs = requests(4, greedy=False)
    kw = dict(max_context=256, topk_cap=topk_cap, topk_min_batch=1, fuse=fuse)
    solo = [EngineRunner(eng, max_slots=1, **kw).synthesize([r])[0].codes for r in reqs]
    batched = [r.codes for r in EngineRunner(eng, max_slots=4, **kw).synthesize(reqs)]
    ref = reference(eng, reqs)
    for s, b, (r, _) in zip(solo, batched, ref):
        assert np.array_equal(s, b) and np.array_equal(s, r)


def test_runner_voice_clone_icl_matches_reference():
    eng = engine("base_small")
    reqs = [SynthesisRequest(text=t, language="english", ref_audio=str(TINY / "audio" / "ref_a_24k.wav"),
                             ref_text="A reference sentence.", sampling=SamplingParams.greedy(max_new_tokens=10))
            for t in TEXTS[:2]]
    ref = reference(eng, reqs)
    out = EngineRunner(eng, max_slots=2, max_context=512).synthesize(reqs)
    for (codes, wav), res in zip(ref, out):
        assert np.array_equal(res.codes, codes)
        assert res.audio.shape == wav.shape and np.abs(res.audio - wav).max() < 1e-4


@pytest.mark.parametrize("priority", [1, 0])
def test_runner_voice_clone_cuts_the_reference_like_the_official(priority, one_thread):
    """The official package cuts int(ref / total * samples) samples of reference audio off the decode of
    reference + generated frames: for 13 reference frames of 23 that is one sample short of 13 * 1920 (float
    rounding). The runner's whole result (batch work, and streams' result()) cuts exactly as much, though its
    chunks were cut at 13 * 1920 while the total was unknown: the result starts with that one sample."""
    from engines.model.voice import ClonedVoice

    eng = engine("base_small")
    full = eng.make_voice(str(TINY / "audio" / "ref_a_24k.wav"), "A reference sentence.")
    voice = ClonedVoice(spk_embedding=full.spk_embedding, ref_codes=full.ref_codes[:13], ref_text=full.ref_text)
    req = SynthesisRequest(text=TEXTS[0], language="english", voice=voice,
                           sampling=SamplingParams.greedy(max_new_tokens=11))
    [(g, ref_codes)] = eng.generate_codes([req])
    n_ref, total, spf = ref_codes.shape[0], ref_codes.shape[0] + g.codes.shape[0], eng.decoder.samples_per_frame
    assert int(n_ref / total * (total * spf)) == n_ref * spf - 1, (n_ref, total)  # a length where the cut differs
    wav = eng.decode(g.codes, ref_codes)
    assert wav.shape[0] == g.codes.shape[0] * spf + 1
    runner = EngineRunner(eng, max_slots=2, max_context=512)
    h = runner.submit(req, priority=priority)
    while not h.done:
        runner.step_once()
    chunks = list(h)
    res = h.result()
    assert np.array_equal(res.codes, g.codes.numpy())
    assert res.audio.shape == wav.shape and np.abs(res.audio - wav).max() < 1e-4
    assert np.array_equal(res.audio[1:], np.concatenate(chunks))  # chunks: from the reference's end


def test_stream_first_chunk_is_one_frame_and_chunks_join_exactly():
    eng = engine()
    runner = EngineRunner(eng, max_slots=2, max_context=256)
    [req] = requests(1, frames=20)
    h = runner.submit(req)
    chunks = []
    while not h.done:
        runner.step_once()
    chunks = list(h)
    assert chunks[0].shape[0] == 1920  # first audio after one frame
    assert [c.shape[0] // 1920 for c in chunks[:4]] == [1, 2, 4, 8]
    [(codes, wav)] = reference(eng, [req])
    assert np.abs(np.concatenate(chunks) - wav).max() < 1e-4
    # a handle already iterated to its end still gives its whole result (it used to wait forever)
    res = h.result()
    assert np.array_equal(res.audio, np.concatenate(chunks)) and list(h) == []


def test_cancel_frees_slot_and_errors_reach_the_handle():
    eng = engine()
    runner = EngineRunner(eng, max_slots=1, max_context=256, max_queue=2)
    a = runner.submit(requests(1, frames=40)[0])
    bad = runner.submit(SynthesisRequest(text="hi", voice="nobody"))
    runner.step_once()
    runner.step_once()
    assert runner.slots.n_active == 1
    a.cancel()
    runner.step_once()
    assert a.done and runner.slots.n_active == 0
    runner.step_once()  # the freed slot lets the queued request in; it fails on resolution
    assert bad.done
    with pytest.raises(Exception, match="unknown voice 'nobody'"):
        list(bad)
    runner.submit(requests(1)[0])
    runner.submit(requests(1)[0])
    with pytest.raises(EngineBusy):
        runner.submit(requests(1)[0])


def test_background_thread_streams():
    eng = engine()
    runner = EngineRunner(eng, max_slots=4, max_context=256)
    runner.start()
    try:
        hs = [runner.submit(r) for r in requests(3)]
        results = [h.result() for h in hs]
    finally:
        runner.stop()
    ref = reference(eng, requests(3))
    for (codes, _), res in zip(ref, results):
        assert np.array_equal(res.codes, codes)
    assert all(h.ttfa_s is not None and h.ttfa_s > 0 for h in hs)


@pytest.mark.gpu
@pytest.mark.parametrize("slots,overlap", [(1, False), (4, False), (1, True), (4, True)])
def test_gpu_graph_path_equals_eager(slots, overlap):
    """On CUDA in fp32: captured graphs, any batch, joins mid-flight and overlapped read-back give the eager
    codes."""
    torch.backends.cudnn.allow_tf32 = False  # TF32 convs round differently per chunk length
    torch.backends.cuda.matmul.allow_tf32 = False
    eng = engine(device="cuda")
    reqs = requests(6)
    ref = reference(eng, reqs)
    runner = EngineRunner(eng, max_slots=slots, max_context=256, compile=False, overlap=overlap)
    assert runner.use_graphs
    out = runner.synthesize(reqs)
    for (codes, wav), res in zip(ref, out):
        assert np.array_equal(res.codes, codes)
        assert np.abs(res.audio - wav).max() < 1e-4
    assert runner.graphs


@pytest.mark.gpu
def test_gpu_streams_and_batch_work_together_equal_eager():
    """On CUDA in fp32: streams (stream lane, waited for) and batch work (batch lane, collected later) in flight
    together, each lane on its own CUDA stream beside the decode steps: every request's codes and audio equal
    the eager reference, and streamed chunks arrive before the request ends."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    eng = engine(device="cuda")
    reqs = requests(8)
    ref = reference(eng, reqs)
    runner = EngineRunner(eng, max_slots=8, max_context=256, compile=False)
    runner.prepare()
    runner.start()
    try:
        handles = [runner.submit(r, priority=i % 2) for i, r in enumerate(reqs)]
        chunks = [sum(1 for _ in h) for h in handles]
        out = [h.result() for h in handles]
    finally:
        runner.stop()
    for (codes, wav), res in zip(ref, out):
        assert np.array_equal(res.codes, codes)
        assert np.abs(res.audio - wav).max() < 1e-4
    assert all(c >= 2 for c in chunks[0::2])  # streams: a small first chunk, then more


@pytest.mark.gpu
def test_gpu_compiled_graph_path_agrees_with_eager():
    """Compiled step regions inside the graphs (the default on CUDA): fp32 codes agree with the eager path."""
    torch.backends.cuda.matmul.allow_tf32 = False
    eng = engine(device="cuda")
    reqs = requests(6)
    ref = reference(eng, reqs)
    out = EngineRunner(eng, max_slots=4, max_context=256, compile=True).synthesize(reqs)
    same = sum(int(np.array_equal(r.codes, c)) for (c, _), r in zip(ref, out))
    frames = np.mean([np.mean(r.codes == c) for (c, _), r in zip(ref, out) if r.codes.shape == c.shape])
    print(f"compiled fp32: {same}/6 requests identical, {frames:.4f} of codes equal")
    assert frames > 0.9


def test_uniform_strictly_inside_unit_interval_and_suppressed_ids_never_drawn():
    from engines.model.sampling import SamplingTensors, draw, uniform

    seed = torch.arange(4096, dtype=torch.long)
    u = uniform(seed, torch.zeros_like(seed), 3072)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    logits = torch.randn(4096, 3072)
    logits[:, 2048:] = float("-inf")  # suppressed control ids
    st = SamplingTensors.build([(True, 0.9, 0, 1.0)] * 4096, "cpu")
    assert int(draw(logits, st, seed, torch.zeros_like(seed)).max()) < 2048


def test_runaway_guard_limits_frames_by_text_length():
    from engines.engine import runaway_frames

    eng = engine()
    short = eng.sampling(SamplingParams(), "Hi.").max_new_tokens
    long = eng.sampling(SamplingParams(), "word " * 200).max_new_tokens
    assert short == runaway_frames("Hi.") == 126  # the 10 s floor
    assert long == int(12.5 * 4 * 800 / 15) + 1 and long < eng.defaults.max_new_tokens  # spaces not counted
    assert runaway_frames("你好" * 30) > runaway_frames("ab" * 30)  # CJK characters weigh more
    assert eng.sampling(SamplingParams(max_new_tokens=7), "word " * 200).max_new_tokens == 7
    # enforced on the device: a request that never samples EOS stops at its limit
    [res] = EngineRunner(eng, max_slots=1, max_context=256).synthesize(
        [SynthesisRequest(text="Hi.", voice="vivian", sampling=SamplingParams(min_new_tokens=10**6, seed=1))])
    assert len(res.codes) == short - 1 and not res.finished_by_eos


def test_bf16_teacher_forced_agreement_guard():
    """bf16 picks the fp32 code for >= 90% of decisions when both see the same history (tiny model: 97.9%)."""
    from benchmarks.bf16_agreement import teacher_forced_picks

    f32, b16 = engine(), engine(dtype="bfloat16")
    [req] = requests(1, frames=20)
    [(gen, _)] = f32.generate_codes([req])
    a = teacher_forced_picks(f32, req, gen.codes)
    assert torch.equal(a, teacher_forced_picks(f32, req, gen.codes))  # deterministic
    assert float((a == teacher_forced_picks(b16, req, gen.codes)).float().mean()) >= 0.9


def test_fast_layer_one_row_reduction_form_matches_matmul_form():
    """The batch-1 form of a decoder layer (matmuls as fp32 reductions, used when compiled) equals the
    library-matmul form within fp32 rounding, cache writes included."""
    from engines.runtime.decode_step import StackWeights, make_layer

    eng = engine()
    stack = eng.talker.model
    c = stack.cfg
    w = StackWeights.of(stack, 64)
    torch.manual_seed(0)
    x = torch.randn(1, 1, c.hidden_size)
    pos = torch.tensor([[5]])
    kc0 = torch.randn(1, c.num_key_value_heads, 16, c.head_dim)
    vc0 = torch.randn_like(kc0)
    outs = []
    for gemv in (False, True):
        kc, vc = kc0.clone(), vc0.clone()
        fn = make_layer(c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps, gemv)
        with torch.no_grad():
            outs.append((fn(x, w.layers[0], kc, vc, pos, w.cos, w.sin), kc[:, :, 5].clone()))
    assert torch.allclose(outs[0][0], outs[1][0], atol=1e-5, rtol=1e-5)
    assert torch.allclose(outs[0][1], outs[1][1], atol=1e-5, rtol=1e-5)
    assert not torch.equal(outs[0][0], x)


def test_batch_work_leaves_a_reserve_of_slots_while_streams_are_about():
    """A book filling the engine must not make a stream wait for a batch row to end: while streams are
    about, batch work takes at most max_slots - stream_reserve slots and its codec calls are kept short;
    with no stream seen, all of them and long calls."""
    eng = engine()

    def batch_rows(runner):
        return sum(1 for s in runner.slots.seqs + runner.sched.prefilling if s.priority > 0)

    # (cpu_call_frames as batch_call_frames: the CPU's shorter calls would hide the change under test)
    quiet = EngineRunner(eng, max_slots=4, max_context=256, cpu_call_frames=1024)  # reserve: a quarter = 1 slot
    batch = [quiet.submit(r, priority=1) for r in requests(4, frames=30)]
    for _ in range(6):
        quiet.step_once()
    assert batch_rows(quiet) == 4  # no stream seen: batch work may use every slot
    assert quiet.lanes["batch"].frames_per_call == quiet.cfg.batch_call_frames  # ... and long codec calls

    runner = EngineRunner(eng, max_slots=4, max_context=256, cpu_call_frames=1024)
    first = runner.submit(requests(1, frames=2)[0])
    while not first.done:
        runner.step_once()
    batch = [runner.submit(r, priority=1) for r in requests(4, frames=30)]
    for _ in range(6):
        runner.step_once()
    assert batch_rows(runner) == 3 and len(runner.sched.queue) == 1  # one slot kept for streams
    assert runner.lanes["batch"].frames_per_call == runner.cfg.batch_call_frames_streams  # short batch calls
    stream = runner.submit(requests(1, frames=4)[0])
    runner.step_once()
    assert any(s.handle is stream for s in runner.slots.seqs + runner.sched.prefilling)  # admitted at once
    while not stream.done:
        runner.step_once()
    assert not any(h.done for h in batch)  # the stream finished while the book's rows were still running
    for h in batch:
        while not h.done:
            runner.step_once()
    assert all(h.result().audio.size for h in batch)


@pytest.mark.parametrize("frames", [2, 4, 8])
def test_a_request_ending_with_every_frame_decoded_completes(frames):
    """A request that ends on a step emitting no frame, right after a codec chunk took all its frames (1, 3,
    7... with chunks of 1, 2, 4), still completes (max_new_tokens 2, 4, 8 emit 1, 3, 7 frames; its codec lane used to wait for a due call forever)."""
    eng = engine()
    runner = EngineRunner(eng, max_slots=2, max_context=256)
    h = runner.submit(requests(1, frames=frames)[0])
    for _ in range(200):
        if h.done:
            break
        runner.step_once()
    assert h.done and h.result().audio.size > 0


def test_a_stream_about_to_run_dry_is_urgent():
    """The stream lane waits for a call when its listener (playing in real time since the first audio) has
    less than URGENT_S of audio left; not before the first audio, not with plenty buffered."""
    import time
    from types import SimpleNamespace

    from engines.runtime.postprocess import URGENT_S
    from engines.runtime.stream import StreamHandle

    runner = EngineRunner(engine(), max_slots=1, max_context=256)
    h = StreamHandle(runner, 24000)
    m = SimpleNamespace(seq=SimpleNamespace(handle=h))
    assert not runner._running_dry(m)  # no audio yet: the first-chunk rule applies, not this one
    h.add_audio(np.zeros(24000, np.float32))  # 1 s of audio, just now
    assert not runner._running_dry(m)
    h.marks["audio"] = time.perf_counter() - (1.0 - URGENT_S / 2)  # the listener is near its end
    assert runner._running_dry(m)


def test_book_segments_join_steadily_and_leave_prefill_rows_while_streams_are_about():
    """While streams are about, batch work joins the prefill group a few requests per iteration (no burst
    of book prompts makes one iteration long) and leaves rows of the group for streams; with no stream
    seen it fills the whole group at once."""
    from types import SimpleNamespace

    from engines.runtime.scheduler import Scheduler

    def seq(priority):
        return SimpleNamespace(priority=priority, handle=SimpleNamespace(cancelled=False), side_row=-1, slot=-1)

    def fill(sched, n, priority=1):
        for _ in range(n):
            sched.push(seq(priority), priority)

    quiet = Scheduler(64, 16, 8, stream_reserve=16, batch_admit=2, stream_rows=2)
    fill(quiet, 20)
    assert len(quiet.schedule(100, {True: 64, False: 64})) == 8  # no stream seen: a full group at once

    busy = Scheduler(64, 16, 8, stream_reserve=16, batch_admit=2, stream_rows=2)
    fill(busy, 1, priority=0)  # a stream arrives: streams are about from now on
    first = busy.schedule(100, {True: 64, False: 64})
    assert [s.priority for s in first] == [0]
    for s in first:
        busy.join(s)
    fill(busy, 20)
    joined = []
    for _ in range(5):  # five iterations: at most two book requests each, the group keeps two rows
        picked = busy.schedule(100, {True: 64, False: 64})
        assert len(picked) <= 2 and all(s.priority == 1 for s in picked)
        for s in picked:
            busy.join(s)
        joined += picked
    assert sum(1 for s in busy.prefilling if s.priority > 0) == 6  # 8 rows - 2 kept for streams
    fill(busy, 1, priority=0)
    assert [s.priority for s in busy.schedule(100, {True: 64, False: 64})] == [0]  # a stream finds its row


def test_a_stream_takes_the_slot_of_a_batch_request_which_starts_over_with_the_same_audio():
    """Streams always win: with every slot held by batch work, a stream that arrives gets a slot at once (the
    batch request with the fewest frames goes back to the queue) instead of waiting for a book row to end; the
    batch request starts over and its result is the one it would have had (same seed)."""
    eng = engine()
    reqs = requests(2, greedy=False, frames=40)
    want = EngineRunner(eng, max_slots=2, max_context=256).synthesize(reqs)
    runner = EngineRunner(eng, max_slots=2, max_context=256)  # reserve: a quarter of 2 = no slot kept
    batch = [runner.submit(r, priority=1) for r in reqs]
    while runner.slots.n_active < 2 or runner.frames < 10:
        runner.step_once()
    stream = runner.submit(requests(1, frames=4)[0])
    steps = 0
    while not stream.done:
        runner.step_once()
        steps += 1
    assert runner.preempted == 1 and steps < 15  # not after a batch row's remaining ~30 frames
    assert sum(h.done for h in batch) == 0  # it finished while the book's requests still ran
    while not all(h.done for h in batch):
        runner.step_once()
    for h, w in zip(batch, want):
        got = h.result()
        np.testing.assert_array_equal(got.codes, w.codes)
        np.testing.assert_allclose(got.audio, w.audio, atol=1e-5)


def test_a_streams_prompt_is_prefilled_alone():
    """A stream's prompt is not prefilled together with book prompts (a bigger prefill makes its iteration
    longer): in an iteration whose prefill group holds a stream, only streams are prefilled."""
    runner = EngineRunner(engine(), max_slots=4, max_context=256)
    book = runner.submit(requests(1, frames=8)[0], priority=1)
    stream = runner.submit(requests(1, frames=4)[0])
    runner.step_once()
    in_slots = [s.handle for s in runner.slots.seqs]
    waiting = [s for s in runner.sched.prefilling if s.handle is book]
    assert in_slots == [stream] and waiting and waiting[0].offset == 0
    runner.step_once()
    assert {s.handle for s in runner.slots.seqs} == {stream, book}
    while not (book.done and stream.done):
        runner.step_once()


def test_the_warm_up_request_is_no_clients_stream():
    """The daemon speaks a warm-up request on the stream path before it serves; a book submitted right
    after must still get every slot (a real stream keeps a quarter of them for streams for a minute)."""
    eng = engine()
    runner = EngineRunner(eng, max_slots=4, max_context=256)
    runner.start()
    try:
        runner.warm_up(requests(1, frames=2)[0])
        assert not runner.sched.streams_about()
        batch = [runner.submit(r, priority=1) for r in requests(4, frames=40)]
        deadline = time.monotonic() + 60
        while runner.slots.n_active < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert runner.slots.n_active == 4  # no slot held back for streams
        runner.submit(requests(1, frames=2)[0], priority=0).result()  # a client's stream counts
        assert runner.sched.streams_about()
        for h in batch:
            h.cancel()
    finally:
        runner.stop()


@pytest.mark.parametrize("slots,overlap,threads", [(1, True, 1), (3, True, 1), (3, False, 1), (3, True, 2)])
def test_the_codec_on_a_thread_of_its_own_gives_the_same_codes_and_audio(slots, overlap, threads):
    """A CPU engine's codec lanes on threads of their own (runtime.cpu_codec_threads, the daemon's default on
    a CPU of 2 cores or more: appliance.settings.cpu_split; with 2, a call's rows split over 2 threads):
    requests queue, join and leave, the codec's row resets and moves run on those threads in order, and
    every request gets the reference codes and audio. A stream's waited one-row call (its first audio) runs in
    the loop's thread instead (CodecLane._call_inline), after the worker's earlier work, its later calls on the
    worker again: the audio is the same."""
    eng = engine()
    reqs = requests(5)
    ref = reference(eng, reqs)
    runner = EngineRunner(eng, max_slots=slots, max_context=256, overlap=overlap, cpu_codec_threads=threads)
    assert all(ln.worker is not None for ln in runner.lanes.values())
    out = runner.synthesize(reqs[:2]) + runner.synthesize(reqs[2:], priority=0)  # the batch lane, then streams'
    for (codes, wav), res in zip(ref, out):
        assert np.array_equal(res.codes, codes)
        assert res.audio.shape == wav.shape and np.abs(res.audio - wav).max() < 1e-4
    stream = runner.lanes["stream"]
    assert runner.lanes["batch"].inline_calls == 0
    if slots == 1:  # every stream's first audio alone in its call, waited for: inline; the rest on the worker
        assert stream.inline_calls >= 3 and stream.calls > stream.inline_calls


def test_the_loop_takes_the_codec_s_cores_while_no_codec_call_runs():
    """runtime cpu_idle_threads (the daemon's: every usable core, appliance.settings.cpu_split): the loop
    thread prefills and steps with that many torch threads while no codec call runs (the first prompts come
    before any audio), with its own count while one does; the codes stay the reference's, and a runner
    driven from the caller's thread (no loop thread) leaves the caller's count alone."""
    eng = engine()
    saved = torch.get_num_threads()
    runner = EngineRunner(eng, max_slots=3, max_context=256, cpu_codec_threads=1, cpu_idle_threads=saved + 1)
    seen = []  # (a codec call running, the loop's torch threads then) at each pick (the state held throughout)
    pick, met = runner._pick_threads, threading.Event()

    def watched():
        before = any(ln.running for ln in runner.lanes.values())
        pick()
        if before == any(ln.running for ln in runner.lanes.values()):  # (else a call ended meanwhile)
            seen.append((before, torch.get_num_threads()))
            if before:
                met.set()
    runner._pick_threads = watched
    for ln in runner.lanes.values():  # the first codec call lasts until a step has met it running
        push = ln.codec.push

        def slow(*a, _push=push):
            met.wait(60)  # (a guard: however slow the machine, the loop picks while the call is held)
            return _push(*a)
        ln.codec.push = slow
    runner.start()
    try:
        results = [h.result() for h in [runner.submit(r, priority=1) for r in requests(3)]]
    finally:
        runner.stop()
    assert seen[0] == (False, saved + 1)  # the first prompts: no codec call yet
    assert {threads for running, threads in seen if running} == {saved}, seen
    assert {threads for running, threads in seen if not running} == {saved + 1}, seen
    for (codes, _), res in zip(reference(eng, requests(3)), results):
        assert np.array_equal(res.codes, codes)
    assert torch.get_num_threads() == saved
    sync = EngineRunner(eng, max_slots=3, max_context=256, cpu_codec_threads=1, cpu_idle_threads=saved + 1)
    sync.synthesize(requests(2))
    sync.stop()
    assert torch.get_num_threads() == saved


def test_a_codec_call_that_ends_mid_step_hands_its_cores_to_the_rest_of_the_step():
    """The loop re-picks its torch threads inside a step (FastStep.poll): a step that began while a codec call
    ran (the loop on its own count) takes cpu_idle_threads from the first poll after the call has ended."""
    eng = engine()
    saved = torch.get_num_threads()
    runner = EngineRunner(eng, max_slots=3, max_context=256, cpu_codec_threads=1, cpu_idle_threads=saved + 1)
    assert runner.model.fast.poll is not None
    release = threading.Event()
    for ln in runner.lanes.values():  # codec calls wait until a poll inside a step lets them go
        push = ln.codec.push

        def held(*a, _push=push):
            release.wait(60)
            return _push(*a)
        ln.codec.push = held
    poll, seen, polls = runner.model.fast.poll, [], [0]

    def watched():
        polls[0] += 1
        if release.is_set() or not any(ln.running for ln in runner.lanes.values()):
            return poll()
        before = torch.get_num_threads()  # a call runs: the step began (or went on) on the loop's own count
        poll()
        release.set()
        deadline = time.monotonic() + 300  # (a failure guard)
        while any(ln.running for ln in runner.lanes.values()) and time.monotonic() < deadline:
            time.sleep(0.005)
        poll()  # the same step, the call over
        seen.append((before, torch.get_num_threads()))
    runner.model.fast.poll = watched
    runner.start()
    try:
        results = [h.result() for h in [runner.submit(r, priority=1) for r in requests(3)]]
    finally:
        runner.stop()
    assert seen == [(saved, saved + 1)]
    for (codes, _), res in zip(reference(eng, requests(3)), results):
        assert np.array_equal(res.codes, codes)
    # asked before every predictor pass of every step, and between the talker's layers
    n_sub, layers = runner.model.fast.n_sub, len(runner.model.fast.tw.layers)
    assert polls[0] >= runner.model.steps * (n_sub + -(-layers // POLL_LAYERS))


def test_the_codec_threads_follow_the_loop_thread_and_stop_with_it():
    """With the loop in a thread of its own, the codec works on its lanes' threads (named codec-stream /
    codec-batch) and the loop thread keeps the torch thread count it was given; stop() lets them go."""

    eng = engine()
    saved = torch.get_num_threads()
    runner = EngineRunner(eng, max_slots=4, max_context=256, cpu_codec_threads=2)
    before = set(threading.enumerate())  # (other tests' runners may keep idle codec threads of their own)
    runner.start()
    try:
        hs = [runner.submit(r, priority=p) for r, p in zip(requests(4), (0, 1, 1, 0))]
        results = [h.result() for h in hs]
        ours = [t for t in threading.enumerate() if t not in before and t.name.startswith("codec-")]
        names = {t.name.split("_")[0] for t in ours}  # the lanes' threads; codec-rows: a call's second row group
        assert {"codec-stream", "codec-batch"} <= names <= {"codec-stream", "codec-batch", "codec-rows"}, ours
    finally:
        runner.stop()
    assert torch.get_num_threads() == saved
    for (codes, _), res in zip(reference(eng, requests(4)), results):
        assert np.array_equal(res.codes, codes)
    deadline = time.monotonic() + 30  # (a loaded machine: the threads wake to leave when they get a core)
    while any(t.is_alive() for t in ours):
        assert time.monotonic() < deadline, "the codec threads outlived the runner's stop()"
        time.sleep(0.05)
