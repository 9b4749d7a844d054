"""Codec backends in the runtime: pushes of the leading rows, row moves, codec lanes over any backend
(torch, ONNX Runtime) and the runner decoding with what `build-engines` built (all on CPU)."""
from __future__ import annotations

import logging
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import torch

from engines.codec import build as B
from engines.codec.backend_torch import TorchCodec
from engines.runtime.codec_lane import CodecLane
from engines.runtime.stream import FrameStore
from lane_util import drive_lane

TINY = Path(__file__).parent / "data" / "tiny"
HAS_ORT = all(B.detect_platform("cpu")[k] for k in ("onnx", "onnxruntime"))
needs_ort = pytest.mark.skipif(not HAS_ORT, reason="onnx / onnxruntime not installed")
TOL = 1e-4

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def step_onnx(decoder, tmp_path_factory):
    if not HAS_ORT:
        pytest.skip("onnx / onnxruntime not installed")
    from engines.codec.export import export_step

    return export_step(decoder, tmp_path_factory.mktemp("onnx") / "step.onnx")


@lru_cache(maxsize=None)
def engine(name="cv_small"):
    from engines.engine import TTSEngine

    return TTSEngine.load(TINY / name, device="cpu", dtype="float32")


def codes(decoder, b, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, decoder.config.codebook_size, (b, decoder.config.num_quantizers, n), generator=g)


def makers(decoder, step_onnx=None):
    out = {"torch": lambda b: TorchCodec(decoder, b),
           "torch-rows": lambda b: TorchCodec(decoder, b, row_threads=3)}  # a call's rows split over 3 threads
    if step_onnx is not None:
        from engines.codec.backend_onnx import OnnxCodec

        out["onnxruntime"] = lambda b: OnnxCodec(step_onnx, b, decoder.samples_per_frame, threads=1)
    return out


@pytest.mark.parametrize("backend", ["torch", "torch-rows", "onnxruntime"])
def test_push_of_leading_rows_leaves_the_others_alone(decoder, backend, request):
    onnx = request.getfixturevalue("step_onnx") if backend == "onnxruntime" else None
    make, spf = makers(decoder, onnx)[backend], decoder.samples_per_frame
    c = codes(decoder, 3, 9, seed=1)
    whole = make(3)
    ref = torch.cat([whole.push(c[..., :4]), whole.push(c[..., 4:])], -1)
    part = make(3)
    out = part.push(c[:2, :, :4])  # rows 0 and 1 only: row 2 waits
    assert out.shape == (2, 1, 4 * spf) and part.frames_decoded.tolist() == [4, 4, 0]
    assert float((out - ref[:2, :, :4 * spf]).abs().max()) <= TOL
    out = part.push(c[:2, :, 4:], torch.tensor([5, 5]))
    assert float((out - ref[:2, :, 4 * spf:]).abs().max()) <= TOL
    late = c.clone()
    late[:2] = 0  # rows 0 and 1 idle (n_valid 0): their streams must not move
    out = part.push(late[..., :4], torch.tensor([0, 0, 4]))
    out2 = part.push(late[..., 4:], torch.tensor([0, 0, 5]))
    assert part.frames_decoded.tolist() == [9, 9, 9]
    assert float((torch.cat([out, out2], -1)[2] - ref[2]).abs().max()) <= TOL
    tail = part.push(c[:2, :, :1])  # rows 0/1 continue exactly where they were
    assert float((tail - make_ref_continuation(decoder, c, make)).abs().max()) <= TOL


def make_ref_continuation(decoder, c, make):
    ref = make(2)
    ref.push(c[:2])
    return ref.push(c[:2, :, :1])


@pytest.mark.parametrize("backend", ["torch", "torch-rows", "onnxruntime"])
def test_move_copies_a_stream(decoder, backend, request):
    onnx = request.getfixturevalue("step_onnx") if backend == "onnxruntime" else None
    make = makers(decoder, onnx)[backend]
    c = codes(decoder, 2, 10, seed=2)
    with torch.inference_mode():
        ref = decoder(c)
    codec = make(3)
    codec.push(torch.cat([c[..., :6], torch.zeros_like(c[:1, :, :6])]))
    codec.move(1, 2)  # stream of row 1 now continues in row 2
    codec.reset(torch.tensor([False, True, False]))
    out = codec.push(torch.stack([c[0, :, 6:], torch.zeros_like(c[0, :, 6:]), c[1, :, 6:]]))
    assert codec.frames_decoded.tolist() == [10, 4, 10]
    spf = decoder.samples_per_frame
    assert float((out[2] - ref[1, :, 6 * spf:]).abs().max()) <= TOL
    assert float((out[0] - ref[0, :, 6 * spf:]).abs().max()) <= TOL
    with pytest.raises(ValueError, match="rows must lie in"):
        codec.move(0, 3)


def _drive(codec, frames, plan, first: int = 1, max_chunk: int = 4) -> list[np.ndarray]:
    return drive_lane(codec, frames, plan, first, max_chunk)[0]


@pytest.mark.parametrize("backend", ["torch", "torch-rows", "onnxruntime"])
def test_codec_lane_over_a_backend_equals_the_one_shot_decode(decoder, backend, request):
    onnx = request.getfixturevalue("step_onnx") if backend == "onnxruntime" else None
    frames = codes(decoder, 3, 12, seed=3).transpose(1, 2)  # [S, T, K]
    plan = [(1, 1, 0), (2, 1, 1), (3, 4, 2), (6, 6, 9)]
    ref = _drive(TorchCodec(decoder, 3), frames, plan)
    got = _drive(makers(decoder, onnx)[backend](4), frames, plan)
    with torch.inference_mode():
        one_shot = decoder(frames.transpose(1, 2))[:, 0].numpy()
    for r, g, o in zip(ref, got, one_shot):
        assert r.shape == g.shape == o.shape
        assert np.abs(r - g).max() <= TOL and np.abs(r - o).max() <= TOL


@pytest.mark.parametrize("backend,worker", [("torch", 0), ("onnxruntime", 0), ("torch", 1), ("onnxruntime", 1),
                                            ("torch-rows", 1)])
def test_codec_lane_decodes_only_valid_frames(decoder, backend, worker, request):
    """A FrameStore holding EOS (an id past the codebook) wherever no frame was written, the scratch row
    included: 3 requests in a 4-row lane (one idle row) with chunks that pad still get the one-shot decode
    of their frames; the lane call masks the rest of its window (the codec used to get EOS: IndexError).
    The same with the codec on a thread of its own (`worker`: the CPU lane's HostWorker), its calls, row
    resets and moves (members leave mid-way here) run there in order."""
    onnx = request.getfixturevalue("step_onnx") if backend == "onnxruntime" else None
    frames = codes(decoder, 3, 12, seed=11).transpose(1, 2)  # [S, T, K]
    eos = decoder.config.codebook_size + 102  # the tiny checkpoints' EOS id
    got, lane = drive_lane(makers(decoder, onnx)[backend](4), frames, [(1, 1, 0), (2, 1, 1), (3, 4, 2), (6, 6, 9)],
                           fill=eos, worker_threads=worker)
    assert (lane.worker is not None) == bool(worker)
    with torch.inference_mode():
        one_shot = decoder(frames.transpose(1, 2))[:, 0].numpy()
    for g, o in zip(got, one_shot):
        assert g.shape == o.shape and np.abs(g - o).max() <= TOL


class _Failing:
    """A codec whose push (or reset) fails: the error a worker thread meets."""

    def __init__(self, inner, where: str):
        self.inner, self.where = inner, where
        self.samples_per_frame, self.batch_size, self.decoder = inner.samples_per_frame, inner.batch_size, inner.decoder

    def push(self, codes, n_valid=None):
        if self.where == "push":
            raise RuntimeError("codec push failed")
        return self.inner.push(codes, n_valid)

    def reset(self, rows=None):
        if self.where == "reset" and rows is not None:
            raise RuntimeError("codec reset failed")
        return self.inner.reset(rows)

    def move(self, src, dst):
        return self.inner.move(src, dst)


@pytest.mark.parametrize("where", ["push", "reset"])
def test_a_codec_error_on_the_worker_thread_reaches_the_loop(decoder, where):
    """A call that fails on the lane's worker thread raises in the loop when its audio is collected (as a
    failed CUDA call does when its event is waited for); a row reset nobody waits for keeps its error for
    the lane's next collection. Either way the runner then fails the requests in flight (`reset_all`), after
    which the lane works again."""
    store = FrameStore(2, 8, decoder.config.num_quantizers, "cpu")
    store.codes.zero_()
    lane = CodecLane("test", _Failing(TorchCodec(decoder, 2), where), store, 1, 4, 4096, use_graphs=False,
                     worker_threads=1)
    m = lane.add("a", store.take(), 0)
    m.emitted = 2
    with pytest.raises(RuntimeError, match=f"codec {where} failed"):
        lane.run(block=True)
    lane.reset_all()
    lane.codec.where = None
    m = lane.add("b", store.take(), 0)
    m.emitted, m.finished = 3, True
    got, complete = 0, []
    for _ in range(6):  # chunks of 1, 2 frames
        out, done = lane.run(block=True)
        got, complete = got + sum(len(a) for _, a in out), complete + done
    assert got == 3 * decoder.samples_per_frame and complete == [m]
    lane.close()


def test_a_call_s_rows_are_decoded_on_threads_of_their_own(decoder):
    """row_threads (the CPU engine's codec threads): a push of several rows is split into groups decoded at
    once on as many threads, each with one torch thread; the audio and state equal the unsplit codec's over a
    ragged schedule (idle rows, prefix pushes, a reset and a move), an error in any group reaches the caller
    after every group has stopped, and close() lets the threads go."""
    import threading

    from engines.codec.parity import ragged_parity

    err = ragged_parity(lambda b: TorchCodec(decoder, b), lambda b: TorchCodec(decoder, b, row_threads=3), decoder,
                        batch=5)
    assert err <= TOL
    codec = TorchCodec(decoder, 5, row_threads=3)
    seen = []  # (thread, torch threads, rows) of every decoder call
    hook = decoder.register_forward_pre_hook(
        lambda m, args: seen.append((threading.current_thread().name, torch.get_num_threads(), args[0].shape[0])))
    try:
        codec.push(codes(decoder, 5, 2, seed=4))
        assert sorted(n for _, _, n in seen) == [1, 2, 2] and len({t for t, _, _ in seen}) == 3
        assert all(k == 1 for t, k, _ in seen if t != threading.current_thread().name)
        seen.clear()
        codec.push(codes(decoder, 1, 2, seed=5))  # one row: no split
        assert [(t, n) for t, _, n in seen] == [(threading.current_thread().name, 1)]
    finally:
        hook.remove()
    before = codec.frames_decoded.tolist()
    bad = codes(decoder, 5, 2, seed=6)
    bad[4, 0, 1] = decoder.config.codebook_size  # out of range in the last group (the debug guard is on)
    with pytest.raises(ValueError, match="codes out of range"):
        codec.push(bad)
    assert codec.frames_decoded.tolist()[4] == before[4]  # (the failing group stopped before its counter moved)
    helpers = [t for t in threading.enumerate() if t.name.startswith("codec-rows")]
    assert helpers
    codec.close()
    deadline = time.monotonic() + 30
    while any(t.is_alive() for t in helpers):
        assert time.monotonic() < deadline, "the row threads outlived close()"
        time.sleep(0.05)


def test_a_row_thread_keeps_its_one_torch_thread():
    """torch gives a thread the process-wide count (the last one any thread set) at its first parallel op
    unless the thread asked for its count before: the row threads' set-up asks, so the loop thread setting
    its own count (runtime cpu_idle_threads) after a row thread started leaves that one at 1."""
    import threading

    from engines.device.threads import own_torch_threads

    saved, started, go, seen = torch.get_num_threads(), threading.Event(), threading.Event(), []

    def row_thread():
        own_torch_threads(1)
        started.set()
        go.wait(30)
        a = torch.ones(300, 300)
        (a @ a).sum()
        seen.append(torch.get_num_threads())

    t = threading.Thread(target=row_thread)
    t.start()
    try:
        assert started.wait(30)
        torch.set_num_threads(saved + 1)  # (another thread's count: the process-wide one changes too)
        go.set()
        t.join(30)
    finally:
        torch.set_num_threads(saved)
    assert seen == [1]


def test_bench_call_decodes_a_zeroed_scratch_row(decoder):
    """bench_call decodes n frames of the scratch row, where free slots' steps write any id (EOS included):
    it zeroes the row first (it used to hand EOS to the codec)."""
    store = FrameStore(2, 8, decoder.config.num_quantizers, "cpu")
    store.codes.fill_(decoder.config.codebook_size + 102)
    lane = CodecLane("test", TorchCodec(decoder, 2), store, 1, 4, 4096, use_graphs=False)
    assert lane.bench_call(2, 4).shape == (2, 4 * decoder.samples_per_frame)
    assert not store.codes[store.trash].any()


def test_codec_lane_big_chunks_equal_small_chunks(decoder):
    """Batch work decodes in large chunks, streams in small growing ones: the same audio."""
    frames = codes(decoder, 3, 20, seed=5).transpose(1, 2)
    plan = [(3, 5, 1), (7, 5, 9), (10, 10, 10)]
    small = _drive(TorchCodec(decoder, 3), frames, plan, first=1, max_chunk=2)
    big = _drive(TorchCodec(decoder, 3), frames, plan, first=16, max_chunk=16)
    for s, b in zip(small, big):
        assert s.shape == b.shape and np.abs(s - b).max() <= TOL


def test_codec_lane_member_leaving_keeps_the_others_exact(decoder):
    """A request that ends early leaves its lane (the last member moves into its row); the others' audio
    still equals their one-shot decode."""
    frames = codes(decoder, 3, 8, seed=7).transpose(1, 2)
    store = FrameStore(3, 8, frames.shape[2], "cpu")
    lane = CodecLane("test", TorchCodec(decoder, 3), store, 1, 4, 4096, use_graphs=False)
    members = [lane.add(i, store.take(), 0) for i in range(3)]
    audio = [[] for _ in range(3)]

    def feed(i, a, b):
        store.codes[members[i].frame_row, a:b] = frames[i, a:b].int()
        members[i].emitted = b

    for i in range(3):
        feed(i, 0, 3)
    members[0].dropped = members[0].finished = True  # cancelled
    out, done = lane.run()
    assert done == [members[0]] and len(lane.members) == 2
    for m, a in out:
        audio[m.seq].append(a)
    for i in (1, 2):
        feed(i, 3, 8)
        members[i].finished = True
    for _ in range(4):
        out, _ = lane.run()
        for m, a in out:
            audio[m.seq].append(a)
    with torch.inference_mode():
        one_shot = decoder(frames.transpose(1, 2))[:, 0].numpy()
    for i in (1, 2):
        got = np.concatenate(audio[i])
        assert got.shape == one_shot[i].shape and np.abs(got - one_shot[i]).max() <= TOL


def test_runtime_codec_choices(decoder, tmp_path, caplog):
    eng = engine()
    codec = B.runtime_codec(eng, 3, "torch")
    assert isinstance(codec, TorchCodec) and codec.name == "torch" and codec.decoder is eng.decoder
    assert codec.batch_size == 3
    assert B.runtime_codec(eng, 3, "auto", cache_dir=tmp_path).name == "torch"  # nothing built there
    with caplog.at_level(logging.WARNING, logger="engines.codec.build"):
        assert B.runtime_codec(eng, 3, "built", cache_dir=tmp_path).name == "torch"
    assert "do not fit (no engines built yet)" in caplog.text
    with pytest.raises(ValueError, match="codec backend must be one of"):
        B.runtime_codec(eng, 3, "fastest")


@needs_ort
def test_runner_decodes_with_the_built_engine(tmp_path, monkeypatch):
    """build-engines on CPU ranks ONNX Runtime first (speed faked); the runner's codec then runs it and
    the audio equals the eager reference path."""
    from engines.api import SamplingParams, SynthesisRequest
    from engines.runtime.runner import EngineRunner

    eng = engine()
    monkeypatch.setattr(B, "speed", lambda make, dec, **kw: {"audio_s_per_s": 2.0 if make(1).name == "onnxruntime"
                                                              else 1.0})
    B.build_engines(eng.root, tmp_path, device="cpu", max_batch=4, chunk_frames=(1, 4))
    codec = B.runtime_codec(eng, 3, "auto", cache_dir=tmp_path)
    assert codec.name == "onnxruntime" and codec.batch_size == 3
    reqs = [SynthesisRequest(text=t, voice="vivian", language="english",
                             sampling=SamplingParams.greedy(max_new_tokens=10 + 3 * i, seed=i))
            for i, t in enumerate(["Hello there.", "Guten Tag.", "A third one here.", "And a fourth."])]
    ref = [eng.decode(g.codes, r) for g, r in eng.generate_codes(reqs)]
    runner = EngineRunner(eng, max_slots=3, max_context=256, codec_backend="auto", engine_cache=str(tmp_path))
    assert {lane.codec.name for lane in runner.lanes.values()} == {"onnxruntime"}
    for res, wav in zip(runner.synthesize(reqs), ref):
        assert res.audio.shape == wav.shape
        assert np.abs(res.audio - wav).max() <= TOL
