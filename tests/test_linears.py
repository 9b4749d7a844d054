"""The CPU's packed decoder-layer weights (runtime.linear, engines.runtime.linears): fp16 weights with fp32
compute against fp32 math, batch invariance, the fused step against its own slow reference, and what auto takes."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engines.runtime import linears
from engines.runtime.runner import EngineRunner
from engines.engine import TTSEngine
from tests.test_runtime import TINY, engine, requests

FP16 = linears.unavailable_reason("fp16", "cpu")
pytestmark = pytest.mark.skipif(FP16 is not None, reason=f"fp16 linears unavailable: {FP16}")


def packed_reference(fmt: str):
    eng = TTSEngine.load(TINY / "cv_small", device="cpu", dtype="float32")  # its own (engine() is shared)
    assert linears.pack_modules(eng.talker.model, fmt) + linears.pack_modules(eng.talker.code_predictor.model, fmt) > 0
    assert linears.pack_heads(eng.talker, fmt) == (16 if fmt == "fp16" else 0)
    return eng


def test_fp16_product_is_fp32_math_on_fp16_rounded_weights():
    """fp16 weights, fp32 activations and sums: the product of the fp16-rounded weight in fp32 (to fp32's sums'
    order), not a product with rounded activations (bf16 is off by ~1e-3 here)."""
    torch.manual_seed(0)
    w, b = torch.randn(192, 320) * 0.02, torch.randn(192)
    x = torch.randn(2, 5, 320)
    got = linears.Fp16Weight(w, b)(x)
    want = torch.nn.functional.linear(x, w.half().float(), b)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5
    bf16 = torch.nn.functional.linear(x.bfloat16(), w.bfloat16(), b.bfloat16()).float()
    assert float((bf16 - want).abs().max() / want.abs().max()) > 1e-3  # (the check above can tell them apart)


@pytest.mark.parametrize("threads", [1, 2])
def test_fp16_rows_do_not_depend_on_their_batch(threads):
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(1)
        w = linears.Fp16Weight(torch.randn(1024, 512) * 0.02)
        x = torch.randn(37, 512)
        together = w(x)
        assert all(torch.equal(w(x[i:i + 1])[0], together[i]) for i in (0, 5, 36))
        assert torch.equal(w(x[3:11]), together[3:11])
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("slots", [1, 3])
def test_fp16_step_matches_its_reference(slots):
    """Greedy codes of the batched fp16 step equal the eager reference loop with fp16 linears (exact: the same
    products, fused or not, at any batch)."""
    reqs = requests(3, frames=10)
    want = [g.codes.numpy() for g, _ in packed_reference("fp16").generate_codes(reqs)]
    runner = EngineRunner(engine(), max_slots=slots, max_context=256, linear="fp16")
    got = [r.codes for r in runner.synthesize(reqs)]
    for w, g in zip(want, got):
        np.testing.assert_array_equal(w, g)


def test_fp16_agrees_with_fp32_at_least_as_often_as_bf16():
    """The adoption rule of runtime.linear auto, on the tiny model: teacher-forced greedy picks of the fp16 engine
    agree with fp32's at least as often as the bf16 engine's do."""
    from benchmarks.bf16_agreement import teacher_forced_picks

    f32, f16w, b16 = engine(), packed_reference("fp16"), engine(dtype="bfloat16")
    reqs = requests(2, frames=16)
    rates = {}
    for name, eng in (("fp16", f16w), ("bf16", b16)):
        same = []
        for req, (gen, _) in zip(reqs, f32.generate_codes(reqs)):
            same.append(teacher_forced_picks(f32, req, gen.codes) == teacher_forced_picks(eng, req, gen.codes))
        rates[name] = float(torch.cat(same).float().mean())
    assert rates["fp16"] >= rates["bf16"], rates


def test_auto_takes_fp16_for_fp32_weights_on_the_cpu_only():
    assert linears.linear_setting("auto", "cpu", torch.float32)[0] == "fp16"
    assert linears.linear_setting("auto", "cpu", torch.bfloat16)[0] == "model"
    assert linears.linear_setting("auto", "cuda", torch.float32)[0] == "model"
    assert linears.linear_setting("model", "cpu", torch.float32) == ("model", "configured")
    with pytest.raises(ValueError, match="runtime.linear: fp16 cannot run here.*CPU only.*set it to auto or model"):
        linears.linear_setting("fp16", "cuda", torch.float32)


def test_auto_keeps_the_model_dtype_where_the_fp16_kernel_does_not_run(monkeypatch):
    """A CPU or torch build without fbgemm's fp16 matmul (Arm, no AVX2): auto falls back to the model's dtype and
    says why; asking for fp16 there is an error that says what to set."""
    monkeypatch.setattr(linears, "_fp16_reason", lambda: "no fbgemm here")
    linears._probe.cache_clear()
    try:
        fmt, why = linears.linear_setting("auto", "cpu", torch.float32)
        assert fmt == "model" and "no fbgemm here" in why
        with pytest.raises(ValueError, match="no fbgemm here"):
            linears.linear_setting("fp16", "cpu", torch.float32)
    finally:
        linears._probe.cache_clear()


def test_the_loader_decides_auto_once():
    """engines.load.settings (the loader and `info`) resolves runtime.linear auto; the runner runs what it was given."""
    from engines.api import EngineSpec
    from engines.load import settings

    got = settings(EngineSpec(model=str(TINY / "cv_small"), device="cpu", dtype="float32"))
    assert got["linear"] == "fp16" and "auto" in got["linear_reason"]
    assert settings(EngineSpec(model=str(TINY / "cv_small"), device="cpu", dtype="float32", linear="model"))["linear"] \
        == "model"
