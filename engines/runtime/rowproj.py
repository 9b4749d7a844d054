"""One-row projections of a decoder layer as Triton kernels, each with its neighbours fused in.

A single stream's step multiplies one row by every weight of ~100 decoder-layer passes: memory-bound
reductions whose compiled form read the weights at about half the bandwidth and spent separate kernels on
the norms. Here a layer's four projections are four launches, one program per block of output rows, the
whole input row read by every program (it is small and in cache):

- `project(x, w, b, norm=(weight, eps))`: RMSNorm of x, then x @ w.T (+ b)  (Q/K/V);
- `project(x, w, b, residual=r)`: r + x @ w.T (+ b)  (the output projection, the MLP's down projection);
- `project(x, w, norm=..., glu=True)`: silu(h @ gate.T) * (h @ up.T) of the normed row, w = [gate; up].

Sums are fp32; values are rounded to the model's dtype where the torch form (`engines.runtime.decode_step`'s
`_gemv` and `rms`) rounds them. Rows of one: x `[..., K]` with one row in all.
"""
from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU builds: the layer keeps its torch form
    triton = None


if triton is not None:
    @triton.jit
    def _row_kernel(x, nw, w, bias, res, out, eps, N, K: tl.constexpr, NORM: tl.constexpr,
                    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, GLU: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr):
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows(x, nw, w, bias, res, out, eps, n, n < N, N, K, NORM, HAS_BIAS, HAS_RES, GLU, BLOCK_K, x, x, False)

    @triton.jit
    def rows(x, nw, w, bias, res, out, eps, n, inside, N, K: tl.constexpr, NORM: tl.constexpr,
             HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, GLU: tl.constexpr, BLOCK_K: tl.constexpr, first, first2,
             FIRST: tl.constexpr):
        """Output rows `n` (where `inside`) of one projection (see the module doc): the kernel's block, and a
        phase of the layer kernel (engines.runtime.layer_kernel). x and res are read through L2 (`.cg`): in the
        layer kernel other programs wrote them in an earlier phase of the same launch. `FIRST`: the weight's
        first K block (and the up half's, with GLU) is already loaded: `first`, `first2`."""
        dt = out.dtype.element_ty
        if NORM:
            ss = tl.zeros((BLOCK_K,), tl.float32)
            for k0 in tl.static_range(0, K, BLOCK_K):
                xk = tl.load(x + k0 + tl.arange(0, BLOCK_K), mask=k0 + tl.arange(0, BLOCK_K) < K, other=0.0,
                             cache_modifier=".cg")
                ss += xk.to(tl.float32) * xk.to(tl.float32)
            rstd = tl.math.rsqrt(tl.sum(ss, axis=0) / K + eps)
        acc = tl.zeros((n.shape[0], BLOCK_K), tl.float32)
        acc2 = tl.zeros((n.shape[0], BLOCK_K), tl.float32)
        for k0 in tl.static_range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            kin = k < K
            xk = tl.load(x + k, mask=kin, other=0.0, cache_modifier=".cg").to(tl.float32)
            if NORM:  # rms(): the normed row rounded, times the weight, rounded
                xk = (tl.load(nw + k, mask=kin, other=0.0).to(tl.float32) * (xk * rstd).to(dt).to(tl.float32))
                xk = xk.to(dt).to(tl.float32)
            m = inside[:, None] & kin[None, :]
            if FIRST and k0 == 0:
                acc += first.to(tl.float32) * xk[None, :]
                if GLU:
                    acc2 += first2.to(tl.float32) * xk[None, :]
            else:
                acc += tl.load(w + n[:, None] * K + k[None, :], mask=m, other=0.0).to(tl.float32) * xk[None, :]
                if GLU:
                    acc2 += tl.load(w + (N + n[:, None]) * K + k[None, :], mask=m, other=0.0).to(tl.float32) * xk[None, :]
        y = tl.sum(acc, axis=1)
        if HAS_BIAS:
            y += tl.load(bias + n, mask=inside, other=0.0).to(tl.float32)
        if GLU:  # F.silu(gate) * up on the rounded projections, each step rounded as torch rounds it
            g = y.to(dt).to(tl.float32)
            u = tl.sum(acc2, axis=1).to(dt).to(tl.float32)
            y = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32) * u
        if HAS_RES:  # r + projection, added in the model's dtype
            y = tl.load(res + n, mask=inside, other=0.0, cache_modifier=".cg").to(tl.float32) + y.to(dt).to(tl.float32)
        tl.store(out + n, y.to(dt), mask=inside)


BLOCK_N = 4  # output rows per program: many small programs keep enough weight loads in flight per SM


def project(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, norm: tuple | None = None,
            residual: torch.Tensor | None = None, glu: bool = False) -> torch.Tensor:
    """See the module doc. x `[..., K]` holding one row, w `[N, K]` (`[2 N, K]` with glu) contiguous;
    returns `[..., N]` in x's dtype."""
    k = x.shape[-1]
    n = w.shape[0] // 2 if glu else w.shape[0]
    out = torch.empty(*x.shape[:-1], n, device=x.device, dtype=x.dtype)
    xr = x.reshape(k)
    nw, eps = norm if norm is not None else (xr, 0.0)
    bn = BLOCK_N
    _row_kernel[(triton.cdiv(n, bn),)](
        xr, nw, w, b if b is not None else xr, residual.reshape(n) if residual is not None else xr, out, eps, n,
        K=k, NORM=norm is not None, HAS_BIAS=b is not None, HAS_RES=residual is not None, GLU=glu,
        BLOCK_N=bn, BLOCK_K=min(triton.next_power_of_2(k), 1024), num_warps=4)
    return out
