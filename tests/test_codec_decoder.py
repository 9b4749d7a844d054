"""Codec decoder: parity with the official qwen-tts decode (golden data) and exact streaming."""
from __future__ import annotations

import json
import re
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from engines.codec.decoder import CodecDecoder, load_codec_decoder
from engines.model.errors import CheckpointError
from engines.codec.streaming import StreamingCodecDecoder

log = logging.getLogger(__name__)
TINY = Path(__file__).parent / "data" / "tiny"
GOLDEN = TINY / "golden" / "codec.npz"
pytestmark = pytest.mark.skipif(not GOLDEN.is_file(),
                                reason=f"tiny fixtures not built yet ({GOLDEN} missing)")

PARITY_TOL = 1e-4  # ours vs official, fp32 CPU
STREAM_TOL = 5e-5  # streamed vs one-shot, fp32 CPU: kernels sum in a length- and CPU-dependent order (1.06e-5 seen)


pytestmark = [pytestmark, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def codec_dir() -> Path:
    meta = json.loads((TINY / "golden" / "codec.json").read_text())
    return TINY / meta["codec_dir"]


@pytest.fixture(scope="module")
def golden():
    return np.load(GOLDEN)


@pytest.fixture(scope="module")
def model(codec_dir) -> CodecDecoder:
    return load_codec_decoder(codec_dir, "cpu", torch.float32)


def _codes(golden, t: int) -> torch.Tensor:
    return torch.from_numpy(golden[f"codes_T{t}"]).transpose(1, 2)  # [1, 16, T]


def _check(ours: torch.Tensor, ref: np.ndarray, what: str, tol: float = PARITY_TOL) -> float:
    ours = ours.detach().float().numpy().reshape(-1)
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != {ref.shape}"
    assert np.abs(ref).std() > 1e-2, f"{what}: golden output is degenerate"
    err = float(np.abs(ours - ref).max())
    log.info("%s: max abs diff %.3g", what, err)
    assert err <= tol, f"{what}: max abs diff {err:.3g} > {tol}"
    return err


@pytest.mark.parametrize("t", [5, 37, 130])
def test_forward_matches_official(model, golden, t):
    with torch.inference_mode():
        wav = model(_codes(golden, t))
    assert wav.shape == (1, 1, t * 1920)
    _check(wav, golden[f"forward_T{t}"], f"forward T={t}")


@pytest.mark.parametrize("t", [5, 37, 130])
def test_chunked_decode_matches_official(model, golden, t):
    with torch.inference_mode():
        _check(model.chunked_decode(_codes(golden, t)), golden[f"decode_T{t}"], f"decode T={t}")


@pytest.mark.parametrize("chunk,ctx", [(16, 4), (50, 25)])
def test_small_chunks_match_official(model, golden, chunk, ctx):
    with torch.inference_mode():
        wav = model.chunked_decode(_codes(golden, 130), chunk, ctx)
    _check(wav, golden[f"chunked_T130_c{chunk}_l{ctx}"], f"chunked c={chunk} l={ctx}")
    if ctx < 8:  # a context shorter than the receptive field changes the output: the case is not trivial
        assert np.abs(golden[f"chunked_T130_c{chunk}_l{ctx}"] - golden["forward_T130"]).max() > 1e-2


def test_padded_batch_decode_matches_official_wrapper(model, golden):
    rows = [torch.from_numpy(golden["codes_T5"][0]), torch.from_numpy(golden["codes_T37"][0])]
    codes = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=-1)  # [2, 37, 16]
    with torch.inference_mode():
        wavs = model.decode(codes)
    for i, wav in enumerate(wavs):
        _check(wav, golden[f"wrapper_decode_batch.{i}"], f"wrapper row {i}")


def _codes_batch(golden, extra_rows: int = 1, seed: int = 0) -> torch.Tensor:
    """Golden T=130 codes plus random rows: [1 + extra_rows, 16, 130]."""
    g = torch.Generator().manual_seed(seed)
    meta = json.loads((TINY / "golden" / "codec.json").read_text())
    size = json.loads((TINY / meta["codec_dir"] / "config.json").read_text())["decoder_config"]["codebook_size"]
    rnd = torch.randint(0, size, (extra_rows, 16, 130), generator=g)
    return torch.cat([_codes(golden, 130), rnd])


SCHEDULES = {
    "one_frame": [1] * 130,
    "four": [4] * 33,
    "uneven": [3, 7, 1, 11, 2, 9, 5] * 19,
    "small_then_growing": [1, 2, 4, 8, 16, 32, 64, 128],
    "one_chunk": [130],
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_streaming_equals_one_shot(model, golden, name):
    codes = _codes_batch(golden)
    with torch.inference_mode():
        ref = model(codes)
    stream = StreamingCodecDecoder(model, batch_size=2)
    outs, i = [], 0
    for n in SCHEDULES[name]:
        if i >= codes.shape[-1]:
            break
        piece = codes[..., i:i + n]
        out = stream.push(piece)
        assert out.shape == (2, 1, piece.shape[-1] * 1920)
        outs.append(out)
        i += piece.shape[-1]
    assert i == 130 and stream.frames_decoded.tolist() == [130, 130]
    tail = stream.flush()
    assert tail.shape == (2, 1, 0)
    got = torch.cat(outs + [tail], dim=-1)
    assert got.shape == ref.shape
    err = (got - ref).abs().max().item()
    log.info("streaming %s: max abs diff %.3g", name, err)
    assert err <= STREAM_TOL, f"{name}: {err:.3g}"
    _check(got[:1], golden["forward_T130"], f"streaming {name} vs official")


def _stream(model, codes, schedule) -> torch.Tensor:
    stream, outs, i = StreamingCodecDecoder(model, batch_size=codes.shape[0]), [], 0
    for n in schedule:
        outs.append(stream.push(codes[..., i:i + n]))
        i += n
    return torch.cat(outs, dim=-1)


def test_streaming_is_exact_in_fp64(codec_dir, golden):
    """In fp64 rounding noise vanishes: streaming must equal one-shot to ~1e-14, which proves the
    carried state (conv tails, transposed-conv overlap, KV cache, positions) is complete."""
    model = load_codec_decoder(codec_dir, "cpu", torch.float64)
    codes = _codes_batch(golden)[..., :60]
    with torch.inference_mode():
        ref = model(codes)
        for schedule in ([1] * 60, [3, 7, 1, 11, 2, 9, 5, 3, 7, 1, 11]):
            err = (_stream(model, codes, schedule) - ref).abs().max().item()
            assert err <= 1e-10, f"{schedule[:3]}: {err:.3g}"
        # negative control: dropping the attention cache half-way must be visible
        stream = StreamingCodecDecoder(model, batch_size=2)
        first = stream.push(codes[..., :30])
        for key, buf in stream.state.bufs.items():
            if key.endswith((".k", ".v")):
                buf.zero_()
        broken = torch.cat([first, stream.push(codes[..., 30:])], dim=-1)
        assert (broken - ref).abs().max().item() > 1e-3


def test_streaming_rows_are_independent(model, golden):
    """Rows advance by different amounts per call (n_valid) and one row starts a new stream."""
    codes = _codes_batch(golden, extra_rows=2, seed=1)  # [3, 16, 130]
    with torch.inference_mode():
        ref = model(codes)
    stream = StreamingCodecDecoder(model, batch_size=3)
    got = [[] for _ in range(3)]
    done = [0, 0, 0]
    plans = [[5, 5, 2, 7, 3, 1, 8], [1, 0, 8, 4, 8, 2, 8], [8, 8, 0, 3, 1, 8, 6]]  # frames per call, per row
    for step in range(200):
        want = [plans[r][step % 7] for r in range(3)]
        n = [min(w, 130 - d) for w, d in zip(want, done)]
        if max(n) == 0:
            break
        width = max(n)
        piece = torch.zeros(3, 16, width, dtype=torch.long)
        for r in range(3):
            piece[r, :, :n[r]] = codes[r, :, done[r]:done[r] + n[r]]
        wav = stream.push(piece, n_valid=torch.tensor(n))
        for r in range(3):
            got[r].append(wav[r, :, :n[r] * 1920])
            done[r] += n[r]
        if step == 3:  # row 2 ends its stream and starts over from frame 0
            stream.flush(torch.tensor([False, False, True]))
            restart = torch.cat(got[2], dim=-1)
            got[2], done[2] = [], 0
    assert done == [130, 130, 130] and stream.frames_decoded.tolist() == [130, 130, 130]
    for r in range(3):
        err = (torch.cat(got[r], dim=-1) - ref[r]).abs().max().item()
        assert err <= STREAM_TOL, f"row {r}: {err:.3g}"
    n0 = restart.shape[-1] // 1920
    assert n0 > 0
    with torch.inference_mode():
        assert (restart - model(codes[2:, :, :n0])[0]).abs().max().item() <= STREAM_TOL


def test_reset_starts_a_fresh_stream(model, golden):
    codes = _codes(golden, 37)
    stream = StreamingCodecDecoder(model)
    first = torch.cat([stream.push(codes[..., i:i + 6]) for i in range(0, 37, 6)], dim=-1)
    stream.reset()
    assert stream.frames_decoded.tolist() == [0]
    again = torch.cat([stream.push(codes[..., i:i + 10]) for i in range(0, 37, 10)], dim=-1)
    assert (first - again).abs().max().item() <= STREAM_TOL
    _check(again, golden["forward_T37"], "after reset")


def test_load_casts_dtype(codec_dir, model, golden):
    half = load_codec_decoder(codec_dir, "cpu", torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert half.pre_transformer.inv_freq.dtype == torch.float32
    with torch.inference_mode():
        wav = half(_codes(golden, 37))
    assert wav.dtype == torch.bfloat16 and wav.shape == (1, 1, 37 * 1920)
    assert torch.isfinite(wav.float()).all()


def _copy_codec(src: Path, dst: Path, drop: str | None = None, add: str | None = None) -> Path:
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    sd = load_file(str(src / "model.safetensors"))
    if drop:
        del sd[drop]
    if add:
        sd[add] = torch.zeros(2)
    save_file(sd, str(dst / "model.safetensors"))
    return dst


def test_missing_weights_file_is_named(codec_dir, tmp_path):
    (tmp_path / "st").mkdir()
    shutil.copy(codec_dir / "config.json", tmp_path / "st" / "config.json")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_codec_decoder(tmp_path / "st")
    with pytest.raises(CheckpointError, match="config.json"):
        load_codec_decoder(tmp_path / "nowhere")


def test_missing_key_is_named(codec_dir, tmp_path):
    key = "decoder.pre_transformer.layers.1.mlp.up_proj.weight"
    bad = _copy_codec(codec_dir, tmp_path / "st", drop=key)
    with pytest.raises(CheckpointError, match=r"missing keys: \['" + re.escape(key) + r"'\]") as e:
        load_codec_decoder(bad)
    assert str(bad / "model.safetensors") in str(e.value)


def test_unexpected_key_is_named(codec_dir, tmp_path):
    bad = _copy_codec(codec_dir, tmp_path / "st", add="decoder.decoder.9.conv.weight")
    with pytest.raises(CheckpointError, match=r"unexpected keys: \['decoder\.decoder\.9\.conv\.weight'\]"):
        load_codec_decoder(bad)


def test_corrupt_file_is_named(codec_dir, tmp_path):
    (tmp_path / "st").mkdir()
    shutil.copy(codec_dir / "config.json", tmp_path / "st" / "config.json")
    (tmp_path / "st" / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="corrupt"):
        load_codec_decoder(tmp_path / "st")


def test_codebook_clamps_small_usage(model):
    cb = model.quantizer.rvq_rest.vq.layers[3]._codebook
    with torch.no_grad():
        saved = cb.cluster_usage[7].clone()
        cb.cluster_usage[7] = 0.0
        try:
            entry = cb(torch.tensor([[7]]))[0, 0]
            assert torch.equal(entry, cb.embedding_sum[7] / 1e-5)
        finally:
            cb.cluster_usage[7] = saved


def test_in_place_layers_equal_their_out_of_place_form():
    """SnakeBeta and the residual unit write their temporaries in place in eager inference; under autograd
    (as under ONNX export or torch.compile) they keep the out-of-place form: both give the same numbers."""
    from engines.codec.layers import ResidualUnit, SnakeBeta

    torch.manual_seed(0)
    x = torch.randn(3, 16, 50) * 3
    snake, unit = SnakeBeta(16), ResidualUnit(16, 3)
    with torch.no_grad():
        for p in (snake.alpha, snake.beta, unit.act1.alpha, unit.act2.beta):
            p.normal_(0, 0.5)
    with torch.inference_mode():
        fast_snake, fast_unit = snake(x), unit(x)
    ref = x + (1.0 / (snake.beta.exp() + 1e-9))[None, :, None] * torch.sin(x * snake.alpha.exp()[None, :, None]) ** 2
    assert torch.allclose(fast_snake, ref, atol=1e-5, rtol=1e-6)
    xg = x.clone().requires_grad_(True)
    assert torch.allclose(fast_snake, snake(xg), atol=1e-5, rtol=1e-6)
    assert torch.allclose(fast_unit, unit(xg), atol=1e-5, rtol=1e-6)
    assert not torch.equal(fast_unit, x)  # (the unit did something)
