"""The channels-last fused upsampling stack (engines.codec.fast) against the reference decoder."""
from __future__ import annotations

import pytest
import torch

from engines.codec.backend_torch import TorchCodec
from engines.codec.fast import FastStack, epilogue
from engines.codec.parity import ragged_parity, random_codes
from engines.codec.streaming import StreamingCodecDecoder

TOL = 1e-4  # fp32; waveform in [-1, 1] (the tiny codec's own fp32-vs-fp64 error is ~1e-5)


def _not_trivial(wav: torch.Tensor) -> None:
    """The comparison means something: audio, not silence or a clamped rail."""
    assert wav.abs().mean() > 0.05 and (wav.abs() < 0.999).float().mean() > 0.5


def test_one_shot_equals_reference(decoder, one_thread):
    codes = random_codes(decoder, 3, 23, seed=1)
    with torch.inference_mode():
        ref, fast = decoder(codes), decoder(codes, fast=True)
    _not_trivial(ref)
    assert fast.shape == ref.shape
    assert (fast - ref).abs().max() < TOL


@pytest.mark.parametrize("polyphase", [True, False])
def test_ragged_streams_equal_reference(decoder, one_thread, polyphase):
    """Ragged pushes (idle rows, one-frame pushes, a reset and a moved stream) decode as the reference does."""
    decoder.__dict__["_fast"] = FastStack(decoder, polyphase=polyphase)
    try:
        err = ragged_parity(lambda b: TorchCodec(decoder, b, fast=False), lambda b: TorchCodec(decoder, b, fast=True),
                            decoder)
    finally:
        decoder.__dict__.pop("_fast")
    assert err < TOL


def test_streams_switch_between_paths(decoder, one_thread):
    """Both paths keep the same stream state: a stream begun on one continues on the other exactly."""
    codes = random_codes(decoder, 2, 20, seed=2)
    with torch.inference_mode():
        ref = decoder(codes)
    sd = StreamingCodecDecoder(decoder, 2)
    parts, i = [], 0
    for n, fast in ((3, False), (5, True), (1, False), (11, True)):
        sd.fast = fast
        parts.append(sd.push(codes[..., i:i + n]))
        i += n
    assert (torch.cat(parts, -1) - ref).abs().max() < TOL


def test_epilogue_math():
    g = torch.Generator().manual_seed(0)
    src, res = torch.randn(2, 5, 3, generator=g), torch.randn(2, 5, 3, generator=g)
    bias, alpha, inv_beta = torch.randn(3, generator=g), torch.rand(3, generator=g) + 0.5, torch.rand(3, generator=g)
    y, s = torch.empty(2, 5, 3), torch.empty(2, 5, 3)
    epilogue(src, bias=bias, res=res, snake=(alpha, inv_beta), y=y, s=s)
    v = src + bias + res
    assert torch.allclose(y, v)
    assert torch.allclose(s, v + inv_beta * torch.sin(v * alpha) ** 2)


def test_fast_stack_rejects_a_moved_decoder(decoder):
    stack = FastStack(decoder)
    with pytest.raises(RuntimeError, match="rebuild"):
        stack(torch.zeros(1, decoder.config.latent_dim, 2, dtype=torch.float64))


def test_compiled_and_fast_are_exclusive(decoder):
    with pytest.raises(ValueError, match="compile or fast"):
        TorchCodec(decoder, 2, compile=True, fast=True)


def _cuda_decoders(codec_dir):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from engines.codec.decoder import load_codec_decoder

    return load_codec_decoder(codec_dir, "cuda", torch.float32), load_codec_decoder(codec_dir, "cuda", torch.bfloat16)


@pytest.mark.gpu
def test_gpu_fast_stack_equals_reference(codec_dir):
    """On CUDA (Triton epilogue, cuDNN channels-last convs): ragged fp32 streams equal the reference codec,
    and in bf16 the fast stack is no further from the fp32 decode than the reference is."""
    dec32, dec16 = _cuda_decoders(codec_dir)
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        err = ragged_parity(lambda b: TorchCodec(dec32, b, fast=False), lambda b: TorchCodec(dec32, b, fast=True),
                            dec32)
        assert TorchCodec(dec32, 2).stream.fast  # the eager codec's default on CUDA
        codes = random_codes(dec32, 3, 40, seed=3).cuda()
        with torch.inference_mode():
            truth = dec32(codes)
            e_ref = (dec16(codes).float() - truth).abs().mean().item()
            e_fast = (dec16(codes, fast=True).float() - truth).abs().mean().item()
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    assert err < TOL
    assert e_fast <= 1.5 * e_ref + 1e-3, (e_fast, e_ref)


@pytest.mark.gpu
def test_gpu_epilogue_kernel_matches_torch():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from engines.codec import fast

    if fast.triton is None:
        pytest.skip("triton missing")
    g = torch.Generator(device="cuda").manual_seed(0)
    big = torch.randn(3, 7 + 4000, 96, device="cuda", generator=g)  # rows with a batch stride != rows * C
    src, res = big[:, 7:], torch.randn(3, 4000, 96, device="cuda", generator=g)
    bias = torch.randn(96, device="cuda", generator=g)
    alpha, inv_beta = torch.rand(96, device="cuda", generator=g) + 0.5, torch.rand(96, device="cuda", generator=g)
    y, s = torch.full_like(res, float("nan")), torch.full_like(res, float("nan"))
    epilogue(src, bias=bias, res=res, snake=(alpha, inv_beta), y=y, s=s)
    v = src + bias + res
    assert torch.allclose(y, v, atol=1e-5)
    assert torch.allclose(s, v + inv_beta * torch.sin(v * alpha) ** 2, atol=1e-4)
