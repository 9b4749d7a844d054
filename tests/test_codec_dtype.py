"""The codec lanes' dtype (runtime.codec_dtype, engines.codec.dtype): bf16 on a CPU with bf16 dot instructions,
decided once by the loader; the codes never change, the audio stays close to the fp32 codec's."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engines.codec import dtype as codec_dtype
from engines.codec.parity import snr_db
from engines.runtime.runner import EngineRunner
from tests.test_runtime import engine, reference, requests


def test_auto_takes_bf16_for_an_fp32_engine_on_a_cpu_with_bf16_dots(monkeypatch):
    monkeypatch.setattr("engines.device.detect.cpu_flags", lambda: frozenset({"avx2", "avx512f", "avx512_bf16"}))
    assert codec_dtype.codec_dtype_setting("auto", "cpu", torch.float32)[0] == "bfloat16"
    assert codec_dtype.codec_dtype_setting("auto", "cpu", torch.bfloat16)[0] == "model"
    assert codec_dtype.codec_dtype_setting("auto", "cuda", torch.float32)[0] == "model"
    assert codec_dtype.codec_dtype_setting("model", "cpu", torch.float32) == ("model", "configured")
    monkeypatch.setattr("engines.device.detect.cpu_flags", lambda: frozenset({"avx2", "fma"}))
    fmt, why = codec_dtype.codec_dtype_setting("auto", "cpu", torch.float32)
    assert fmt == "model" and "no bf16 dot instructions" in why
    assert codec_dtype.codec_dtype_setting("bfloat16", "cpu", torch.float32)[0] == "bfloat16"  # asked: runs anyway
    with pytest.raises(ValueError, match="runtime.codec_dtype.*one of auto, model, bfloat16"):
        codec_dtype.codec_dtype_setting("fp16", "cpu", torch.float32)


def test_the_lane_decoder_is_a_bf16_copy_with_fp32_rope():
    eng = engine()
    dec = codec_dtype.lane_decoder(eng.decoder, "bfloat16")
    assert dec is not eng.decoder and next(dec.parameters()).dtype == torch.bfloat16
    assert next(eng.decoder.parameters()).dtype == torch.float32  # the engine's own is untouched
    assert dec.pre_transformer.inv_freq.dtype == torch.float32
    assert torch.equal(dec.pre_transformer.inv_freq, eng.decoder.pre_transformer.inv_freq)
    assert codec_dtype.lane_decoder(eng.decoder, "model") is eng.decoder


@pytest.mark.parametrize("slots", [1, 3])
def test_bf16_lanes_keep_the_codes_and_decode_as_the_bf16_decoder(slots):
    """Greedy codes equal the fp32 reference's; the streamed bf16 audio is the bf16 decoder's one-shot decode
    of those codes and the fp32 decode, to bf16's rounding: > 20 dB each on the tiny codec, whose calibrated
    random SnakeBeta blocks amplify any rounding (bf16 chunked against bf16 in one pass differ as much as bf16
    against fp32 there: ~27 and ~23 dB; the real shape's random codec: ~44 dB, the precision a GPU's bf16 codec
    has; docs/PERFORMANCE.md). A broken path (a state or a table in the wrong dtype) is near 0 dB."""
    eng = engine()
    reqs = requests(3, frames=10)
    ref = reference(eng, reqs)
    bf16 = codec_dtype.lane_decoder(eng.decoder, "bfloat16")
    out = EngineRunner(eng, max_slots=slots, max_context=256, codec_dtype="bfloat16").synthesize(reqs)
    for (codes, wav), res in zip(ref, out):
        np.testing.assert_array_equal(res.codes, codes)
        with torch.inference_mode():
            one_shot = bf16(torch.from_numpy(codes).T[None])[0, 0].float().numpy()
        assert res.audio.shape == wav.shape == one_shot.shape and np.abs(wav).std() > 1e-3
        assert snr_db(one_shot, res.audio) > 20, snr_db(one_shot, res.audio)  # streamed vs one pass, both bf16
        assert snr_db(wav, res.audio) > 20, snr_db(wav, res.audio)


def test_the_loader_decides_the_codec_dtype_once(monkeypatch):
    from engines.api import EngineSpec
    from engines.load import settings
    from tests.test_runtime import TINY

    monkeypatch.setattr("engines.device.detect.cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    got = settings(EngineSpec(model=str(TINY / "cv_small"), device="cpu", dtype="float32"))
    assert got["codec_dtype"] == "bfloat16" and "auto" in got["codec_dtype_reason"]
    got = settings(EngineSpec(model=str(TINY / "cv_small"), device="cpu", dtype="float32", codec_dtype="model"))
    assert got["codec_dtype"] == "model"
