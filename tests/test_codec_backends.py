"""Codec backends in the runtime: pushes of the leading rows, row moves, CodecStreams over any backend
(torch, ONNX Runtime) and the runner decoding with what `build-engines` built (all on CPU)."""
from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import torch

from engines.codec import build as B
from engines.codec.backend_torch import TorchCodec
from engines.runtime.stream import CodecStreams

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
    from engines.api import TTSEngine

    return TTSEngine.load(TINY / name, device="cpu", dtype="float32")


def codes(decoder, b, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, decoder.config.codebook_size, (b, decoder.config.num_quantizers, n), generator=g)


def makers(decoder, step_onnx=None):
    out = {"torch": lambda b: TorchCodec(decoder, b)}
    if step_onnx is not None:
        from engines.codec.backend_onnx import OnnxCodec

        out["onnxruntime"] = lambda b: OnnxCodec(step_onnx, b, decoder.samples_per_frame, threads=1)
    return out


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
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


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
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


def _drive(streams: CodecStreams, frames: torch.Tensor, plan) -> list[np.ndarray]:
    """Feed frames [S, T, 16] to slots following `plan` (frames per slot per round), as the runner does."""
    s = frames.shape[0]
    for i in range(s):
        streams.start(i, None)
    audio, pos = [[] for _ in range(s)], [0] * s
    for rnd in plan:
        for i, k in enumerate(rnd):
            for _ in range(k):
                streams.push_frame(i, frames[i, pos[i]])
                pos[i] += 1
        finished = [pos[i] == frames.shape[1] for i in range(s)]
        for slot, a in streams.run(s, finished):
            audio[slot].append(a)
    return [np.concatenate(a) for a in audio]


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_codec_streams_over_a_backend_equal_the_default(decoder, backend, request):
    onnx = request.getfixturevalue("step_onnx") if backend == "onnxruntime" else None
    frames = codes(decoder, 3, 12, seed=3).transpose(1, 2)  # [S, T, K]
    plan = [(1, 1, 0), (2, 1, 1), (3, 4, 2), (6, 6, 9)]
    ref = _drive(CodecStreams(decoder, 3, 1, 4, 24000), frames, plan)
    got = _drive(CodecStreams(makers(decoder, onnx)[backend](4), 3, 1, 4, 24000), frames, plan)
    with torch.inference_mode():
        one_shot = decoder(frames.transpose(1, 2))[:, 0].numpy()
    for r, g, o in zip(ref, got, one_shot):
        assert r.shape == g.shape == o.shape
        assert np.abs(r - g).max() <= TOL and np.abs(r - o).max() <= TOL


def test_codec_streams_default_is_the_eager_torch_codec(decoder):
    s = CodecStreams(decoder, 2, 1, 16, 24000, use_graphs=True)
    assert isinstance(s.codec, TorchCodec) and s.codec.name == "torch" and s.codec.batch_size == 2 and s.graphed
    with pytest.raises(ValueError, match="holds 1 streams, the runner has 2 slots"):
        CodecStreams(TorchCodec(decoder, 1), 2, 1, 16, 24000)


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
    runner = EngineRunner(eng, max_slots=3, max_context=256)
    # the hook the runner would use (engines.codec.build.runtime_codec -> CodecStreams): set by hand here
    runner.codec = CodecStreams(codec, 3, runner.cfg.first_chunk_frames, runner.cfg.max_chunk_frames,
                                eng.sample_rate, use_graphs=runner.use_graphs)
    runner.codec.before_capture = runner._drain
    for res, wav in zip(runner.synthesize(reqs), ref):
        assert res.audio.shape == wav.shape
        assert np.abs(res.audio - wav).max() <= TOL
