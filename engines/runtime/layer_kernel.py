"""A whole decoder layer for one row as one persistent Triton kernel (the single-stream step's layers).

One stream's step is ~100 one-row decoder-layer passes, each a handful of small memory-bound kernels that
read the weights at about half the bandwidth and pay a fixed cost per kernel (docs/PERFORMANCE.md). Here a
layer is one launch of as many programs as the GPU has multiprocessors, all resident at once (a cooperative
launch), that run the layer's five phases with a grid-wide barrier between them:

    0: RMSNorm + Q/K/V projection      (engines.runtime.rowproj.rows, each program its share of rows)
    1: attention, one program per key/value head (engines.runtime.attention.attend)
    2: output projection + residual
    3: RMSNorm + gate/up projection + SiLU product
    4: down projection + residual

Every program takes an equal contiguous share of each projection's rows. Before the barrier ahead of a
phase, a program loads the first block of its rows of that phase's weight into registers, so the weights stream
in while the barrier (and the attention) waits.

The sums and roundings are those of the layer's torch form (decode_step.make_layer with `_gemv`). The
barrier is a counter that only grows: each arrival adds one, each barrier waits for the next multiple of the
grid size, so no launch has to reset it (one counter per step object, its launches on one stream, all of one
grid size). The cooperative launch makes the driver start every program at once or refuse (never a hang).

Where it pays (docs/PERFORMANCE.md): the 0.6B step at one row 4.17 -> 3.78 ms on an H100; a 2048-wide layer
(the 1.7B talker) is slower than the compiled one and keeps it (decode_step.LAYER_KERNEL_MAX_HIDDEN).

Without a barrier (Triton's interpreter runs programs one after another), `decoder_layer(..., split=True)`
launches the phases one by one: the same code, kernel boundaries for barriers; the CPU tests run that way.
"""
from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU builds: the layer keeps its torch form
    triton = None


if triton is not None:
    # the jit helpers exist only where Triton does (a plain install has none)
    from engines.runtime.attention import attend, scale_strides, v_layout
    from engines.runtime.rowproj import rows

    @triton.jit
    def _grid_sync(bar, P):
        """Every program of the launch reaches this point before any goes on; their writes are visible."""
        tl.debug_barrier()
        old = tl.atomic_add(bar, 1, sem="acq_rel", scope="gpu")
        target = (old // P + 1) * P
        seen = old + 1
        while seen < target:
            seen = tl.atomic_add(bar, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()

    @triton.jit
    def _tile(w, n, inside, K: tl.constexpr, BLOCK_K: tl.constexpr, OFF: tl.constexpr = 0):
        """The first K block of rows OFF + n of the row-major weight w `[N, K]`: loaded before a barrier, it
        arrives while the barrier waits (the phase after it starts from registers)."""
        k = tl.arange(0, BLOCK_K)
        return tl.load(w + (OFF + n[:, None]) * K + k[None, :], mask=inside[:, None] & (k < K)[None, :], other=0.0)

    @triton.jit
    def _layer_kernel(x, ln1, wqkv, bqkv, qn, kn, wo, bo, ln2, wgu, wdown, cos_tab, sin_tab, pos, kc, vc, ks, vs,
                      qkv, att, h1, act, out, bar, s_kh, s_ks, s_vh, s_vs, s_vd, s_sh, eps: tl.constexpr, SCALE: tl.constexpr,
                      HID: tl.constexpr, INTER: tl.constexpr, H: tl.constexpr, KV: tl.constexpr, D: tl.constexpr,
                      M: tl.constexpr, PREC: tl.constexpr, INTERPRET: tl.constexpr,
                      R_QKV: tl.constexpr, R_O: tl.constexpr, R_GU: tl.constexpr,
                      BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr,
                      BK_QKV: tl.constexpr, BK_O: tl.constexpr, BK_GU: tl.constexpr, BK_D: tl.constexpr,
                      QKV_BIAS: tl.constexpr, O_BIAS: tl.constexpr, FIRST: tl.constexpr, LAST: tl.constexpr,
                      SYNC: tl.constexpr, PRELOAD: tl.constexpr, FP8: tl.constexpr, VT: tl.constexpr):
        pid = tl.program_id(0)
        P = tl.num_programs(0)
        NQKV: tl.constexpr = (H + 2 * KV) * D
        i_qkv, i_o, i_gu = tl.arange(0, BN_QKV), tl.arange(0, BN_O), tl.arange(0, BN_GU)
        n_qkv, n_o, n_gu = pid * R_QKV + i_qkv, pid * R_O + i_o, pid * R_GU + i_gu
        in_qkv = (i_qkv < R_QKV) & (n_qkv < NQKV)
        in_o = (i_o < R_O) & (n_o < HID)
        in_gu = (i_gu < R_GU) & (n_gu < INTER)
        if FIRST <= 0 and LAST >= 0:
            pre = _tile(wqkv, n_qkv, in_qkv, HID, BK_QKV)
            rows(x, ln1, wqkv, bqkv, x, qkv, eps, n_qkv, in_qkv, NQKV, HID, True, QKV_BIAS, False, False, BK_QKV,
                 pre, pre, True)
            if SYNC:
                _grid_sync(bar, P)
        if FIRST <= 1 and LAST >= 1:
            for h in range(pid, KV, P):  # one key/value head per program (more heads than programs: in turn)
                attend(qkv, qn, kn, cos_tab, sin_tab, pos, kc, vc, att, 0, h, 0, 0, 0, 0, s_kh, s_ks, 0, s_vh,
                       s_vs, 0, 0, eps, SCALE, 1, H, KV, H // KV, D, M, 64, PREC, INTERPRET, ks, vs, 0, s_sh, FP8,
                       s_vd, VT)
            if PRELOAD and LAST >= 2:
                pre_o = _tile(wo, n_o, in_o, H * D, BK_O)
            if SYNC:
                _grid_sync(bar, P)
        if FIRST <= 2 and LAST >= 2:
            if FIRST == 2 or not PRELOAD:
                pre_o = _tile(wo, n_o, in_o, H * D, BK_O)
            rows(att, ln1, wo, bo, x, h1, eps, n_o, in_o, HID, H * D, False, O_BIAS, True, False, BK_O,
                 pre_o, pre_o, True)
            if PRELOAD and LAST >= 3:
                pre_gu = _tile(wgu, n_gu, in_gu, HID, BK_GU)
                pre_up = _tile(wgu, n_gu, in_gu, HID, BK_GU, INTER)
            if SYNC:
                _grid_sync(bar, P)
        if FIRST <= 3 and LAST >= 3:
            if FIRST == 3 or not PRELOAD:
                pre_gu = _tile(wgu, n_gu, in_gu, HID, BK_GU)
                pre_up = _tile(wgu, n_gu, in_gu, HID, BK_GU, INTER)
            rows(h1, ln2, wgu, bo, h1, act, eps, n_gu, in_gu, INTER, HID, True, False, False, True, BK_GU,
                 pre_gu, pre_up, True)
            if PRELOAD and LAST >= 4:
                pre_d = _tile(wdown, n_o, in_o, INTER, BK_D)
            if SYNC:
                _grid_sync(bar, P)
        if FIRST <= 4 and LAST >= 4:
            if FIRST == 4 or not PRELOAD:
                pre_d = _tile(wdown, n_o, in_o, INTER, BK_D)
            rows(act, ln2, wdown, bo, h1, out, eps, n_o, in_o, HID, INTER, False, False, True, False, BK_D,
                 pre_d, pre_d, True)


NUM_WARPS = 8
ACC_ELEMS = 16384  # fp32 accumulator elements of a program's block (per accumulator)
PRELOAD = True  # each phase's first weight block loaded before the barrier ahead of it (A/B: `nopre`)


def _block(rows_per_program: int, k: int, glu: bool = False) -> tuple[int, int]:
    """(rows block, K block) of a phase: the rows a power of two, the accumulators at most ACC_ELEMS fp32 each."""
    bn = triton.next_power_of_2(rows_per_program)
    bk = max(32, min(triton.next_power_of_2(k), ACC_ELEMS // bn // (2 if glu else 1)))
    return bn, bk


def programs(device: torch.device) -> int:
    """Programs of one layer launch: one per multiprocessor (all resident: the barrier needs them)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def new_counter(device: torch.device) -> torch.Tensor:
    """The barrier counter of one step object (its layer launches run on one stream, one after another)."""
    return torch.zeros(1, dtype=torch.int64, device=device)


def decoder_layer(x, w, kc, vc, pos, cos_tab, sin_tab, n_heads: int, n_kv: int, eps: float, counter: torch.Tensor,
                  split: bool | None = None, ks=None, vs=None) -> torch.Tensor:
    """One decoder layer (decode_step.make_layer's) for x `[1, 1, H]` at pos `[1, 1]` over the cache rows kc, vc
    `[1, KV, S, D]` (an fp8 cache: with its scales ks, vs `[1, KV, S]`); w the layer's weight tuple
    (StackWeights). `split`: the phases as separate launches (default: under Triton's interpreter)."""
    ln1, wqkv, bqkv, qn, kn, wo, bo, ln2, wgu, wdown = w
    hid, d = x.shape[-1], kc.shape[-1]
    inter = wdown.shape[1]
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    split = interpret if split is None else split
    p = programs(x.device)
    r_qkv, r_o, r_gu = triton.cdiv(wqkv.shape[0], p), triton.cdiv(hid, p), triton.cdiv(inter, p)
    (bn_qkv, bk_qkv), (bn_o, bk_o), (bn_gu, bk_gu) = _block(r_qkv, hid), _block(r_o, n_heads * d), \
        _block(r_gu, hid, glu=True)
    _, bk_d = _block(r_o, inter)
    new = lambda n: torch.empty(n, device=x.device, dtype=x.dtype)  # noqa: E731
    qkv, att, h1, act, out = new(wqkv.shape[0]), new(n_heads * d), new(hid), new(inter), new(hid)
    s_vs, s_vd, vt = v_layout(vc)
    meta = dict(eps=eps, SCALE=d ** -0.5, HID=hid, INTER=inter, H=n_heads, KV=n_kv, D=d,
                M=max(16, triton.next_power_of_2(n_heads // n_kv)), INTERPRET=x.device.type != "cuda",
                PREC="ieee" if x.dtype == torch.float32 else "tf32",
                R_QKV=r_qkv, R_O=r_o, R_GU=r_gu, BN_QKV=bn_qkv, BN_O=bn_o, BN_GU=bn_gu, BK_QKV=bk_qkv, BK_O=bk_o,
                BK_GU=bk_gu, BK_D=bk_d, QKV_BIAS=bqkv is not None, O_BIAS=bo is not None, PRELOAD=PRELOAD,
                FP8=ks is not None, VT=vt, num_warps=NUM_WARPS)
    k_sc, v_sc, _, s_sh = scale_strides(kc, ks, vs)
    args = (x, ln1, wqkv, bqkv if bqkv is not None else ln1, qn, kn, wo, bo if bo is not None else ln1, ln2, wgu,
            wdown, cos_tab, sin_tab, pos, kc, vc, k_sc, v_sc, qkv, att, h1, act, out, counter,
            kc.stride(1), kc.stride(2), vc.stride(1), s_vs, s_vd, s_sh)
    if split:
        for phase in range(5):
            _layer_kernel[(p,)](*args, FIRST=phase, LAST=phase, SYNC=False, **meta)
    else:
        _layer_kernel[(p,)](*args, FIRST=0, LAST=4, SYNC=True, launch_cooperative_grid=True, **meta)
    return out.view(x.shape)
