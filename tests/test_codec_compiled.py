"""The compiled torch codec (torch.compile / inductor of the streaming step) on the CPU: exact against
eager, one graph for every shape, its build into the engine cache, fallbacks with reasons, and the
codec benchmark script at tiny sizes.

Inductor needs a C++ compiler on the CPU; without one the tests that compile skip. The first compile
of the tiny codec takes 1-3 minutes on a 2-core machine: every test here shares one inductor cache
folder (the engine cache's `inductor/`), so later ones load the generated code instead.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from engines.codec import build as B
from engines.codec import manifest as M
from engines.codec import backend_compiled as cc
from engines.codec.backend_torch import TorchCodec
from engines.codec.parity import RAGGED, ragged_parity
from engines.codec.decoder import load_codec_decoder
from lane_util import drive_lane

NO_COMPILE = cc.unavailable_reason("cpu")
needs_compiler = pytest.mark.skipif(bool(NO_COMPILE), reason=f"inductor cannot compile here: {NO_COMPILE}")
TOL = 1e-4

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def engine_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("engines")


@pytest.fixture(scope="module")
def compiled(decoder, engine_cache):
    """One warmed compiled codec factory (the compile happens once, here)."""
    codec = TorchCodec(decoder, 3, compile=True, cache_dir=engine_cache / M.INDUCTOR_DIR)
    secs = codec.warm()
    assert codec.fallback_reason is None, codec.fallback_reason
    logging.getLogger(__name__).info("tiny codec compiled in %.1f s", secs)
    return lambda b: TorchCodec(decoder, b, compile=True, cache_dir=engine_cache / M.INDUCTOR_DIR)


@needs_compiler
def test_compiled_push_on_a_window_of_rows_matches_eager(decoder, compiled):
    """Pushes on rows [r, r + b) (a codec lane's windows): a one-row push on the last row is padded with an idle
    row before it, not after (there is none), and no other row's stream moves."""
    g = torch.Generator().manual_seed(3)
    k, size = decoder.config.num_quantizers, decoder.config.codebook_size
    codes = torch.randint(0, size, (3, k, 5), generator=g)
    eager, comp = TorchCodec(decoder, 3), compiled(3)
    for rows, first, span in (((0, 3), 0, (0, 2)), ((2, 3), 2, (2, 3)), ((1, 3), 1, (2, 4)), ((2, 3), 2, (3, 5))):
        c = codes[rows[0]:rows[1], :, span[0]:span[1]]
        a, b = eager.push(c, first_row=first), comp.push(c, first_row=first)
        assert a.shape == b.shape and (a - b).abs().max().item() <= TOL
        assert torch.equal(eager.frames_decoded, comp.frames_decoded)
    assert comp.frames_decoded.tolist() == [2, 4, 7]


@needs_compiler
def test_compiled_matches_eager_on_ragged_streams(decoder, compiled):
    """Prefix pushes, one-row and one-frame pushes (padded inside), idle rows, reset and move."""
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    err = ragged_parity(lambda b: TorchCodec(decoder, b), compiled, decoder, schedule=RAGGED + ((3, 7), (1, 2)))
    assert err <= TOL, err
    assert counters["stats"]["unique_graphs"] == graphs  # every shape ran the one graph traced at warm-up
    codec = compiled(2)
    assert codec.name == "torch-compiled" and codec.graphable and codec.batch_size == 2
    assert codec.frames_decoded.shape == (2,) and codec.flush().shape == (2, 1, 0)


@needs_compiler
def test_compiled_equals_one_shot_decode(decoder, compiled):
    g = torch.Generator().manual_seed(4)
    c = torch.randint(0, decoder.config.codebook_size, (2, decoder.config.num_quantizers, 13), generator=g)
    with torch.inference_mode():
        ref = decoder(c)
    codec, outs, i = compiled(2), [], 0
    for n in (1, 4, 8):
        outs.append(codec.push(c[..., i:i + n]))
        i += n
    assert float((torch.cat(outs, -1) - ref).abs().max()) <= TOL
    assert codec.frames_decoded.tolist() == [13, 13]


@needs_compiler
def test_codec_lane_with_the_compiled_codec(decoder, compiled):
    """A codec lane decodes with the compiled codec exactly as with the eager one."""
    g = torch.Generator().manual_seed(5)
    frames = torch.randint(0, decoder.config.codebook_size, (3, 10, decoder.config.num_quantizers), generator=g)
    plan = ((1, 1, 0), (2, 1, 1), (4, 4, 4), (3, 4, 5))
    eager, _ = drive_lane(TorchCodec(decoder, 3), frames, plan)
    fast, _ = drive_lane(compiled(3), frames, plan)
    for a, b in zip(eager, fast):
        assert a.shape == b.shape and np.abs(a - b).max() <= TOL


@needs_compiler
def test_build_engines_compiles_into_the_cache_and_loads(codec_dir, engine_cache, compiled, monkeypatch):
    def fake_speed(make, dec, **kw):  # deterministic ranking: compiled "faster" than eager
        return {"audio_s_per_s": 3.0 if make(1).name == M.COMPILED else 1.0}

    monkeypatch.setattr(B, "speed", fake_speed)
    m = B.build_engines(codec_dir, engine_cache, device="cpu", max_batch=2, chunk_frames=(1, 4),
                        backends=(M.COMPILED,))
    entry = next(e for e in m["engines"] if e["backend"] == M.COMPILED)
    assert entry["cache"] == M.INDUCTOR_DIR and entry["torch"] == torch.__version__
    assert entry["parity_ok"] and entry["dtypes"]["float32"]["parity_max_abs"] <= TOL
    assert entry["cpu_speed"]["audio_s_per_s"] == 3.0 and entry["eager_cpu_speed"]["audio_s_per_s"] == 1.0
    assert any((engine_cache / M.INDUCTOR_DIR).rglob("*")), "nothing written to the inductor cache"
    assert m["ranking"] == [M.COMPILED, "torch"] and m["options"]["compile_dtypes"] == ["float32"]
    codec = B.load_built_codec(codec_dir, engine_cache, "cpu", batch_size=2, rebuild=False)
    assert codec.name == M.COMPILED and codec.fallback_reason is None
    # a new torch version invalidates the check (not the code: inductor keys its cache itself)
    plat = dict(m["platform"], torch="9.9.9")
    assert any(w.startswith("new torch") for w in M.stale_reasons(m, plat, M.model_identity(codec_dir)))


def test_no_compiler_is_skipped_with_the_reason(codec_dir, tmp_path, monkeypatch, caplog):
    why = "missing compiler: inductor needs a C++ compiler on the CPU (apt install g++)"
    monkeypatch.setattr(cc, "unavailable_reason", lambda device: why)
    with caplog.at_level(logging.WARNING, logger="engines.codec.build"):
        m = B.build_engines(codec_dir, tmp_path, device="cpu", max_batch=2, backends=(M.COMPILED,), benchmark=False)
    assert m["skipped"][M.COMPILED] == why and m["ranking"] == ["torch"]
    assert "compiled torch codec not built: missing compiler" in caplog.text
    dec = load_codec_decoder(codec_dir, "cpu", torch.float32)
    with pytest.raises(RuntimeError, match="cannot compile the codec: missing compiler"):
        TorchCodec(dec, 2, compile=True)


def test_failed_compile_falls_back_to_eager_with_a_log_line(decoder, monkeypatch, caplog):
    def broken():
        def fn(*args):
            raise RuntimeError("inductor exploded")
        return fn

    monkeypatch.setattr(cc, "unavailable_reason", lambda device: None)
    monkeypatch.setattr(cc, "compiled_step", broken)
    codec = TorchCodec(decoder, 2, compile=True)
    g = torch.Generator().manual_seed(6)
    c = torch.randint(0, decoder.config.codebook_size, (2, decoder.config.num_quantizers, 3), generator=g)
    with caplog.at_level(logging.WARNING, logger="engines.codec.backend_torch"):
        out = codec.push(c)
    assert "torch.compile of the codec failed (RuntimeError: inductor exploded): using the eager torch codec" \
        in caplog.text
    assert codec.name == "torch" and codec.fallback_reason.startswith("RuntimeError")
    with torch.inference_mode():
        assert float((out - decoder(c)).abs().max()) <= TOL


def test_inductor_cache_env_is_scoped(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere")
    import os

    with cc.inductor_cache(tmp_path / "ind"):
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str((tmp_path / "ind").resolve())
        assert os.environ["TRITON_CACHE_DIR"] == str((tmp_path / "ind" / "triton").resolve())
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ and os.environ["TRITON_CACHE_DIR"] == "/elsewhere"
    assert cc.unavailable_reason("npu:0").startswith("torch.compile of the codec is not supported")


@pytest.mark.parametrize("modes", ["eager,graph", pytest.param("eager,compiled", marks=needs_compiler)])
def test_codec_benchmark_runs_on_cpu_at_tiny_size(modes, engine_cache, tmp_path, request):
    from benchmarks import codec_gpu

    if "compiled" in modes:
        request.getfixturevalue("compiled")  # share the warmed cache
    js, md = tmp_path / "codec.json", tmp_path / "codec.md"
    res = codec_gpu.main(["--device", "cpu", "--codec", "tiny", "--batches", "1,2", "--chunks", "1,4",
                          "--dtypes", "float32", "--modes", modes, "--reps", "2", "--warmup", "1",
                          "--cache", str(engine_cache / M.INDUCTOR_DIR), "--json", str(js), "--md", str(md)])
    saved = json.loads(js.read_text())
    assert saved["results"] == res["results"] and len(res["results"]) == 2 * 2 * len(modes.split(","))
    for row in res["results"]:
        assert row["ms_per_call"] > 0 and row["audio_s_per_s"] > 0 and "error" not in row
    assert res["env"]["device_name"] and "| float32 batch | chunk |" in md.read_text()
    if "compiled" in modes:
        assert res["compile"]["float32"]["parity_max_abs"] <= TOL
        assert {r["backend"] for r in res["results"] if r["mode"] == "compiled"} == {"torch-compiled"}


@pytest.mark.gpu
def test_compiled_codec_in_cuda_graphs_matches_eager(codec_dir, tmp_path):  # pragma: no cover - needs a GPU
    """On CUDA: a codec lane captures the compiled call per bucket; fp32 audio equals the eager codec's
    (TF32 off, so both sides compute in true fp32)."""
    why = cc.unavailable_reason("cuda")
    if why:
        pytest.skip(why)
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        dec = load_codec_decoder(codec_dir, "cuda", torch.float32)
        codec = TorchCodec(dec, 4, compile=True, cache_dir=tmp_path)
        codec.warm()
        assert codec.fallback_reason is None, codec.fallback_reason
        g = torch.Generator().manual_seed(7)
        frames = torch.randint(0, dec.config.codebook_size, (4, 20, dec.config.num_quantizers), generator=g)
        plan = ((1, 1, 1, 0), (2, 2, 1, 1), (4, 4, 4, 4), (8, 8, 8, 8), (5, 5, 6, 7))
        outs = []
        for c, wait in ((TorchCodec(dec, 4), True), (codec, True), (TorchCodec(dec, 4), False)):
            # wait=False: calls overlap on the lane's stream and their audio is collected later (batch lane)
            audio, lane = drive_lane(c, frames, plan, first=1, max_chunk=8, use_graphs=True, device="cuda", wait=wait)
            assert len(lane.graphs) >= 3  # buckets were captured
            outs.append(audio)
        for a, b in zip(outs[0], outs[2]):
            assert a.shape == b.shape and np.abs(a - b).max() <= TOL
        for a, b in zip(*outs[:2]):
            assert a.shape == b.shape == (20 * dec.samples_per_frame,)
            assert np.abs(a - b).max() <= TOL
        err = ragged_parity(lambda b: TorchCodec(dec, b),
                            lambda b: TorchCodec(dec, b, compile=True, cache_dir=tmp_path), dec)
        assert err <= TOL
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
