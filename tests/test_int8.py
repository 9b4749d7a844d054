"""int8 decoder-layer weights on the CPU (runtime.linear: int8): the fused batched step against its own slow
reference (the reference modules with int8 linears), batch invariance, and the setting's errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engines.engine import TTSEngine
from engines.runtime import int8
from engines.runtime.linears import pack_modules
from engines.runtime.runner import EngineRunner
from tests.test_runtime import TINY, engine, requests

pytestmark = pytest.mark.skipif(int8.unavailable_reason("cpu") is not None,
                                reason=f"int8 linears unavailable: {int8.unavailable_reason('cpu')}")


def int8_reference_engine():
    eng = TTSEngine.load(TINY / "cv_small", device="cpu", dtype="float32")
    n = pack_modules(eng.talker.model, "int8") + pack_modules(eng.talker.code_predictor.model, "int8")
    assert n > 0
    return eng


def test_int8_rows_do_not_depend_on_their_batch():
    """Each row's activations are quantized on their own: a row's product is the same alone or among others."""
    torch.manual_seed(0)
    w = int8.Int8Weight(torch.randn(96, 64) * 0.05, torch.randn(96))
    x = torch.randn(9, 64) * torch.rand(9, 1) * 10
    together = w(x)
    assert all(torch.equal(w(x[i:i + 1])[0], together[i]) for i in range(9))
    assert torch.equal(w(x[3:7]), together[3:7])


def test_int8_product_is_close_to_the_float_product():
    torch.manual_seed(1)
    wf = torch.randn(128, 256) * 0.02
    x = torch.randn(5, 3, 256)
    got, want = int8.Int8Weight(wf)(x), torch.nn.functional.linear(x, wf)
    assert got.shape == want.shape
    assert float((got - want).norm() / want.norm()) < 0.05  # 7-bit (8 with VNNI) activations, 8-bit weights: ~1-2%


@pytest.mark.skipif(not int8.has_vnni(), reason="16-bit activations need a CPU with VNNI (AVX-512 VNNI, AVX-VNNI)")
def test_int8_with_16_bit_activations_leaves_only_the_weights_rounding():
    """act_bits 16: the product equals x @ (the int8 weights dequantized) to ~1e-4, where 8-bit activations are off
    by ~1e-2; rows still do not depend on their batch."""
    torch.manual_seed(2)
    wf = torch.randn(256, 512) * 0.02
    x = torch.randn(7, 512)
    w16, w8 = int8.Int8Weight(wf, act_bits=16), int8.Int8Weight(wf)
    scale = wf.abs().amax(1) / 127
    exact = x @ (torch.round(wf / scale[:, None]) * scale[:, None]).T
    err16 = float((w16(x) - exact).norm() / exact.norm())
    err8 = float((w8(x) - exact).norm() / exact.norm())
    assert err16 < 5e-4 and err8 > 10 * err16
    assert all(torch.equal(w16(x[i:i + 1])[0], w16(x)[i]) for i in range(7))


@pytest.mark.parametrize("slots", [1, 3])
def test_int8_step_matches_its_reference(slots):
    """Greedy codes of the batched int8 step equal the eager reference loop with int8 linears (exact: the same
    products, fused or not, at any batch)."""
    reqs = requests(3, frames=10)
    ref = int8_reference_engine()
    want = [g.codes.numpy() for g, _ in ref.generate_codes(reqs)]
    runner = EngineRunner(engine(), max_slots=slots, max_context=256, linear="int8")
    got = [r.codes for r in runner.synthesize(reqs)]
    for w, g in zip(want, got):
        np.testing.assert_array_equal(w, g)


def test_int8_teacher_forced_agreement_guard():
    """int8 picks the fp32 code for >= 90% of decisions when both see the same history (as the bf16 guard)."""
    from benchmarks.bf16_agreement import teacher_forced_picks

    f32, q8 = engine(), int8_reference_engine()
    [req] = requests(1, frames=20)
    [(gen, _)] = f32.generate_codes([req])
    a = teacher_forced_picks(f32, req, gen.codes)
    assert float((a == teacher_forced_picks(q8, req, gen.codes)).float().mean()) >= 0.9


def test_linear_setting_errors_say_what_to_do():
    with pytest.raises(ValueError, match="runtime.linear.*one of auto, model, fp16, int8"):
        EngineRunner(engine(), max_slots=1, max_context=64, linear="int4")
    assert int8.unavailable_reason("cuda") is not None and "CPU only" in int8.unavailable_reason("cuda")
