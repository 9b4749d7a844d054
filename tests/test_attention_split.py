"""The split-context decode attention (engines/runtime/attention_split.py, `runtime.attn_split`) against the torch
form, on the CPU through Triton's interpreter (a child process: TRITON_INTERPRET=1 must be set before the kernels
are defined), and compiled on the GPU at the real shapes (`-m gpu`); the fp8 cache's value layout (positions
contiguous) through every reader; the split-count rule and the setting."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.test_attention_kernel import ROOT, run_interpreted

pytest.importorskip("triton", reason="the test extra installs triton (pip install -e '.[test]')")

CASE = """
    import torch
    from engines.model import kv_cache
    from engines.model.layers import rope_cos_sin
    from engines.runtime.attention import reference_attention
    from engines.runtime.attention_split import split_attention
    torch.manual_seed(0)
    H, KV, D, S = 4, 2, 16, 40
    cos, sin = (t[0].contiguous() for t in rope_cos_sin(torch.arange(64)[None], D, 10000.0, torch.float32))
    qn, kn = torch.rand(D) + 0.5, torch.rand(D) + 0.5
    SMALL = dict(BLOCK_S=16, num_warps=1)  # blocks of 16 slots: a 40-slot cache spans three

    def positions(T):
        # the first slot, a middle one, the last, and two new tokens on both sides of a block edge (31 | 32)
        return torch.tensor([[0, 1], [17, 18], [S - T, S - 1], [31, 32]])[:, :T].contiguous()

    def positions_first(T):
        return torch.tensor([[0, 1], [14, 15], [S - T, S - 1], [31, 32]])[:, :T].contiguous()

    def transposed(x):  # the same values stored [.., D, S], as KVCache.allocate stores an fp8 cache's values
        return x.transpose(-1, -2).clone(memory_format=torch.contiguous_format).transpose(-1, -2)

    def same_bytes(a, b):
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
"""


def test_split_kernel_equals_the_torch_form_cache_writes_included():
    """fp32, one and two new tokens per row at the first, a middle and the last slot and across a block edge,
    1, 2, 3 and 5 splits (contexts that do and do not divide them, splits left with no slot), row slices of a
    larger cache: the torch form's output within 1e-5 and the same cache after the writes."""
    out = run_interpreted(CASE + """
    for T in (1, 2):
        qkv = torch.randn(4, T, (H + 2 * KV) * D)
        for splits in (1, 2, 3, 5):
            k0, v0 = torch.randn(6, KV, S, D), torch.randn(6, KV, S, D)
            k1, v1, k2, v2 = k0.clone(), v0.clone(), k0.clone(), v0.clone()
            ref = reference_attention(qkv, qn, kn, cos, sin, positions(T), k1[1:5], v1[1:5], H, KV, 1e-6)
            got = split_attention(qkv, qn, kn, cos, sin, positions(T), k2[1:5], v2[1:5], H, KV, 1e-6, splits=splits,
                                  launch=SMALL)
            assert got.shape == ref.shape == (4, T, H * D)
            assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5), (T, splits, (got - ref).abs().max())
            assert torch.allclose(k1, k2, atol=1e-6) and torch.equal(v1, v2)
            assert not torch.equal(k2, k0) and not torch.equal(v2, v0)
        print("ok", T)
    """)
    assert out.split() == ["ok", "1", "ok", "2"]


def test_split_kernel_in_bf16_within_the_one_program_kernels_bounds():
    """bf16 (the interpreter widens the tiles it multiplies; the roundings of the normed, rotated queries and keys
    and of the weights are the kernels'): 1 and 3 splits against the torch form within the bounds the GPU test
    holds the one-program kernel to, no further from it than that kernel is, the values written equal and the
    keys within a bf16 step of the torch form's."""
    out = run_interpreted(CASE + """
    from engines.runtime.attention import decode_attention
    dt = torch.bfloat16
    qb, kb = qn.to(dt), kn.to(dt)
    for T in (1, 2):
        qkv = torch.randn(4, T, (H + 2 * KV) * D).to(dt)
        for splits in (1, 3):
            k0, v0 = torch.randn(6, KV, S, D).to(dt), torch.randn(6, KV, S, D).to(dt)
            k1, v1, k2, v2 = k0.clone(), v0.clone(), k0.clone(), v0.clone()
            ref = reference_attention(qkv, qb, kb, cos, sin, positions(T), k1[1:5], v1[1:5], H, KV, 1e-6).float()
            got = split_attention(qkv, qb, kb, cos, sin, positions(T), k2[1:5], v2[1:5], H, KV, 1e-6, splits=splits,
                                  launch=SMALL).float()
            one = decode_attention(qkv, qb, kb, cos, sin, positions(T), k0[1:5].clone(), v0[1:5].clone(), H, KV,
                                   1e-6).float()
            err = (got - ref).abs()
            assert err.max() < 0.05 * ref.abs().max() and err.mean() < 0.01 * ref.abs().mean() + 1e-3, err.max()
            assert err.max() <= (one - ref).abs().max() * 1.5 + 1e-3
            assert torch.equal(v1, v2) and (k1.float() - k2.float()).abs().max() < 0.1
        print("ok", T)
    """)
    assert out.split() == ["ok", "1", "ok", "2"]


def test_split_kernel_with_an_fp8_cache_of_either_value_layout():
    """fp8 cache, values stored with each vector contiguous or (as an allocated cache) with the positions
    contiguous; 1, 2 and 3 splits; one and two new tokens: the torch form with the same cache within 1e-5, the
    same float8 bytes and value scales written, key scales within 1e-6 (as the one-program kernel's test)."""
    out = run_interpreted(CASE + """
    for T in (1, 2):
        qkv = torch.randn(4, T, (H + 2 * KV) * D)
        for vt in (False, True):
            for splits in (1, 2, 3):
                q, s = kv_cache.quantize(torch.randn(2, 6, KV, S, D) * torch.rand(2, 6, KV, S, 1) * 4)
                base = [q[0], transposed(q[1]) if vt else q[1], s[0], s[1]]
                a = [x.clone() if i != 1 or not vt else transposed(x) for i, x in enumerate(base)]
                b = [x.clone() if i != 1 or not vt else transposed(x) for i, x in enumerate(base)]
                assert (b[1].stride(2) == 1) == vt
                ref = reference_attention(qkv, qn, kn, cos, sin, positions_first(T), *(x[1:5] for x in a[:2]), H, KV,
                                          1e-6, *(x[1:5] for x in a[2:]))
                got = split_attention(qkv, qn, kn, cos, sin, positions_first(T), *(x[1:5] for x in b[:2]), H, KV,
                                      1e-6, *(x[1:5] for x in b[2:]), splits=splits, launch=SMALL)
                assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5), (T, vt, splits, (got - ref).abs().max())
                assert same_bytes(a[0], b[0]) and same_bytes(a[1], b[1]) and torch.equal(a[3], b[3])
                assert torch.allclose(a[2], b[2], rtol=1e-6, atol=0)
                assert not same_bytes(b[1], base[1])
        print("ok", T)
    """)
    assert out.split() == ["ok", "1", "ok", "2"]


def test_the_one_program_kernel_reads_an_allocated_fp8_cache():
    """An fp8 KVCache as allocate makes it keeps its values with the positions contiguous (the storage
    `[L, B, KV, D, S]`); the one-program kernel (engines.runtime.attention, also the layer kernel's attention)
    and the split kernel read and write it as the torch form does; copy_row moves a row of it."""
    out = run_interpreted(CASE + """
    from types import SimpleNamespace
    from engines.runtime.attention import decode_attention
    cfg = SimpleNamespace(num_hidden_layers=2, num_key_value_heads=KV, head_dim=D)
    caches = [kv_cache.KVCache.allocate(cfg, 6, S, "cpu", torch.float32, fp8=True) for _ in range(3)]
    v = caches[0].all_v
    assert v.shape == (2, 6, KV, S, D) and v.stride(3) == 1 and v.stride(4) == S
    q, s = kv_cache.quantize(torch.randn(2, 2, 6, KV, S, D))
    for c in caches:
        c.all_k.copy_(q[0]); c.all_v.copy_(q[1]); c.all_k_scale.copy_(s[0]); c.all_v_scale.copy_(s[1])
    for T in (1, 2):
        qkv = torch.randn(4, T, (H + 2 * KV) * D)
        outs = []
        for c, fn in zip(caches, (reference_attention, decode_attention, split_attention)):
            kw = {"splits": 2, "launch": SMALL} if fn is split_attention else {}
            outs.append(fn(qkv, qn, kn, cos, sin, positions_first(T), *(x[1:5] for x in c.layer(1)[:2]), H, KV,
                           1e-6, *(x[1:5] for x in c.layer(1)[2:]), **kw))
        assert all(torch.allclose(o, outs[0], atol=1e-5, rtol=1e-5) for o in outs[1:])
        assert all(same_bytes(c.all_v, caches[0].all_v) for c in caches[1:])
    caches[0].copy_row(5, caches[0], 1, 20, clear_rest=True)
    assert same_bytes(caches[0].all_v[:, 5, :, :20], caches[0].all_v[:, 1, :, :20])
    assert not caches[0].all_v[:, 5, :, 20:].view(torch.uint8).any()
    print("ok")
    """)
    assert out.split() == ["ok"]


def test_the_opaque_call_inside_a_compiled_function_gives_the_same_and_writes_the_cache():
    """attention_split.opaque (the A/B's `opaque` variant): the kernels as one torch custom op, called from a
    torch.compile'd function (fullgraph) on row slices of a larger cache: the torch form's output, and the new
    keys and values land in the larger cache (the op's mutation is not lost to a copy)."""
    out = run_interpreted(CASE + """
    from engines.runtime.attention import decode_attention
    from engines.runtime.attention_split import opaque
    for fn in (split_attention, decode_attention):
        op = opaque(fn)
        f = torch.compile(lambda *a: op(*a[:8], H, KV, 1e-6, *a[8:]), fullgraph=True, dynamic=False)
        qkv = torch.randn(4, 1, (H + 2 * KV) * D)
        k0, v0 = torch.randn(2, 6, KV, S, D), torch.randn(2, 6, KV, S, D)
        k1, v1, k2, v2 = k0.clone(), v0.clone(), k0.clone(), v0.clone()
        ref = reference_attention(qkv, qn, kn, cos, sin, positions(1), k1[1][1:5], v1[1][1:5], H, KV, 1e-6)
        got = f(qkv, qn, kn, cos, sin, positions(1), k2[1][1:5], v2[1][1:5], None, None)
        assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5), (got - ref).abs().max()
        assert torch.allclose(k1, k2, atol=1e-6) and torch.equal(v1, v2) and not torch.equal(v2, v0)
        print("ok")
    """)
    assert out.split() == ["ok", "ok"]


def test_runner_with_the_split_kernel_gives_the_reference_codes():
    """The fast step with runtime.attn_split on (the talker's attention through the split kernel, two splits a
    row), requests joining mid-flight, with the model-dtype cache and with fp8: the reference loop's greedy codes
    with the same cache (fp32)."""
    out = run_interpreted("""
        import numpy as np
        from engines.runtime import attention_split
        from engines.runtime.runner import EngineRunner
        from tests.test_runtime import engine, requests
        attention_split.SPLITS = 2
        attention_split.LAUNCH = dict(BLOCK_S=16, num_warps=1)
        eng = engine()
        reqs = requests(3, frames=5)
        for fp8 in (False, True):
            ref = [g.codes.numpy() for g, _ in eng.generate_codes(reqs, fp8=fp8)]
            runner = EngineRunner(eng, max_slots=2, max_context=256, attn_kernel=True, attn_split=True,
                                  sample_kernel=False, kv_cache="fp8" if fp8 else "model")
            assert runner.model.split
            out = runner.synthesize(reqs)
            assert all(np.array_equal(r.codes, c) for r, c in zip(out, ref)), (fp8, [(r.codes, c) for r, c in zip(out, ref)])
            print("same", len(out))
    """)
    assert out.split() == ["same", "3", "same", "3"]


def test_the_split_rule(monkeypatch):
    """Splits until rows x heads x splits fill WAVES waves of the GPU's multiprocessors, each split keeping
    MIN_SPLIT_SLOTS slots, at most MAX_SPLITS; one off the GPU; SPLITS overrides."""
    from engines.runtime import attention_split as a

    monkeypatch.setattr(a, "multiprocessors", lambda index: 132)
    cuda = torch.device("cuda", 0)
    assert a.splits_for(256, 8, 512, cuda) == 1  # a book step: 2,048 programs already
    assert a.splits_for(64, 8, 512, cuda) == 2  # 512 programs, 528 wanted
    assert a.splits_for(16, 8, 512, cuda) == 4  # 128 programs: 5 wanted, 512 slots allow 4
    assert a.splits_for(1, 8, 2048, cuda) == a.MAX_SPLITS
    assert a.splits_for(1, 8, 100, cuda) == 1  # too short to split
    assert a.splits_for(1, 8, 2048, torch.device("cpu")) == 1
    monkeypatch.setattr(a, "SPLITS", 3)
    assert a.splits_for(256, 8, 512, cuda) == 3


def test_the_setting_unset_true_false_and_true_where_it_cannot_run_is_a_clear_error(tmp_path):
    """runtime.attn_split: unset (AUTO_SPLIT: off until measured), true, false (YAML's on/off read as those);
    anything else is refused by the config; true without the attention kernel (the CPU without the interpreter)
    stops the runner with an error naming the key."""
    from appliance.config import ConfigError, load_config
    from engines.runtime.model_runner import AUTO_SPLIT, attn_split_choice

    assert attn_split_choice(None, True) is AUTO_SPLIT and attn_split_choice(False, True) is False
    assert attn_split_choice(True, True) is True and attn_split_choice(None, False) is False
    for text, value in (("null", None), ("true", True), ("false", False), ("on", True), ("off", False)):
        p = tmp_path / f"{text}.yaml"
        p.write_text(f"runtime:\n  attn_split: {text}\n")
        assert load_config(p, environ={}).runtime.attn_split is value
    bad = tmp_path / "bad.yaml"
    bad.write_text("runtime:\n  attn_split: sometimes\n")
    with pytest.raises(ConfigError, match="attn_split"):
        load_config(bad, environ={})
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        from tests.test_runtime import engine
        from engines.runtime.runner import EngineRunner
        EngineRunner(engine(), max_slots=1, max_context=256, attn_split=True)
    """)], env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, cwd=ROOT, capture_output=True,
        text=True, timeout=300)
    assert out.returncode != 0 and "runtime.attn_split" in out.stderr and "leave it unset" in out.stderr


# ----- on the GPU ---------------------------------------------------------------------------------------------
def _gpu_case(dt, fp8: bool, vt: bool, rows: int, slots: int, t: int, g):
    from engines.model import kv_cache
    from engines.model.layers import rope_cos_sin

    H, KV, D = 16, 8, 128
    dev = torch.device("cuda")
    cos, sin = (x[0].contiguous() for x in rope_cos_sin(torch.arange(slots, device=dev)[None], D, 1e6, torch.float32))
    qkv = torch.randn(rows, t, (H + 2 * KV) * D, device=dev, generator=g).to(dt)
    qn, kn = ((torch.rand(D, device=dev, generator=g) + 0.5).to(dt) for _ in range(2))
    pos = (torch.randint(0, slots - t, (rows, 1), device=dev, generator=g) + torch.arange(t, device=dev)).contiguous()
    pos[0] = torch.arange(slots - t, slots, device=dev)  # one row at the cache's end
    k, v = (torch.randn(rows + 2, KV, slots, D, device=dev, generator=g).to(dt) for _ in range(2))
    if not fp8:
        return (qkv, qn, kn, cos, sin, pos), [k, v]
    scale = torch.rand(rows + 2, KV, slots, 1, device=dev, generator=g) * 4
    (kq, ks), (vq, vs) = kv_cache.quantize(k * scale), kv_cache.quantize(v * scale)
    return (qkv, qn, kn, cos, sin, pos), [kq, _positions_contiguous(vq) if vt else vq, ks, vs]


def _positions_contiguous(x):
    """A copy of x `[.., S, D]` stored `[.., D, S]` (an allocated fp8 cache's value layout)."""
    return x.transpose(-1, -2).clone(memory_format=torch.contiguous_format).transpose(-1, -2)


def _copies(cache):
    """Copies of the cache tensors in their own layouts."""
    return [_positions_contiguous(x) if x.dim() == 4 and x.stride(2) == 1 else x.clone() for x in cache]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("cache", ["model", "fp8", "fp8-positions-contiguous"])
def test_gpu_split_kernel_equals_the_torch_form_at_real_shapes(dtype, cache):
    """Compiled for the GPU: the talker's heads (16 query, 8 key/value, 128 wide), 64 rows at scattered positions
    of 512- and 2,048-slot caches, one and two new tokens, 1, 2, 4 splits and the rule's: the torch form with the
    same cache (fp32: 1e-4; bf16: the one-program kernel's bounds), the same values written."""
    from engines.runtime.attention import reference_attention
    from engines.runtime.attention_split import split_attention

    torch.backends.cuda.matmul.allow_tf32 = False
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    fp8 = cache != "model"
    for slots, t, splits in ((512, 1, 1), (512, 2, 2), (2048, 1, 4), (2048, 2, None), (512, 1, None)):
        args, base = _gpu_case(dt, fp8, cache.endswith("contiguous"), 64, slots, t, g)
        a, b = _copies(base), _copies(base)
        ref = reference_attention(*args, *(x[1:-1] for x in a[:2]), 16, 8, 1e-6, *(x[1:-1] for x in a[2:])).float()
        got = split_attention(*args, *(x[1:-1] for x in b[:2]), 16, 8, 1e-6, *(x[1:-1] for x in b[2:]),
                              splits=splits).float()
        err = (got - ref).abs()
        if dt == torch.float32:
            assert err.max() < 1e-4, (slots, t, splits, err.max())
        else:
            assert err.max() < 0.05 * ref.abs().max() and err.mean() < 0.01 * ref.abs().mean() + 1e-3, \
                (slots, t, splits, err.max(), err.mean())
        same = torch.equal(a[1].view(torch.uint8), b[1].view(torch.uint8)) if fp8 else torch.equal(a[1], b[1])
        assert same  # the new values, bit for bit


@pytest.mark.gpu
def test_gpu_runner_with_the_split_kernel_gives_the_eager_codes():
    """On CUDA in fp32, compiled regions and captured graphs with runtime.attn_split true (four slots: steps of
    four, three and two rows through the split kernel, two splits a row at 256 positions by the rule; one row
    through the layer kernel; the model-dtype cache and fp8): the eager reference loop's greedy codes with the
    same cache."""
    import numpy as np

    from engines.runtime.runner import EngineRunner
    from tests.test_runtime import engine, requests

    torch.backends.cuda.matmul.allow_tf32 = False
    eng = engine(device="cuda")
    reqs = requests(4)
    for fp8 in (False, True):
        ref = [g.codes.numpy() for g, _ in eng.generate_codes(reqs, fp8=fp8)]
        runner = EngineRunner(eng, max_slots=4, max_context=256, attn_split=True, kv_cache="fp8" if fp8 else "model")
        assert runner.use_graphs and runner.model.split
        out = runner.synthesize(reqs)
        assert all(np.array_equal(o.codes, r) for o, r in zip(out, ref)), fp8
