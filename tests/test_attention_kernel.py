"""The Triton decode-attention kernel (engines/runtime/attention.py) against its torch form, on the CPU
through Triton's interpreter (TRITON_INTERPRET=1 must be set before the kernel is defined, hence a child
process); the GPU tests in test_runtime.py run it compiled inside the captured graphs."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the test extra installs triton (pip install -e '.[test]')")
ROOT = Path(__file__).resolve().parent.parent


def run_interpreted(code: str) -> str:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def interpreted_one_row_codes(setting: str) -> str:
    """Through the interpreter, the fast step with the one-row kernel `setting` (an EngineRunner keyword) on,
    one slot (the whole decode one row) and two (one- and two-row steps mixed), against the reference loop's
    greedy codes (fp32); prints "same 2" when every request's codes are equal."""
    return run_interpreted(f"""
        import numpy as np
        from tests.test_runtime import engine, reference, requests
        from engines.runtime.runner import EngineRunner
        eng = engine()
        reqs = requests(2, frames=4)
        ref = reference(eng, reqs)
        kw = dict(max_context=256, {setting}=True, attn_kernel=False, sample_kernel=False)
        solo = EngineRunner(eng, max_slots=1, **kw).synthesize(reqs[:1])[0].codes
        assert np.array_equal(solo, ref[0][0]), (solo, ref[0][0])
        out = EngineRunner(eng, max_slots=2, **kw).synthesize(reqs)
        assert all(np.array_equal(o.codes, r) for o, (r, _) in zip(out, ref))
        print("same", len(out))
    """)


def gpu_one_row_codes_equal_eager(setting: str) -> None:
    """On CUDA in fp32, compiled regions and captured graphs with the one-row kernel `setting` on (one slot,
    then two): the reference loop's greedy codes."""
    import numpy as np
    import torch

    from engines.runtime.runner import EngineRunner
    from tests.test_runtime import engine, reference, requests

    torch.backends.cuda.matmul.allow_tf32 = False
    eng = engine(device="cuda")
    reqs = requests(4)
    ref = reference(eng, reqs)
    for slots in (1, 2):
        runner = EngineRunner(eng, max_slots=slots, max_context=256, **{setting: True})
        assert runner.use_graphs
        out = runner.synthesize(reqs)
        for (codes, _), res in zip(ref, out):
            assert np.array_equal(res.codes, codes)


def asking_where_it_cannot_run_fails_clearly(setting: str) -> None:
    """Asking for kernel `setting` (an EngineRunner keyword) on the CPU without the interpreter: the runner
    does not start, and the error names runtime.`setting` and says to leave it unset."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        from tests.test_runtime import engine
        from engines.runtime.runner import EngineRunner
        EngineRunner(engine(), max_slots=1, max_context=256, {setting}=True)
    """)], env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, cwd=ROOT, capture_output=True,
        text=True, timeout=300)
    assert out.returncode != 0 and f"runtime.{setting}" in out.stderr and "leave it unset" in out.stderr


def test_kernel_equals_torch_form_cache_writes_included():
    """One or two new tokens per row, rows at the first, a middle and the last cache slot, cache views
    that are row slices of a larger cache: same output and the same cache (fp32)."""
    out = run_interpreted("""
        import torch
        from engines.model.layers import rope_cos_sin
        from engines.runtime.attention import available, decode_attention, reference_attention
        assert available(torch.device("cpu"))
        torch.manual_seed(0)
        H, KV, D, S = 4, 2, 16, 40
        cos, sin = (t[0].contiguous() for t in rope_cos_sin(torch.arange(64)[None], D, 10000.0, torch.float32))
        for T in (1, 2):
            qkv = torch.randn(3, T, (H + 2 * KV) * D)
            qn, kn = torch.rand(D) + 0.5, torch.rand(D) + 0.5
            pos = torch.tensor([[0, 1], [17, 18], [S - T, S - 1]])[:, :T].contiguous()
            k0, v0 = torch.randn(5, KV, S, D), torch.randn(5, KV, S, D)
            k1, v1, k2, v2 = k0.clone(), v0.clone(), k0.clone(), v0.clone()
            ref = reference_attention(qkv, qn, kn, cos, sin, pos, k1[1:4], v1[1:4], H, KV, 1e-6)
            got = decode_attention(qkv, qn, kn, cos, sin, pos, k2[1:4], v2[1:4], H, KV, 1e-6)
            assert got.shape == ref.shape == (3, T, H * D)
            assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5), (got - ref).abs().max()
            assert torch.allclose(k1, k2, atol=1e-6) and torch.equal(v1, v2)
            assert not torch.equal(k2, k0)  # the new keys were written
            print("ok", T)
    """)
    assert out.split() == ["ok", "1", "ok", "2"]


def test_runner_with_the_kernel_gives_the_reference_codes():
    """The fast step with the kernel in every decoder layer (talker and code predictor), requests joining
    mid-flight: the reference loop's greedy codes (fp32)."""
    out = run_interpreted("""
        import numpy as np
        from pathlib import Path
        from engines.api import SamplingParams, SynthesisRequest
        from engines.engine import TTSEngine
        from engines.runtime.runner import EngineRunner
        eng = TTSEngine.load(Path("tests/data/tiny/cv_small"), device="cpu", dtype="float32")
        reqs = [SynthesisRequest(text=t, voice="vivian", language="english",
                                 sampling=SamplingParams.greedy(max_new_tokens=n, seed=1))
                for t, n in (("Hello world, this is a test.", 6), ("Guten Tag.", 9), ("Short one.", 4))]
        ref = [g.codes.numpy() for g, _ in eng.generate_codes(reqs)]
        runner = EngineRunner(eng, max_slots=2, max_context=256, attn_kernel=True, sample_kernel=False)
        assert runner.model.fast._t_layer is not None
        out = runner.synthesize(reqs)
        assert all(np.array_equal(r.codes, c) for r, c in zip(out, ref)), [(r.codes, c) for r, c in zip(out, ref)]
        print("same", len(out))
    """)
    assert out.split() == ["same", "3"]


def test_asking_for_the_kernel_where_it_cannot_run_is_a_clear_error():
    asking_where_it_cannot_run_fails_clearly("attn_kernel")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_kernel_equals_torch_form_at_real_shapes(dtype):
    """Compiled for the GPU (the interpreter above multiplies no bf16 tiles): the real heads (16 query, 8
    key/value, 128 wide), 64 rows at scattered positions of a 512-slot cache (the talker's launch) and of a
    17-slot one (the code predictor's: attention.launch_for), one and two new tokens."""
    import torch

    from engines.model.layers import rope_cos_sin
    from engines.runtime.attention import decode_attention, reference_attention

    torch.backends.cuda.matmul.allow_tf32 = False
    dt, dev = getattr(torch, dtype), torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    H, KV, D, B = 16, 8, 128, 64
    for S, T in ((512, 1), (512, 2), (17, 1), (17, 2)):
        cos, sin = (t[0].contiguous() for t in rope_cos_sin(torch.arange(S, device=dev)[None], D, 1e6, torch.float32))
        qkv = torch.randn(B, T, (H + 2 * KV) * D, device=dev, generator=g).to(dt)
        qn, kn = (torch.rand(D, device=dev, generator=g) + 0.5).to(dt), (torch.rand(D, device=dev, generator=g) + 0.5).to(dt)
        first = torch.randint(0, S - T, (B, 1), device=dev, generator=g)
        pos = (first + torch.arange(T, device=dev)).contiguous()
        k0 = torch.randn(B + 2, KV, S, D, device=dev, generator=g).to(dt)
        v0 = torch.randn(B + 2, KV, S, D, device=dev, generator=g).to(dt)
        k1, v1, k2, v2 = k0.clone(), v0.clone(), k0.clone(), v0.clone()
        ref = reference_attention(qkv, qn, kn, cos, sin, pos, k1[1:-1], v1[1:-1], H, KV, 1e-6).float()
        got = decode_attention(qkv, qn, kn, cos, sin, pos, k2[1:-1], v2[1:-1], H, KV, 1e-6).float()
        err = (got - ref).abs()
        if dt == torch.float32:
            assert err.max() < 1e-4 and torch.allclose(k1, k2, atol=1e-5) and torch.equal(v1, v2)
        else:  # bf16 rounding of the scores and weights differs from the two-matmul form
            assert err.max() < 0.05 * ref.abs().max() and err.mean() < 0.01 * ref.abs().mean() + 1e-3
            assert (k1.float() - k2.float()).abs().max() < 0.07 and torch.equal(v1, v2)
