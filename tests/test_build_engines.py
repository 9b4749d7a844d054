"""Install-time engine builds: manifest written and matched, rebuild / fallback with reasons, CLI."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

from engines.codec import build as B
from engines.codec import manifest as M
from engines.codec.backend_torch import TorchCodec
from engines.device.detect import detect_platform

TINY = Path(__file__).parent / "data" / "tiny"
HAS_ONNX = all(B.detect_platform("cpu")[k] for k in ("onnx", "onnxruntime"))
needs_onnx = pytest.mark.skipif(not HAS_ONNX, reason="onnx / onnxruntime not installed")




pytestmark = pytest.mark.usefixtures("one_thread")


def _fake_speed(make, decoder, **kw):  # deterministic ranking: ORT "faster" than torch
    return {"audio_s_per_s": 2.0 if make(1).name == "onnxruntime" else 1.0, "chunk_frames": 4, "batch": 1}


@pytest.fixture(scope="module")
def built(codec_dir, tmp_path_factory):
    """One CPU build of the tiny codec, shared by the tests that only read it."""
    cache = tmp_path_factory.mktemp("engines")
    mp = pytest.MonkeyPatch()
    mp.setattr(B, "speed", _fake_speed)
    try:
        manifest = B.build_engines(codec_dir, cache, device="cpu", max_batch=4, chunk_frames=(1, 4))
    finally:
        mp.undo()
    return cache, manifest


def test_manifest_written_and_matched(codec_dir, built):
    cache, manifest = built
    on_disk = json.loads((cache / M.MANIFEST).read_text())
    assert on_disk == manifest and manifest["format"] == M.FORMAT
    assert manifest["model"] == M.model_identity(codec_dir)
    plat = manifest["platform"]
    for key in ("device", "device_name", "capability", "driver", "torch", "onnxruntime", "tensorrt", "cpu"):
        assert key in plat
    assert plat["device"] == "cpu" and manifest["options"]["chunk_frames"] == [1, 4]
    assert M.stale_reasons(manifest, detect_platform("cpu"), M.model_identity(codec_dir)) == []
    assert manifest["ranking"][-1] in ("torch", "onnxruntime") and "torch" in manifest["ranking"]
    # up to date: a second build returns the same manifest without rebuilding
    assert B.build_engines(codec_dir, cache, device="cpu", max_batch=4)["created"] == manifest["created"]


@needs_onnx
def test_onnx_engine_built_checked_and_loaded(codec_dir, built):
    cache, manifest = built
    ort = next(e for e in manifest["engines"] if e["backend"] == "onnxruntime")
    assert (cache / ort["file"]).is_file() and ort["parity_ok"] and ort["parity_max_abs"] < 1e-4
    assert manifest["ranking"] == ["onnxruntime", "torch"]  # from the (faked) CPU speed figures
    codec = B.load_built_codec(codec_dir, cache, "cpu", batch_size=2, rebuild=False)
    assert codec.name == "onnxruntime" and codec.batch_size == 2
    ref = TorchCodec(codec_decoder(codec_dir), 2)
    codes = torch.randint(0, 16, (2, 16, 5))
    assert float((codec.push(codes) - ref.push(codes)).abs().max()) < 1e-4


def codec_decoder(codec_dir):
    from engines.codec.decoder import load_codec_decoder

    return load_codec_decoder(M.codec_dir(codec_dir), "cpu", torch.float32)


def test_stale_reasons_name_the_cause(codec_dir, built):
    _, manifest = built
    ident = M.model_identity(codec_dir)
    gpu = dict(manifest["platform"], device="cuda", device_name="NVIDIA A100", capability="8.0",
               driver="535.1", tensorrt="10.0.1")
    m = dict(manifest, platform=gpu, engines=manifest["engines"] + [{"backend": "tensorrt", "file": "x.plan"}])
    assert M.stale_reasons(m, gpu, ident) == []
    assert "different GPU" in M.stale_reasons(m, dict(gpu, device_name="NVIDIA H100", capability="9.0"), ident)[0]
    assert "new driver (535.1 -> 550.2)" in M.stale_reasons(m, dict(gpu, driver="550.2"), ident)
    assert "new TensorRT (10.0.1 -> 10.3.0)" in M.stale_reasons(m, dict(gpu, tensorrt="10.3.0"), ident)
    assert "new model" in M.stale_reasons(m, gpu, dict(ident, codec_weights="0" * 16))[0]
    assert "different device (cuda -> cpu)" in M.stale_reasons(m, manifest["platform"], ident)
    assert M.stale_reasons(None, gpu, ident) == ["no engines built yet"]


def test_model_change_triggers_rebuild_with_reason(codec_dir, tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(B, "speed", _fake_speed)
    B.build_engines(codec_dir, tmp_path, device="cpu", max_batch=2, chunk_frames=(2,), backends=())
    m = json.loads((tmp_path / M.MANIFEST).read_text())
    m["model"]["codec_weights"] = "deadbeefdeadbeef"
    (tmp_path / M.MANIFEST).write_text(json.dumps(m))
    with caplog.at_level(logging.WARNING, logger="engines.codec.build"):
        codec = B.load_built_codec(codec_dir, tmp_path, "cpu")
    assert "must be rebuilt: new model (codec weights deadbeefdeadbeef" in caplog.text
    rebuilt = M.read_manifest(tmp_path)
    assert rebuilt["model"] == M.model_identity(codec_dir) and rebuilt["options"]["chunk_frames"] == [2]
    assert codec.name == "torch"  # backends=() was kept: torch only


def test_stale_without_rebuild_falls_back_to_torch(codec_dir, tmp_path, caplog):
    engine = SimpleNamespace(root=codec_dir, decoder=codec_decoder(codec_dir), device=torch.device("cpu"))
    with caplog.at_level(logging.WARNING, logger="engines.codec.build"):
        codec = B.load_built_codec(engine, tmp_path, rebuild=False)
    assert isinstance(codec, TorchCodec) and codec.decoder is engine.decoder
    assert "do not fit (no engines built yet): using the torch codec" in caplog.text


@needs_onnx
def test_missing_library_falls_back_with_reason(codec_dir, built, monkeypatch, caplog):
    cache, _ = built
    real = B.detect_platform
    monkeypatch.setattr(B, "detect_platform", lambda dev="auto": dict(real(dev), onnxruntime=None))
    with caplog.at_level(logging.WARNING, logger="engines.codec.build"):
        codec = B.load_built_codec(codec_dir, cache, "cpu", rebuild=False)
    assert codec.name == "torch"
    assert "codec engine onnxruntime not used: missing library: onnxruntime is not installed" in caplog.text


def test_cli_help_lists_options():
    from appliance.cli import cli

    res = CliRunner().invoke(cli, ["build-engines", "--help"])
    assert res.exit_code == 0, res.output
    for opt in ("--model", "--cache", "--device", "--max-batch", "--chunk-frames", "--precision", "--force"):
        assert opt in res.output


def test_cli_builds_tiny_checkpoint(codec_dir, tmp_path):
    from appliance.cli import cli

    res = CliRunner().invoke(cli, ["build-engines", "--model", str(codec_dir), "--cache", str(tmp_path),
                                   "--device", "cpu", "--max-batch", "2", "--chunk-frames", "4,1",
                                   "--no-benchmark"])
    assert res.exit_code == 0, res.output
    assert "order of use:" in res.output and (tmp_path / M.MANIFEST).is_file()
    assert M.read_manifest(tmp_path)["options"]["chunk_frames"] == [1, 4]
    bad = CliRunner().invoke(cli, ["build-engines", "--model", str(codec_dir), "--chunk-frames", "x"])
    assert bad.exit_code != 0 and "comma-separated frame counts" in bad.output


def test_default_backends_per_device():
    assert B.default_backends("cpu") == ("onnxruntime",)
    assert B.default_backends("cuda:1") == ("tensorrt", M.COMPILED)
    assert B.default_backends("npu:0") == ()
    assert B.default_compile_dtypes("cuda") == ("float32", "bfloat16") and B.default_compile_dtypes("cpu") == ("float32",)


def test_cli_rejects_unknown_backends_and_dtypes(codec_dir):
    from appliance.cli import cli

    bad = CliRunner().invoke(cli, ["build-engines", "--model", str(codec_dir), "--backends", "onnxruntime,magic"])
    assert bad.exit_code != 0 and "unknown backends ['magic']" in bad.output and "torch-compiled" in bad.output
    bad = CliRunner().invoke(cli, ["build-engines", "--model", str(codec_dir), "--compile-dtypes", "float8"])
    assert bad.exit_code != 0 and "--compile-dtypes" in bad.output
    with pytest.raises(ValueError, match="compile dtypes must be among"):
        B.build_engines(codec_dir, None, device="cpu", compile_dtypes=("int8",))


def test_gpu_ranking_puts_a_slower_compiled_codec_after_eager():
    fast = {"audio_s_per_s": 10.0}
    slow = {"audio_s_per_s": 5.0}
    engines = [{"backend": "torch"}, {"backend": M.COMPILED, "gpu_speed": fast, "eager_gpu_speed": slow},
               {"backend": "tensorrt"}]
    assert B._rank(engines, "cuda") == ["tensorrt", M.COMPILED, "torch"]
    engines[1].update(gpu_speed=slow, eager_gpu_speed=fast)
    assert B._rank(engines, "cuda") == ["tensorrt", "torch", M.COMPILED]
    engines[1]["parity_ok"] = False
    assert B._rank(engines, "cuda") == ["tensorrt", "torch"]
