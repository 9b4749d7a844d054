"""The one-row projection kernels (engines/runtime/rowproj.py) against the layer's torch form, on the CPU
through Triton's interpreter (a child process: TRITON_INTERPRET=1 must be set before the kernel is
defined), and compiled on the GPU."""
from __future__ import annotations

import textwrap

import pytest

from tests.test_attention_kernel import gpu_one_row_codes_equal_eager, interpreted_one_row_codes, run_interpreted

pytest.importorskip("triton", reason="the test extra installs triton (pip install -e '.[test]')")

CHECK = """
    import torch
    import torch.nn.functional as F
    from engines.runtime.attention import rms
    from engines.runtime.decode_step import _gemv
    from engines.runtime.rowproj import project

    def compare(K, N, dtype, device, tol):
        g = torch.Generator(device=device).manual_seed(K + N)
        r = lambda *s: torch.randn(*s, generator=g, device=device)
        x, b, res = r(1, 1, K).to(dtype), r(N).to(dtype), r(1, 1, N).to(dtype)
        w, wgu = (r(N, K) / K ** 0.5).to(dtype), (r(2 * N, K) / K ** 0.5).to(dtype)
        nw = (torch.rand(K, generator=g, device=device) + 0.5).to(dtype)
        h = rms(x, nw, 1e-6)
        pairs = [(project(x, w, b, norm=(nw, 1e-6)), _gemv(h, w, b)),
                 (project(x, w, None, residual=res), res + _gemv(x, w)),
                 (project(x, w, b, residual=res), res + _gemv(x, w, b)),
                 (project(x, wgu, norm=(nw, 1e-6), glu=True), F.silu(_gemv(h, wgu[:N])) * _gemv(h, wgu[N:]))]
        for got, ref in pairs:
            assert got.shape == ref.shape and got.dtype == ref.dtype
            err = (got.float() - ref.float()).abs().max().item()
            assert err <= tol * max(1.0, ref.float().abs().max().item()), (K, N, err)
"""


def test_projections_equal_the_torch_form():
    """Norm + projection (+ bias), projection + residual, the normed gate/up SiLU product; widths that are
    and are not multiples of the blocks (fp32)."""
    out = run_interpreted(CHECK + """
    for K, N in ((64, 96), (200, 40), (48, 1000), (1024, 16)):
        compare(K, N, torch.float32, "cpu", 1e-5)
    print("ok")
    """)
    assert out.split() == ["ok"]


def test_runner_with_the_row_kernels_gives_the_reference_codes():
    """The fast step with every one-row layer pass through the kernels (one slot: the whole decode; two:
    one-row and two-row steps mixed): the reference loop's greedy codes (fp32)."""
    out = interpreted_one_row_codes("row_kernel")
    assert out.split() == ["same", "2"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_projections_equal_the_torch_form_at_real_shapes(dtype):
    """Compiled for the GPU: the 0.6B and 1.7B talkers' and predictors' widths."""
    import torch

    ns: dict = {}
    exec(textwrap.dedent(CHECK), ns)
    dt = getattr(torch, dtype)
    for K, N in ((1024, 4096), (2048, 1024), (1024, 3072), (3072, 1024), (2048, 6144), (6144, 2048)):
        ns["compare"](K, N, dt, "cuda", 1e-4 if dt == torch.float32 else 2e-2)


@pytest.mark.gpu
def test_gpu_runner_with_the_row_kernels_gives_the_eager_codes():
    """On CUDA in fp32, compiled regions and captured graphs with the row kernels in every one-row layer
    pass (one slot, then two): the reference loop's greedy codes."""
    gpu_one_row_codes_equal_eager("row_kernel")
