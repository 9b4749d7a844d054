"""The fp8 key/value cache of the talker (engines/model/kv_cache.py, `runtime.kv_cache: fp8`): its quantization,
the Triton kernels' fp8 path against the torch form with the same cache (through Triton's interpreter on the CPU,
compiled on the GPU), the fp8 path against the model-dtype path (lossy: a loose, documented tolerance), the
scales moving with the rows, the runner's greedy codes against the reference loop's with the same cache, the
setting's errors and the slot memory."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engines.model import kv_cache
from engines.model.kv_cache import FP8_EPS, FP8_MAX, KVCache
from tests.test_attention_kernel import run_interpreted
from tests.test_runtime import TINY, engine, requests

pytestmark = pytest.mark.skipif(not kv_cache.fp8_available(torch.device("cpu")),
                                reason="this torch has no float8 CPU ops")

STEP = 2.0 ** -3  # e4m3 keeps three mantissa bits: neighbours differ by at most 2^-3 of the larger one


def test_scales_of_zero_tiny_and_large_vectors():
    """A zero vector gets the smallest scale and stays zero; tiny, huge (bf16's range) and mixed vectors get
    amax / 448, land inside e4m3's range with their largest element on 448, and come back within half a step:
    no NaN or inf anywhere."""
    x = torch.zeros(5, 128)
    x[1] = torch.linspace(-1e-35, 1e-35, 128)
    x[2] = torch.linspace(1e37, 3e38, 128) * (torch.arange(128) % 2 * 2 - 1)  # near fp32's (and bf16's) largest
    x[3] = torch.randn(128) * 1e4
    x[4, :64] = torch.randn(64)  # half zeros
    q, s = kv_cache.quantize(x)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and s.shape == (5,)
    assert torch.isfinite(q.float()).all() and torch.isfinite(s).all() and (s > 0).all()
    assert s[0] == torch.tensor(FP8_EPS) and torch.equal(q[0].float(), torch.zeros(128))
    amax = x.abs().amax(-1)
    assert torch.allclose(s[1:], amax[1:] / FP8_MAX, rtol=1e-6)
    assert (q[1:].float().abs().amax(-1) == FP8_MAX).all()
    back = kv_cache.dequantize(q, s, torch.float32)
    assert torch.isfinite(back).all()
    # half a step of each element, or half the smallest subnormal step (2^-9 of the scale) near zero
    assert ((back - x).abs() <= torch.maximum(x.abs() * STEP / 2, s[:, None] * 2.0 ** -10) * 1.0001).all()
    assert kv_cache.quantize(x.to(torch.bfloat16))[1].isfinite().all()


def test_the_kernels_round_to_e4m3_like_torch():
    """Every e4m3 value, every midpoint between neighbours (ties: to the even one), just above and below
    them, subnormals and signed zeros, through the kernels' quantizer (`_store_fp8`, a 448 in each vector so
    the scale is 1): the bytes torch's quantize gives. (The interpreter's own float8 conversion gets ties and
    mantissa carries wrong; the kernel rounds first.)"""
    out = run_interpreted("""
        import torch, triton, triton.language as tl
        from engines.model import kv_cache
        from engines.runtime.attention import _store_fp8

        @triton.jit
        def quant(x, q, s, D: tl.constexpr):
            d = tl.arange(0, D)
            i = tl.program_id(0)
            _store_fp8(q + i * D + d, s + i, tl.load(x + i * D + d), True)

        every = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
        every = every[torch.isfinite(every)].unique()
        mid = (every[1:] + every[:-1]) / 2
        vals = torch.cat([every, mid, mid * (1 + 1e-6), mid * (1 - 1e-6), torch.tensor([-0.0, 1e-40, -1e-40])])
        vals = torch.nn.functional.pad(vals, (0, -vals.numel() % 15))
        x = torch.cat([torch.full((vals.numel() // 15, 1), 448.0), vals.view(-1, 15)], dim=1)  # [N, 16]
        q = torch.zeros(x.shape, dtype=torch.float8_e4m3fn)
        s = torch.zeros(x.shape[0])
        quant[(x.shape[0],)](x, q, s, D=16)
        tq, ts = kv_cache.quantize(x)
        assert torch.equal(ts, s) and (s == 1).all()
        bad = q.view(torch.uint8) != tq.view(torch.uint8)
        assert not bad.any(), (x[bad][:8], q[bad][:8].float(), tq[bad][:8].float())
        print("ok", x.numel())
    """)
    assert out.split()[0] == "ok"


KERNEL_VS_TORCH = """
    import torch
    from engines.model import kv_cache
    from engines.model.layers import rope_cos_sin
    from engines.runtime.attention import available, decode_attention, reference_attention
    assert available(torch.device("cpu"))
    torch.manual_seed(0)
    H, KV, D, S = 4, 2, 16, 40
    cos, sin = (t[0].contiguous() for t in rope_cos_sin(torch.arange(64)[None], D, 10000.0, torch.float32))
    qn, kn = torch.rand(D) + 0.5, torch.rand(D) + 0.5

    def fp8_cache(rows):
        q, s = kv_cache.quantize(torch.randn(2, rows, KV, S, D) * torch.rand(2, rows, KV, S, 1) * 4)
        return q[0], q[1], s[0], s[1]  # k, v [rows, KV, S, D], their scales [rows, KV, S]

    def same_bytes(a, b):
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
"""


def test_kernel_with_the_fp8_cache_equals_the_torch_form_with_it():
    """One or two new tokens per row at the first, a middle and the last slot, row slices of a larger cache:
    the kernel (scales folded into its scores and weights) gives the torch form's output (which dequantizes
    the cache) within 1e-5 (fp32), and writes the same float8 bytes; the scales of the new values are equal,
    those of the new keys within 1e-6 (the kernel's and torch's normed, rotated keys differ in the last
    bit)."""
    out = run_interpreted(KERNEL_VS_TORCH + """
    for T in (1, 2):
        qkv = torch.randn(3, T, (H + 2 * KV) * D)
        pos = torch.tensor([[0, 1], [17, 18], [S - T, S - 1]])[:, :T].contiguous()
        k0, v0, ks0, vs0 = fp8_cache(5)
        (k1, v1, ks1, vs1), (k2, v2, ks2, vs2) = [[t.clone() for t in (k0, v0, ks0, vs0)] for _ in range(2)]
        ref = reference_attention(qkv, qn, kn, cos, sin, pos, k1[1:4], v1[1:4], H, KV, 1e-6, ks1[1:4], vs1[1:4])
        got = decode_attention(qkv, qn, kn, cos, sin, pos, k2[1:4], v2[1:4], H, KV, 1e-6, ks2[1:4], vs2[1:4])
        assert got.shape == ref.shape == (3, T, H * D)
        assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5), (got - ref).abs().max()
        assert same_bytes(k1, k2) and same_bytes(v1, v2) and torch.equal(vs1, vs2)
        assert torch.allclose(ks1, ks2, rtol=1e-6, atol=0)
        assert not same_bytes(k2, k0) and not torch.equal(vs2, vs0)  # the new keys and values were written
        # the model-dtype kernel over the dequantized cache: a different answer (the new tokens unquantized)
        kf, vf = (kv_cache.dequantize(a, s, torch.float32) for a, s in ((k0, ks0), (v0, vs0)))
        plain = decode_attention(qkv, qn, kn, cos, sin, pos, kf[1:4].clone(), vf[1:4].clone(), H, KV, 1e-6)
        assert not torch.allclose(plain, got, atol=1e-5, rtol=1e-5)
        print("ok", T)
    """)
    assert out.split() == ["ok", "1", "ok", "2"]


def test_prefill_and_decode_write_the_same_quantization():
    """The same five tokens written by the prefill's torch form (one five-token chunk) and by the decode
    kernel (one or two tokens a call) at the same positions: each path's bytes and scales are quantize() of
    the very keys/values it would store in a model-dtype cache (the same function, bitwise), the values'
    bytes and scales are equal across the paths, the keys' within one e4m3 step (their fp32 inputs differ in
    the last bit)."""
    out = run_interpreted(KERNEL_VS_TORCH + """
    qkv = torch.randn(2, 5, (H + 2 * KV) * D)
    pos = torch.tensor([[3, 4, 5, 6, 7], [30, 31, 32, 33, 34]])
    caches = {}
    for path in ("prefill", "decode"):
        for fp8 in (True, False):
            k, v, ks, vs = fp8_cache(2)
            if not fp8:
                k, v, ks, vs = k.float(), v.float(), None, None
            if path == "prefill":
                reference_attention(qkv, qn, kn, cos, sin, pos, k, v, H, KV, 1e-6, ks, vs)
            else:
                for a, b in ((0, 1), (1, 3), (3, 5)):
                    decode_attention(qkv[:, a:b].contiguous(), qn, kn, cos, sin, pos[:, a:b].contiguous(), k, v,
                                     H, KV, 1e-6, ks, vs)
            rows = torch.arange(2)[:, None]
            caches[path, fp8] = [t[rows, :, pos] if t is not None else None for t in (k, v, ks, vs)]  # [2, 5, KV, ...]
    for path in ("prefill", "decode"):
        k, v, ks, vs = caches[path, True]
        kf, vf, _, _ = caches[path, False]
        for q, s, x in ((k, ks, kf), (v, vs, vf)):
            tq, ts = kv_cache.quantize(x)
            assert same_bytes(q, tq) and torch.equal(s, ts), path
    (kp, vp, ksp, vsp), (kd, vd, ksd, vsd) = caches["prefill", True], caches["decode", True]
    assert same_bytes(vp, vd) and torch.equal(vsp, vsd)
    assert torch.allclose(ksp, ksd, rtol=1e-6, atol=0)
    deq = lambda q, s: kv_cache.dequantize(q, s, torch.float32)
    assert ((deq(kp, ksp) - deq(kd, ksd)).abs() <= ksp[..., None] * 448 * 2 ** -3 + 1e-12).all()
    print("ok")
    """)
    assert out.split() == ["ok"]


def test_fp8_attention_is_close_to_the_model_dtype_attention():
    """Lossy by design, so a loose tolerance: the real head shapes (16 query, 8 key/value heads of 128) over
    300 positions of random keys (each vector at its own magnitude) and values, one and two new tokens. With
    the cache in fp8 the output stays within 12% of the fp32 cache's in norm (observed ~6%: each cached element
    within 2^-4 of itself), while reading the float8 bytes without their scales is off by orders of magnitude."""
    from engines.model.layers import rope_cos_sin
    from engines.runtime.attention import reference_attention

    g = torch.Generator().manual_seed(0)
    H, KV, D, S, B = 16, 8, 128, 300, 4
    cos, sin = (t[0].contiguous() for t in rope_cos_sin(torch.arange(S)[None], D, 1e6, torch.float32))
    qn, kn = torch.rand(D, generator=g) + 0.5, torch.rand(D, generator=g) + 0.5
    for t in (1, 2):
        qkv = torch.randn(B, t, (H + 2 * KV) * D, generator=g)
        pos = torch.tensor([[S - 2, S - 1]] * B)[:, :t].contiguous()
        k = torch.randn(B, KV, S, D, generator=g) * torch.rand(B, KV, S, 1, generator=g) * 4
        v = torch.randn(B, KV, S, D, generator=g)
        ref = reference_attention(qkv, qn, kn, cos, sin, pos, k.clone(), v.clone(), H, KV, 1e-6)
        (kq, ks), (vq, vs) = kv_cache.quantize(k), kv_cache.quantize(v)
        got = reference_attention(qkv, qn, kn, cos, sin, pos, kq, vq, H, KV, 1e-6, ks, vs)
        assert ((got - ref).norm() / ref.norm()) < 0.12
        unscaled = reference_attention(qkv, qn, kn, cos, sin, pos, kq.float(), vq.float(), H, KV, 1e-6)
        assert ((unscaled - ref).norm() / ref.norm()) > 10


def test_copy_row_moves_the_scales_and_clears_the_rest():
    """copy_row between fp8 caches (another cache, or the same one) copies the float8 bytes and the scales of
    the first `length` positions of every layer; clear_rest zeroes both after them; rows() views carry the
    scales; an fp8 and a model-dtype cache do not mix."""
    from engines.model.config import DecoderStackConfig

    cfg = DecoderStackConfig(num_hidden_layers=3, num_key_value_heads=2, head_dim=16)
    src = KVCache.allocate(cfg, 4, 12, "cpu", torch.float32, fp8=True)
    assert src.fp8 and src.all_k.dtype == torch.float8_e4m3fn and src.all_k_scale.shape == (3, 4, 2, 12)
    for t in (src.all_k, src.all_v):
        q, _ = kv_cache.quantize(torch.randn(t.shape))
        t.copy_(q)
    for t in (src.all_k_scale, src.all_v_scale):
        t.copy_(torch.rand(t.shape) + 0.1)
    dst = KVCache.allocate(cfg, 4, 12, "cpu", torch.float32, fp8=True)
    dst.all_k_scale.fill_(7.0)
    dst.copy_row(2, src, 1, 5, clear_rest=True)
    for a, b in ((dst.all_k, src.all_k), (dst.all_v, src.all_v), (dst.all_k_scale, src.all_k_scale),
                 (dst.all_v_scale, src.all_v_scale)):
        a, b = a.view(torch.uint8) if a.dtype != torch.float32 else a, b.view(torch.uint8) if b.dtype != torch.float32 else b
        assert torch.equal(a[:, 2, :, :5], b[:, 1, :, :5])
        assert not a[:, 2, :, 5:].any()
    assert (dst.all_k_scale[:, 0] == 7.0).all()  # other rows untouched
    src.copy_row(0, src, 1, 12)  # within one cache (a retired slot's hole filled)
    assert torch.equal(src.all_v_scale[:, 0], src.all_v_scale[:, 1])
    view = src.rows(1, 3, 6)
    k, v, ks, vs = view.layer(2)
    assert k.shape == (2, 2, 6, 16) and ks.shape == vs.shape == (2, 2, 6) and ks.data_ptr() == src.k_scale[2][1].data_ptr()
    plain = KVCache.allocate(cfg, 4, 12, "cpu", torch.float32)
    assert not plain.fp8 and plain.layer(0)[2:] == (None, None)
    with pytest.raises(AssertionError):
        plain.copy_row(0, src, 1, 3)


def test_runner_greedy_codes_with_fp8_equal_the_reference_loop_with_fp8():
    """The runner (the torch form on the CPU; slots joining and leaving, per-layer and per-pass regions) with
    the fp8 cache gives the eager reference loop's greedy codes with the same cache; and the fp8 cache changes
    some codes against the fp32 cache on this checkpoint (so the comparison can tell the two apart)."""
    from engines.runtime.runner import EngineRunner

    eng = engine()
    reqs = requests(3, frames=8)
    ref = [g.codes.numpy() for g, _ in eng.generate_codes(reqs, fp8=True)]
    plain = [g.codes.numpy() for g, _ in eng.generate_codes(reqs)]
    assert any(a.shape != b.shape or not np.array_equal(a, b) for a, b in zip(ref, plain))
    for slots, fuse in ((2, "layer"), (3, "pass")):
        runner = EngineRunner(eng, max_slots=slots, max_context=256, kv_cache="fp8", fuse=fuse)
        assert runner.model.fp8 and runner.model.cache.all_k.dtype == torch.float8_e4m3fn
        assert runner.model.fast.pcache.all_k.dtype == torch.float32  # the predictor's cache keeps the model's
        out = runner.synthesize(reqs)
        for o, r in zip(out, ref):
            assert np.array_equal(o.codes, r)


def test_runner_with_the_kernels_and_fp8_gives_the_reference_codes():
    """Through the interpreter: the decode kernel in every batched layer and the one-row layer kernel (one
    slot: the whole decode one row; two: both mixed) with the fp8 cache: the reference loop's codes with it."""
    out = run_interpreted("""
        import numpy as np
        from tests.test_runtime import TINY, engine, requests
        from engines.runtime.runner import EngineRunner
        eng = engine()
        reqs = requests(2, frames=5)
        ref = [g.codes.numpy() for g, _ in eng.generate_codes(reqs, fp8=True)]
        for slots in (1, 2):
            runner = EngineRunner(eng, max_slots=slots, max_context=256, kv_cache="fp8", attn_kernel=True,
                                  layer_kernel=True, sample_kernel=False)
            out = runner.synthesize(reqs)
            assert all(np.array_equal(o.codes, r) for o, r in zip(out, ref)), [(o.codes, r) for o, r in zip(out, ref)]
        print("same", len(out))
    """)
    assert out.split() == ["same", "2"]


def test_the_setting_auto_is_the_model_dtype_and_fp8_where_it_cannot_run_is_a_clear_error(monkeypatch):
    from engines.runtime import model_runner
    from engines.runtime.runner import EngineRunner

    cpu = torch.device("cpu")
    assert not model_runner.kv_cache_choice("auto", cpu) and not model_runner.kv_cache_choice("model", cpu)
    assert model_runner.kv_cache_choice("fp8", cpu)
    runner = EngineRunner(engine(), max_slots=1, max_context=64)
    assert not runner.model.fp8 and runner.model.cache.all_k.dtype == torch.float32
    with pytest.raises(ValueError, match="runtime.kv_cache: 'fp16' is not one of auto, model, fp8"):
        model_runner.kv_cache_choice("fp16", cpu)
    for device in ("meta",) + (() if torch.cuda.is_available() else ("cuda",)):
        with pytest.raises(ValueError, match="runtime.kv_cache: fp8 cannot run on"):
            model_runner.kv_cache_choice("fp8", torch.device(device))
    monkeypatch.setattr(kv_cache, "fp8_available", lambda device: False)  # a torch without float8 CPU ops
    with pytest.raises(ValueError, match=r"runtime.kv_cache: fp8 cannot run on cpu .*set it to auto or model"):
        EngineRunner(engine(), max_slots=1, max_context=64, kv_cache="fp8")


def test_the_config_key_takes_the_three_kinds(tmp_path):
    from appliance.config import ConfigError, resolve

    good = tmp_path / "good.yaml"
    good.write_text("runtime:\n  kv_cache: fp8\n")
    assert resolve(str(good), environ={}).runtime.kv_cache == "fp8"
    bad = tmp_path / "bad.yaml"
    bad.write_text("runtime:\n  kv_cache: int4\n")
    with pytest.raises(ConfigError, match="kv_cache"):
        resolve(str(bad), environ={})


def test_fp8_about_halves_the_slot_memory_and_more_slots_fit(monkeypatch):
    """At the 0.6B talker's shapes a position of the cache takes 28 x 2 x 8 x (128 + 4) bytes in fp8 against
    28 x 2 x 8 x 128 x 2 in bf16; on a device with 20 GiB free (nothing capped) about twice the slots fit."""
    from benchmarks.dummy_engine import dummy_config
    from engines.model.config import CodecConfig, CodecDecoderConfig
    from engines.model.tokenizer import TextTokenizer
    from engines.runtime import memory

    model = dummy_config("0.6b", TextTokenizer.from_dir(TINY / "cv_small"))
    codec = CodecConfig(decoder=CodecDecoderConfig(), encoder={})
    bf16 = torch.bfloat16
    assert memory.kv_position_bytes(model, bf16, "fp8") == 28 * 2 * 8 * 132
    assert memory.kv_position_bytes(model, bf16, "auto") == memory.kv_position_bytes(model, bf16, "model") == 28 * 2 * 8 * 256
    per = {kind: memory.per_slot_bytes(model, codec, bf16, 2048, kv_cache=kind) for kind in ("model", "fp8")}
    assert 0.5 < per["fp8"] / per["model"] < 0.56
    monkeypatch.setattr(memory, "device_free_bytes", lambda device: 20 * 2**30)
    plans = {kind: memory.plan_slots(model, codec, "cuda", bf16, 2048, cap=10**6, kv_cache=kind) for kind in per}
    assert 1.8 < plans["fp8"].slots / plans["model"].slots < 2.2, plans  # the side cache shrinks too


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_fp8_kernel_equals_the_torch_fp8_form_at_real_shapes(dtype):
    """Compiled for the GPU: the 0.6B talker's heads (16 query, 8 key/value, 128 wide), 64 rows at scattered
    positions of a 512-slot fp8 cache, one and two new tokens: the kernel against the torch form over the same
    fp8 cache (fp32: 1e-4; bf16: the model-dtype test's bounds); the new values' bytes and scales equal, the new
    keys within one e4m3 step (their bf16 inputs may differ in the last bit)."""
    from engines.model.layers import rope_cos_sin
    from engines.runtime.attention import decode_attention, reference_attention

    torch.backends.cuda.matmul.allow_tf32 = False
    dt, dev = getattr(torch, dtype), torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    H, KV, D, S, B = 16, 8, 128, 512, 64
    cos, sin = (t[0].contiguous() for t in rope_cos_sin(torch.arange(S, device=dev)[None], D, 1e6, torch.float32))
    deq = lambda q, s: kv_cache.dequantize(q, s, torch.float32)  # noqa: E731
    for t in (1, 2):
        qkv = torch.randn(B, t, (H + 2 * KV) * D, device=dev, generator=g).to(dt)
        qn = (torch.rand(D, device=dev, generator=g) + 0.5).to(dt)
        kn = (torch.rand(D, device=dev, generator=g) + 0.5).to(dt)
        pos = (torch.randint(0, S - t, (B, 1), device=dev, generator=g) + torch.arange(t, device=dev)).contiguous()
        scale = torch.rand(B + 2, KV, S, 1, device=dev, generator=g) * 4
        (k0, ks0), (v0, vs0) = (kv_cache.quantize((torch.randn(B + 2, KV, S, D, device=dev, generator=g) * scale).to(dt))
                                for _ in range(2))
        (k1, v1, ks1, vs1), (k2, v2, ks2, vs2) = [[x.clone() for x in (k0, v0, ks0, vs0)] for _ in range(2)]
        ref = reference_attention(qkv, qn, kn, cos, sin, pos, k1[1:-1], v1[1:-1], H, KV, 1e-6, ks1[1:-1], vs1[1:-1])
        got = decode_attention(qkv, qn, kn, cos, sin, pos, k2[1:-1], v2[1:-1], H, KV, 1e-6, ks2[1:-1], vs2[1:-1])
        err = (got.float() - ref.float()).abs()
        if dt == torch.float32:
            assert err.max() < 1e-4, err.max()
        else:
            assert err.max() < 0.05 * ref.float().abs().max() and err.mean() < 0.01 * ref.float().abs().mean() + 1e-3
        assert torch.equal(v1.view(torch.uint8), v2.view(torch.uint8)) and torch.equal(vs1, vs2)
        assert torch.allclose(ks1, ks2, rtol=1e-2 if dt == torch.bfloat16 else 1e-6, atol=0)
        assert ((deq(k1, ks1) - deq(k2, ks2)).abs() <= ks1[..., None] * 448 * 2 ** -3 * 1.01).all()


def _gpu_runner_codes(eng, reqs, **kw) -> list:
    from engines.runtime.runner import EngineRunner

    runner = EngineRunner(eng, max_context=256, kv_cache="fp8", **kw)
    assert runner.model.fp8
    return [r.codes for r in runner.synthesize(reqs)]


@pytest.mark.gpu
def test_gpu_runner_with_fp8_through_graphs_gives_the_eager_fp8_codes():
    """On CUDA in fp32, compiled regions, the kernels and captured graphs over the fp8 cache (one slot: the
    one-row layer kernel; two: batched steps too): the eager reference loop's greedy codes with the fp8 cache."""
    torch.backends.cuda.matmul.allow_tf32 = False
    eng = engine(device="cuda")
    reqs = requests(4)
    ref = [g.codes.numpy() for g, _ in eng.generate_codes(reqs, fp8=True)]
    for slots in (1, 2):
        out = _gpu_runner_codes(eng, reqs, max_slots=slots)
        assert all(np.array_equal(o, r) for o, r in zip(out, ref)), slots


@pytest.mark.gpu
def test_gpu_step_at_the_real_shapes_with_fp8_same_codes_through_graphs():
    """The 0.6B shapes (random weights, bf16, fp8 cache), four rows: the step replayed from its captured graphs
    gives the codes of the same compiled step run without graphs (same kernels, nothing captured)."""
    from benchmarks.bench import request
    from benchmarks.dummy_engine import dummy_engine

    eng = dummy_engine("0.6b", "cuda", "bfloat16")
    reqs = [request(24, seed=i) for i in range(4)]
    replayed = _gpu_runner_codes(eng, reqs, max_slots=4)
    eager = _gpu_runner_codes(eng, reqs, max_slots=4, use_graphs=False)
    assert all(np.array_equal(a, b) for a, b in zip(replayed, eager))


def test_auto_follows_one_switch_in_the_runner_and_in_the_loaders_plan(monkeypatch):
    """`runtime.kv_cache: auto` is decided in one place (model_runner.AUTO_FP8, off until fp8 is measured on a
    GPU): flipped, the runner's choice and the loader's memory plan (engines.load.settings, what `info` shows)
    both become fp8 where it can run; an explicit `model` stays the model's dtype."""
    from engines import load
    from engines.api import EngineSpec
    from engines.runtime import model_runner

    cpu = torch.device("cpu")
    spec = EngineSpec(model=str(TINY / "cv_small"), device="cpu", kv_cache="auto")
    assert not model_runner.kv_cache_choice("auto", cpu) and load.settings(spec)["kv_cache"] == "model"
    monkeypatch.setattr(model_runner, "AUTO_FP8", True)
    assert model_runner.kv_cache_choice("auto", cpu) and load.settings(spec)["kv_cache"] == "fp8"
    assert load.settings(EngineSpec(model=str(TINY / "cv_small"), device="cpu", kv_cache="model"))["kv_cache"] == "model"
    monkeypatch.setattr(kv_cache, "fp8_available", lambda device: False)  # where it cannot run: auto stays
    assert not model_runner.kv_cache_choice("auto", cpu) and load.settings(spec)["kv_cache"] == "model"
