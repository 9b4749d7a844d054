"""ONNX export of the codec (streaming step and one-shot) and the ONNX Runtime backend, on CPU.

Tolerance: max abs 1e-4 against the fp32 torch codec (waveform in [-1, 1]); measured ~1e-5.
"""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

onnx = pytest.importorskip("onnx", reason="onnx not installed (pip install 'tts-appliance[onnx]')")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime not installed (pip install 'tts-appliance[onnx]')")

from engines.codec.export import (  # noqa: E402
    STATE_IN, STATE_OUT, export_one_shot, export_step, state_specs, step_input_names, step_output_names)
from engines.codec.backend_onnx import OnnxCodec, make_session  # noqa: E402
from engines.codec.backend_torch import TorchCodec  # noqa: E402
from engines.codec.decoder import load_codec_decoder  # noqa: E402
from conftest import tiny_codec_dir

log = logging.getLogger(__name__)
TINY = Path(__file__).parent / "data" / "tiny"
TOL = 1e-4




pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def step_path(decoder, tmp_path_factory):
    return export_step(decoder, tmp_path_factory.mktemp("onnx") / "step.onnx")


@pytest.fixture(scope="module")
def one_shot_path(decoder, tmp_path_factory):
    return export_one_shot(decoder, tmp_path_factory.mktemp("onnx") / "one.onnx")


def _codes(decoder, batch, frames, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, decoder.config.codebook_size, (batch, decoder.config.num_quantizers, frames), generator=g)


def _dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def test_step_graph_inputs_outputs_and_dynamic_axes(decoder, step_path):
    model = onnx.load(str(step_path))
    ins = {i.name: _dims(i) for i in model.graph.input}
    outs = {o.name: _dims(o) for o in model.graph.output}
    assert list(ins) == step_input_names(decoder) and list(outs) == step_output_names(decoder)
    k = decoder.config.num_quantizers
    assert ins["codes"] == ["batch", k, "frames"] and ins["n_valid"] == ["batch"] and ins["pos"] == ["batch"]
    assert outs["wav"][0] == "batch" and outs["wav"][1] == 1
    specs = state_specs(decoder.config, 1)
    assert len(specs) == len(decoder.stream_state_shapes(1)) > 0
    for name, shape in specs.items():
        assert ins[STATE_IN + name] == ["batch", *shape[1:]], name
        assert outs[STATE_OUT + name][1:] == list(shape[1:]), name
    types = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    assert types["codes"] == onnx.TensorProto.INT64 and types["pos"] == onnx.TensorProto.INT64
    assert all(p >= 0 for n in model.graph.node if n.op_type == "Transpose"
               for a in n.attribute if a.name == "perm" for p in a.ints)


@pytest.mark.parametrize("batch,frames", [(1, 5), (3, 37)])
def test_one_shot_parity(decoder, one_shot_path, batch, frames):
    sess = make_session(one_shot_path, threads=1)
    codes = _codes(decoder, batch, frames)
    with torch.inference_mode():
        ref = decoder(codes)
    (wav,) = sess.run(None, {"codes": codes.numpy()})
    assert wav.shape == (batch, 1, frames * decoder.samples_per_frame)
    err = float((torch.from_numpy(wav) - ref).abs().max())
    log.info("one-shot B=%d T=%d: max abs %.3g", batch, frames, err)
    assert err <= TOL


SCHEDULES = {"one_frame": [1] * 24, "four": [4] * 6, "uneven": [3, 7, 1, 11, 2], "one_chunk": [24],
             "growing": [1, 2, 4, 8, 9]}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_streaming_parity_over_chunk_schedules(decoder, step_path, name):
    codes = _codes(decoder, 2, 24, seed=1)
    with torch.inference_mode():
        ref = decoder(codes)
    codec, outs, i = OnnxCodec(step_path, 2, decoder.samples_per_frame, threads=1), [], 0
    for n in SCHEDULES[name]:
        out = codec.push(codes[..., i:i + n])
        assert out.shape == (2, 1, n * decoder.samples_per_frame)
        outs.append(out)
        i += n
    assert codec.frames_decoded.tolist() == [24, 24]
    err = float((torch.cat(outs, -1) - ref).abs().max())
    log.info("ORT streaming %s: max abs %.3g", name, err)
    assert err <= TOL, f"{name}: {err:.3g}"


def test_ragged_rows_and_reset_match_torch_backend(decoder, step_path):
    """Per-row n_valid (including idle rows) and a mid-stream reset behave as in the torch codec."""
    spf, plans = decoder.samples_per_frame, [[3, 1, 4, 0, 2], [1, 0, 4, 4, 1], [4, 4, 2, 1, 3]]
    codes = _codes(decoder, 3, 20, seed=2)
    ours, ref = OnnxCodec(step_path, 3, spf, threads=1), TorchCodec(decoder, 3)
    done = [0, 0, 0]
    for step in range(5):
        n = [p[step] for p in plans]
        piece = torch.zeros(3, decoder.config.num_quantizers, max(n), dtype=torch.long)
        for r in range(3):
            piece[r, :, :n[r]] = codes[r, :, done[r]:done[r] + n[r]]
            done[r] += n[r]
        nv = torch.tensor(n)
        a, b = ours.push(piece, nv), ref.push(piece, nv)
        for r in range(3):
            err = float((a[r, :, :n[r] * spf] - b[r, :, :n[r] * spf]).abs().max()) if n[r] else 0.0
            assert err <= TOL, f"step {step} row {r}: {err:.3g}"
        if step == 2:
            rows = torch.tensor([False, True, False])
            ours.reset(rows), ref.reset(rows)
    assert ours.frames_decoded.tolist() == ref.frames_decoded.tolist()
    assert ours.flush().shape == (3, 1, 0) and ours.frames_decoded.tolist() == [0, 0, 0]


def test_backends_share_the_interface(decoder, step_path):
    from engines.codec.backend import CodecBackend

    for codec in (OnnxCodec(step_path, 2, decoder.samples_per_frame, threads=1), TorchCodec(decoder, 2)):
        assert isinstance(codec, CodecBackend) and codec.batch_size == 2 and codec.samples_per_frame == 1920


def test_dynamic_batch_one_graph(decoder, step_path):
    codes = _codes(decoder, 4, 6, seed=3)
    with torch.inference_mode():
        ref = decoder(codes)
    for b in (1, 4):
        out = OnnxCodec(step_path, b, decoder.samples_per_frame, threads=1).push(codes[:b])
        assert float((out - ref[:b]).abs().max()) <= TOL


def test_bad_inputs_say_what_to_do(decoder, step_path):
    codec = OnnxCodec(step_path, 2, decoder.samples_per_frame, threads=1)
    with pytest.raises(ValueError, match=r"push expects codes \[b, 16, n\] with 1 <= b <= 2"):
        codec.push(_codes(decoder, 3, 3))
    with pytest.raises(ValueError, match="n_valid must lie in"):
        codec.push(_codes(decoder, 2, 3), torch.tensor([4, 1]))
    with pytest.raises(ValueError, match="fp32 CPU decoder"):
        export_step(load_codec_decoder(tiny_codec_dir(), "cpu", torch.float64), step_path.parent / "x.onnx")
