"""The one-row decoder layer as one persistent kernel (engines/runtime/layer_kernel.py) against the layer's
torch form: on the CPU through Triton's interpreter (phases launched one by one: the interpreter runs programs
one after another, so a grid barrier cannot run there), and on the GPU as one cooperative launch."""
from __future__ import annotations

import textwrap

import pytest

from tests.test_attention_kernel import (asking_where_it_cannot_run_fails_clearly, gpu_one_row_codes_equal_eager,
                                         interpreted_one_row_codes, run_interpreted)

pytest.importorskip("triton", reason="the test extra installs triton (pip install -e '.[test]')")

CHECK = """
    import dataclasses
    import torch
    from engines.model.config import DecoderStackConfig
    from engines.model import kv_cache
    from engines.model.layers import DecoderStack
    from engines.runtime.decode_step import StackWeights, make_layer
    from engines.runtime.layer_kernel import decoder_layer, new_counter, programs

    def stack(hidden, inter, heads, kv, d, bias, device, dtype):
        names = {f.name for f in dataclasses.fields(DecoderStackConfig)}
        kw = dict(hidden_size=hidden, num_hidden_layers=1, intermediate_size=inter, num_attention_heads=heads,
                  num_key_value_heads=kv, head_dim=d, max_position_embeddings=512, attention_bias=bias)
        st = DecoderStack(DecoderStackConfig(**{k: v for k, v in kw.items() if k in names}))
        g = torch.Generator().manual_seed(hidden + inter)
        for p in st.parameters():
            p.data = (torch.randn(p.shape, generator=g) * (0.5 / p.shape[-1] ** 0.5 if p.dim() > 1 else 0.1) + (
                1.0 if p.dim() == 1 and p.shape[0] in (hidden, d) else 0.0))
        return st.to(device, dtype), StackWeights.of(st.to(device, dtype), 512)

    def compare(hidden, inter, heads, kv, d, bias, device, dtype, tol, positions=(0, 7, 300), split=None, fp8=False):
        # fp8: over an fp8 cache (scales in both forms); the written entries then agree within one e4m3 step
        # (their inputs may differ in the last bit)
        st, w = stack(hidden, inter, heads, kv, d, bias, device, dtype)
        ref_layer = make_layer(heads, kv, d, st.cfg.rms_norm_eps, gemv=True)
        counter = new_counter(torch.device(device))
        for p in positions:
            g = torch.Generator(device=device).manual_seed(p)
            kc = torch.randn(3, kv, 512, d, generator=g, device=device).to(dtype)
            vc = torch.randn(3, kv, 512, d, generator=g, device=device).to(dtype)
            ks = vs = ks2 = vs2 = None
            if fp8:
                (kc, ks), (vc, vs) = kv_cache.quantize(kc), kv_cache.quantize(vc)
                ks2, vs2, ks0 = ks.clone(), vs.clone(), ks.clone()
            kc2, vc2 = kc.clone(), vc.clone()
            x = torch.randn(1, 1, hidden, generator=g, device=device).to(dtype)
            pos = torch.tensor([[p]], device=device)
            cut = lambda t: None if t is None else t[1:2]
            ref = ref_layer(x, w.layers[0], kc[1:2], vc[1:2], pos, w.cos, w.sin, cut(ks), cut(vs))
            got = decoder_layer(x, w.layers[0], kc2[1:2], vc2[1:2], pos, w.cos, w.sin, heads, kv,
                                st.cfg.rms_norm_eps, counter, split=split, ks=cut(ks2), vs=cut(vs2))
            assert got.shape == ref.shape and got.dtype == ref.dtype
            err = (got.float() - ref.float()).abs().max().item()
            assert err <= tol * max(1.0, ref.float().abs().max().item()), (hidden, p, err)
            for a, b, sa, sb in ((kc, kc2, ks, ks2), (vc, vc2, vs, vs2)):  # the new entry at its slot, nothing else
                if fp8:
                    a, b = kv_cache.dequantize(a, sa, torch.float32), kv_cache.dequantize(b, sb, torch.float32)
                    assert ((a - b).abs() <= sa[..., None] * 448 * 2 ** -3 + tol * 4).all(), (hidden, p)
                else:
                    assert (a.float() - b.float()).abs().max().item() <= tol * 4, (hidden, p)
            if fp8:  # the new key went in with its scale
                assert not torch.equal(ks[1, :, p], ks0[1, :, p]) and not torch.equal(ks2[1, :, p], ks0[1, :, p])
        return counter
"""


def test_layer_equals_the_torch_form():
    """Widths that are and are not multiples of the programs' shares, with and without biases, the first,
    a middle and a late cache slot, more key/value heads than programs; the layer's output and the cache it
    writes (fp32, phases one by one)."""
    out = run_interpreted(CHECK + """
    compare(64, 96, 4, 2, 16, False, "cpu", torch.float32, 1e-5)
    compare(48, 200, 4, 1, 16, True, "cpu", torch.float32, 1e-5)
    compare(40, 72, 2, 2, 32, False, "cpu", torch.float32, 1e-5, positions=(0, 511))
    assert programs(torch.device("cpu")) < 6  # more key/value heads than programs: they take turns
    compare(32, 64, 6, 6, 16, False, "cpu", torch.float32, 1e-5, positions=(5,))
    print("ok")
    """)
    assert out.split() == ["ok"]


def test_layer_with_the_fp8_cache_equals_the_torch_form_with_it():
    """The attention phase quantizes the new key/value where it writes them and reads the float8 cache with its
    scales: the torch form's output over the same fp8 cache (fp32, phases one by one)."""
    out = run_interpreted(CHECK + """
    compare(64, 96, 4, 2, 16, False, "cpu", torch.float32, 1e-5, fp8=True)
    compare(32, 64, 6, 6, 16, True, "cpu", torch.float32, 1e-5, positions=(0, 511), fp8=True)
    print("ok")
    """)
    assert out.split() == ["ok"]


def test_runner_with_the_layer_kernel_gives_the_reference_codes():
    """The fast step with every one-row layer pass through the kernel (one slot: the whole decode; two:
    one-row and two-row steps mixed): the reference loop's greedy codes (fp32)."""
    out = interpreted_one_row_codes("layer_kernel")
    assert out.split() == ["same", "2"]


def test_the_kernel_takes_the_narrow_stacks_and_is_on_where_triton_runs():
    """Unset, the layer kernel runs where the Triton kernels can (here: the interpreter); it takes the one-row
    layers of stacks up to LAYER_KERNEL_MAX_HIDDEN wide and leaves wider ones (the 1.7B talker) compiled."""
    out = run_interpreted("""
        import dataclasses
        from engines.model.config import DecoderStackConfig
        from engines.model.layers import DecoderStack
        from engines.runtime import decode_step
        from engines.runtime.layer_kernel import new_counter
        from engines.runtime.runner import EngineRunner
        from tests.test_runtime import engine
        fast = EngineRunner(engine(), max_slots=1, max_context=256).model.fast
        assert fast.t_layer.__name__ == "layer" and fast.p_layer.__name__ == "layer"  # the one-row dispatch
        names = {f.name for f in dataclasses.fields(DecoderStackConfig)}
        def stack(hidden):
            kw = dict(hidden_size=hidden, num_hidden_layers=1, intermediate_size=8, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16)
            return DecoderStack(DecoderStackConfig(**{k: v for k, v in kw.items() if k in names}))
        other = lambda *a: None
        counter = new_counter(__import__("torch").device("cpu"))
        wide = decode_step.LAYER_KERNEL_MAX_HIDDEN + 16
        assert decode_step._one_row_kernel(stack(wide), other, counter) is other
        assert decode_step._one_row_kernel(stack(64), other, counter) is not other
        assert decode_step._one_row_kernel(stack(64), other, None) is other
        print("ok")
    """)
    assert out.split() == ["ok"]


def test_asking_for_the_layer_kernel_where_it_cannot_run_is_a_clear_error():
    asking_where_it_cannot_run_fails_clearly("layer_kernel")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fp8", [False, True])
def test_gpu_layer_equals_the_torch_form_at_real_shapes(dtype, fp8):
    """Compiled for the GPU, one launch with its grid barriers: the 0.6B talker/predictor layer and the 1.7B
    talker layer, over a model-dtype or an fp8 cache; the barrier counter grew by four arrivals of every
    program per launch."""
    import torch

    ns: dict = {}
    exec(textwrap.dedent(CHECK), ns)
    dt = getattr(torch, dtype)
    tol = 1e-4 if dt == torch.float32 else 3e-2
    for hidden, inter in ((1024, 3072), (2048, 6144)):
        counter = ns["compare"](hidden, inter, 16, 8, 128, False, "cuda", dt, tol, split=False, fp8=fp8)
        assert counter.item() == 3 * 4 * ns["programs"](torch.device("cuda"))


@pytest.mark.gpu
def test_gpu_one_launch_equals_the_phases_launched_apart():
    """The barrier version computes exactly what the phases launched one by one compute (bf16, bitwise), over
    many launches in a row (a barrier that let a program run ahead would show as a difference or a hang)."""
    import torch

    ns: dict = {}
    exec(textwrap.dedent(CHECK), ns)
    st, w = ns["stack"](1024, 3072, 16, 8, 128, False, "cuda", torch.bfloat16)
    counter = ns["new_counter"](torch.device("cuda"))
    kc = torch.randn(1, 8, 64, 128, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    x = torch.randn(1, 1, 1024, device="cuda", dtype=torch.bfloat16)
    for p in range(40):
        pos = torch.tensor([[p]], device="cuda")
        k2, v2 = kc.clone(), vc.clone()
        one = ns["decoder_layer"](x, w.layers[0], kc, vc, pos, w.cos, w.sin, 16, 8, 1e-6, counter, split=False)
        apart = ns["decoder_layer"](x, w.layers[0], k2, v2, pos, w.cos, w.sin, 16, 8, 1e-6, counter, split=True)
        assert torch.equal(one, apart) and torch.equal(kc, k2) and torch.equal(vc, v2), p
        x = one
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_gpu_runner_with_the_layer_kernel_gives_the_eager_codes():
    """On CUDA in fp32, compiled regions and captured graphs with the layer kernel in every one-row layer
    pass (one slot, then two): the reference loop's greedy codes."""
    gpu_one_row_codes_equal_eager("layer_kernel")
