"""TensorRT codec: profile shapes from the config, bucket choice, and clean behaviour without TensorRT.

TensorRT itself is not installed where this was written: the tests that need it skip with a reason.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from engines.codec import build as B
from engines.codec import backend_trt as codec_trt
from engines.codec.export import STATE_IN, state_specs, step_input_names
from engines.codec.backend_trt import build_plan, pick_bucket, profile_shapes
from engines.model.config import CodecConfig, CodecDecoderConfig

TINY = Path(__file__).parent / "data" / "tiny"
HAS_TRT = importlib.util.find_spec("tensorrt") is not None
no_trt = pytest.mark.skipif(HAS_TRT, reason="tensorrt is installed: the without-TensorRT paths do not apply")
needs_trt = pytest.mark.skipif(not HAS_TRT, reason="tensorrt not installed (NVIDIA-only; not available here)")




pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("which", ["tiny", "real"])
def test_profile_shapes_cover_every_input(which, codec_dir):
    cfg = CodecConfig.from_dir(codec_dir).decoder if which == "tiny" else CodecDecoderConfig()
    profiles = profile_shapes(cfg, max_batch=6, chunk_frames=(4, 1, 2, 4))
    assert len(profiles) == 3  # one per distinct chunk size
    names = step_input_names(cfg)
    specs = state_specs(cfg, 1)
    for c, prof in zip((1, 2, 4), profiles):
        assert sorted(prof) == sorted(names)  # TensorRT needs a shape range for every dynamic input
        assert prof["codes"] == ((1, 16, c), (6, 16, c), (6, 16, c))
        assert prof["n_valid"] == prof["pos"] == ((1,), (6,), (6,))
        for name, shape in specs.items():
            lo, opt, hi = prof[STATE_IN + name]
            assert lo == (1, *shape[1:]) and opt == hi == (6, *shape[1:])
    if which == "real":  # the real codec: 8 layers x (K, V) [B, 16, 71, 64] among the states
        kv = [s for n, s in specs.items() if n.endswith((".k", ".v"))]
        assert len(kv) == 16 and all(s[1:] == (16, 71, 64) for s in kv)


def test_profile_shapes_reject_nonsense():
    with pytest.raises(ValueError, match="max_batch >= 1"):
        profile_shapes(CodecDecoderConfig(), 0, (1,))
    with pytest.raises(ValueError):
        profile_shapes(CodecDecoderConfig(), 2, ())


def test_pick_bucket():
    assert pick_bucket(1, [1, 4, 8]) == 1
    assert pick_bucket(3, [8, 1, 4]) == 4
    assert pick_bucket(8, [1, 4, 8]) == 8
    with pytest.raises(ValueError, match="split the push"):
        pick_bucket(9, [1, 4, 8])


@no_trt
def test_without_tensorrt_build_and_runtime_say_so(tmp_path):
    assert codec_trt.import_tensorrt() is None
    with pytest.raises(RuntimeError, match="TensorRT is not installed"):
        build_plan(tmp_path / "x.onnx", tmp_path / "x.plan", CodecDecoderConfig(), 2, (1, 4))
    with pytest.raises(RuntimeError, match="TensorRT is not installed"):
        codec_trt.TrtCodec(tmp_path / "x.plan")


@no_trt
def test_cuda_machine_without_tensorrt_builds_torch_only(codec_dir, tmp_path, monkeypatch):
    """On an NVIDIA machine without TensorRT the build records why and ranks the torch codec."""
    real = B.detect_platform

    def fake_gpu(dev="auto"):
        return dict(real("cpu"), device="cuda", device_name="NVIDIA H100 80GB HBM3", capability="9.0",
                    driver="550.54.15", tensorrt=None)

    monkeypatch.setattr(B, "detect_platform", fake_gpu)
    monkeypatch.setattr(B, "resolve_device", lambda dev="auto": "cuda")
    m = B.build_engines(codec_dir, tmp_path, device="cuda", max_batch=2, chunk_frames=(1, 4), backends=("tensorrt",))
    assert m["ranking"] == ["torch"] and "tensorrt" in m["skipped"]
    assert m["skipped"]["tensorrt"] == "missing library: tensorrt is not installed"
    assert m["platform"]["driver"] == "550.54.15" and m["platform"]["capability"] == "9.0"


@needs_trt
@pytest.mark.gpu
def test_trt_plan_matches_torch_codec(codec_dir, tmp_path):  # pragma: no cover - needs TensorRT + GPU
    from engines.codec.export import export_step
    from engines.codec.backend_trt import TrtCodec
    from engines.codec.parity import stream_parity
    from engines.codec.decoder import load_codec_decoder

    dec = load_codec_decoder(codec_dir, "cpu", torch.float32)
    onnx_path = export_step(dec, tmp_path / "step.onnx")
    build_plan(onnx_path, tmp_path / "step.plan", dec.config, 4, (1, 2, 4, 8), "fp32")
    err = stream_parity(lambda b: TrtCodec(tmp_path / "step.plan", b, dec.samples_per_frame, "cuda"), dec,
                        schedule=(1, 3, 8, 2, 11))
    assert err <= 1e-3
