"""Decode attention with each row's context split over several programs (flash-decoding), for long caches.

engines.runtime.attention's kernel runs one program per (row, key/value head): at a book step's 256 rows and
450 positions that is 2,048 programs reading 230 KB each, and with an fp8 cache the float8 tiles were widened in
the loop's critical path (docs/PERFORMANCE.md: x0.83). Here the grid is (row x key/value head, split): split j
of a row reads its own contiguous share of the row's positions 0..last (the shares are balanced per row, in
whole blocks of BLOCK_S slots), and keeps an online softmax over them: its running maximum m, its sum l and its
weighted values acc (fp32). With one split the program normalizes and writes the output itself (no second
launch, no workspace); with several, each writes (m, l, acc) of its query rows to a workspace and a second small
kernel combines them:

    out = sum_j exp(m_j - M) acc_j / sum_j exp(m_j - M) l_j,    M = max_j m_j

The new keys and values of a row (one or two tokens) are normed, rotated and written (an fp8 cache: quantized
with their scales) by the split whose share holds their position, before it reads its share; no other split
reads those positions. Float8 tiles are transposed before they are widened (the transposed view of the tile in
shared memory feeds the tensor cores' operand load, which widens in registers) and widened to fp16, one
conversion instruction per two values (e4m3 -> fp16 is exact; fp16 -> bf16 was a second one per value); the
queries and softmax weights of that dot are fp16 too (each bf16 query value is exact in fp16 within its range;
the weights are in [0, 1]). The model-dtype path multiplies as engines.runtime.attention does.

`splits_for` is the rule that picks the split count (rows x key/value heads against the GPU's multiprocessors,
with a floor of slots per split); `SPLITS` overrides it (benchmarks). The torch form is
engines.runtime.attention.reference_attention.
"""
from __future__ import annotations

from typing import Optional

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU builds: the layer keeps its torch form
    triton = None

WAVES = 4  # splits until rows x key/value heads x splits >= WAVES x multiprocessors ...
MIN_SPLIT_SLOTS = 128  # ... while each split keeps at least this many cache slots
MAX_SPLITS = 16
SPLITS: Optional[int] = None  # a fixed split count for every call (benchmarks); None: the rule
LAUNCH: Optional[dict] = None  # BLOCK_S / num_warps / num_stages for every call (benchmarks); None: launch_for
OPAQUE = False  # the step's attention through `opaque` (benchmarks.ab_step's `opaque` variant; A/B only)


_MULTIPROCESSORS: dict = {}


def multiprocessors(index: int) -> int:
    """The GPU's multiprocessor count (asked once; the engine asks before its step is compiled, so the traced
    step reads a number)."""
    if index not in _MULTIPROCESSORS:
        _MULTIPROCESSORS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _MULTIPROCESSORS[index]


def splits_for(rows: int, kv_heads: int, slots: int, device: torch.device) -> int:
    """How many programs read one (row, key/value head)'s cache of `slots` positions: enough for WAVES waves
    of programs over the GPU's multiprocessors, each reading at least MIN_SPLIT_SLOTS slots, at most
    MAX_SPLITS. A book step's 256 rows x 8 heads already fill an H100 (132 multiprocessors): 1; one stream's
    row at 2,048 positions: 16. Off the GPU (the interpreter): 1."""
    if SPLITS is not None:
        return SPLITS
    if device.type != "cuda":
        return 1
    want = -(-WAVES * multiprocessors(device.index or 0) // max(1, rows * kv_heads))
    return max(1, min(want, slots // MIN_SPLIT_SLOTS, MAX_SPLITS))


def launch_for(slots: int, fp8: bool) -> dict:
    """The split kernel's block of slots, warps and pipeline depth (LAUNCH overrides; benchmarks.attention_bench
    sweeps them)."""
    if LAUNCH is not None:
        return dict(LAUNCH)
    return {"BLOCK_S": 64, "num_warps": 4, "num_stages": 3}


if triton is not None:
    from engines.runtime.attention import _normed_rotated, _store_fp8, _v_offsets

    @triton.jit
    def _split_attention_kernel(qkv, qn_w, kn_w, cos_tab, sin_tab, pos, kc, vc, ks, vs, out, part_o, part_ml,
                      s_qb, s_qt, s_pb, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_vd, s_sb, s_sh, s_ob, s_ot, n_slots,
                      eps: tl.constexpr, scale: tl.constexpr, T: tl.constexpr, H: tl.constexpr, KV: tl.constexpr,
                      G: tl.constexpr, D: tl.constexpr, M: tl.constexpr, R: tl.constexpr, BLOCK_S: tl.constexpr,
                      PREC: tl.constexpr, INTERPRET: tl.constexpr, FP8: tl.constexpr, VT: tl.constexpr,
                      SPLITS: tl.constexpr):
        """Program (row x KV + head, split): see the module doc. part_o `[B KV, SPLITS, R, D]` and part_ml
        `[B KV, SPLITS, 2, R]` (fp32) take the split's acc and (m, l) of its R query rows (SPLITS > 1). VT: the
        values' positions are contiguous (engines.runtime.attention.v_layout); n_slots: the cache's positions."""
        bh = tl.program_id(0)
        j = tl.program_id(1)
        b = bh // KV
        h = bh % KV
        d = tl.arange(0, D)
        dt = qkv.dtype.element_ty
        i = tl.arange(0, M)
        ti, gi, real = i // G, i % G, i < T * G
        pi = tl.load(pos + b * s_pb + ti, mask=real, other=0)  # each query's own position
        last = tl.max(pi, axis=0)
        per = tl.cdiv(tl.cdiv(last + 1, BLOCK_S), SPLITS) * BLOCK_S  # this row's share of slots per split
        lo = j * per
        hi = tl.minimum(lo + per, last + 1)
        rot = tl.where(d < D // 2, d + D // 2, d - D // 2)
        sign = tl.where(d < D // 2, -1.0, 1.0)
        for t in tl.static_range(T):  # the new keys and values whose slots are this split's
            p = tl.load(pos + b * s_pb + t)
            if (p >= lo) & (p < hi):
                cos = tl.load(cos_tab + p * D + d).to(dt).to(tl.float32)
                sin = tl.load(sin_tab + p * D + d).to(dt).to(tl.float32)
                row = qkv + b * s_qb + t * s_qt
                kw = tl.load(kn_w + d).to(tl.float32)
                kw_rot = tl.load(kn_w + rot).to(tl.float32)
                k = _normed_rotated(row, (H + h) * D + d, d, rot, sign, kw, kw_rot, cos, sin, d < D, eps, D)
                v = tl.load(row + (H + KV + h) * D + d)
                if FP8:
                    _store_fp8(kc + b * s_kb + h * s_kh + p * s_ks + d, ks + b * s_sb + h * s_sh + p, k, INTERPRET)
                    _store_fp8(vc + b * s_vb + h * s_vh + _v_offsets(p, d, s_vs, s_vd, VT),
                               vs + b * s_sb + h * s_sh + p, v, INTERPRET)
                else:
                    tl.store(kc + b * s_kb + h * s_kh + p * s_ks + d, k)
                    tl.store(vc + b * s_vb + h * s_vh + _v_offsets(p, d, s_vs, s_vd, VT), v)
        tl.debug_barrier()  # the writes above are read below by other threads of this program
        qw = tl.load(qn_w + d).to(tl.float32)
        qw_rot = tl.load(qn_w + rot).to(tl.float32)
        cos = tl.load(cos_tab + pi[:, None] * D + d[None, :]).to(dt).to(tl.float32)
        sin = tl.load(sin_tab + pi[:, None] * D + d[None, :]).to(dt).to(tl.float32)
        q = _normed_rotated(qkv + b * s_qb, ti[:, None] * s_qt + (h * G + gi[:, None]) * D + d[None, :], d[None, :],
                            rot[None, :], sign[None, :], qw[None, :], qw_rot[None, :], cos, sin, real[:, None],
                            eps, D)  # [M, D]
        if FP8:  # the dot's operands: fp16 (float8 widens to it exactly; bf16 queries keep their values)
            q = q.to(tl.float32).to(tl.float16) if dt != tl.float32 else q
        if INTERPRET:  # the interpreter multiplies no 16-bit tiles (numpy has no bf16)
            q = q.to(tl.float32)
        m = tl.full((M,), float("-inf"), tl.float32)
        l = tl.zeros((M,), tl.float32)
        acc = tl.zeros((M, D), tl.float32)
        s = tl.arange(0, BLOCK_S)
        kbase = kc + b * s_kb + h * s_kh
        vbase = vc + b * s_vb + h * s_vh
        # slots are read up to `lim`, hi rounded up to 16 (never past the cache): a mask constant over 16 slots
        # lets the loads of a position-contiguous value cache be whole 16-byte words; the slots past hi
        # (finite cache contents) are masked out of the scores below
        lim = tl.minimum(tl.cdiv(hi, 16) * 16, n_slots)
        for start in range(lo, hi, BLOCK_S):
            start = tl.multiple_of(start, BLOCK_S)
            slot = start + s
            inside = slot < lim
            kt = tl.load(kbase + slot[None, :] * s_ks + d[:, None], mask=inside[None, :], other=0.0)  # [D, S]
            if VT:  # the tile as stored, positions contiguous, then its transposed view
                vblk = tl.trans(tl.load(vbase + slot[None, :] + d[:, None] * s_vd, mask=inside[None, :], other=0.0))
            else:
                vblk = tl.load(vbase + slot[:, None] * s_vs + d[None, :], mask=inside[:, None], other=0.0)  # [S, D]
            if FP8:  # scales of the slots [S]
                k_sc = tl.load(ks + b * s_sb + h * s_sh + slot, mask=inside, other=0.0)
                v_sc = tl.load(vs + b * s_sb + h * s_sh + slot, mask=inside, other=0.0)
            kt = kt.to(q.dtype)
            vblk = vblk.to(q.dtype)
            sc = tl.dot(q, kt, input_precision=PREC)  # [M, S]
            if FP8:
                sc = sc * k_sc[None, :]
            sc = tl.where(slot[None, :] <= pi[:, None], sc * scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(sc, axis=1))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a query with no slot here yet: nothing added
            alpha = tl.exp(m - m_ref)
            e = tl.exp(sc - m_ref[:, None])
            l = l * alpha + tl.sum(e, axis=1)
            if FP8:  # the value scales relative to the block's largest (in (0, 1]: fp16 weights keep their range)
                v_ref = tl.max(v_sc, axis=0)
                v_ref = tl.where(v_ref > 0, v_ref, 1.0)
                w = e * (v_sc / v_ref)[None, :]
                acc = acc * alpha[:, None] + v_ref * tl.dot(w.to(vblk.dtype), vblk, input_precision=PREC)
            else:  # the weights rounded as the model-dtype kernel rounds them
                acc = acc * alpha[:, None] + tl.dot(e.to(dt).to(vblk.dtype), vblk, input_precision=PREC)
            m = m_new
        if SPLITS == 1:
            o = acc / l[:, None]
            tl.store(out + b * s_ob + ti[:, None] * s_ot + (h * G + gi[:, None]) * D + d[None, :], o.to(dt),
                     mask=real[:, None])
        else:
            part = bh * SPLITS + j
            tl.store(part_o + (part * R + i[:, None]) * D + d[None, :], acc, mask=real[:, None])
            tl.store(part_ml + (part * 2) * R + i, m, mask=real)
            tl.store(part_ml + (part * 2 + 1) * R + i, l, mask=real)

    @triton.jit
    def _split_attention_combine(part_o, part_ml, out, s_ob, s_ot, T: tl.constexpr, KV: tl.constexpr, G: tl.constexpr,
                        D: tl.constexpr, R: tl.constexpr, SPLITS: tl.constexpr, SP: tl.constexpr):
        """Program row x KV + head: its splits' (m, l, acc) -> the normalized output of its T x G queries."""
        bh = tl.program_id(0)
        b = bh // KV
        h = bh % KV
        sp = tl.arange(0, SP)
        r = tl.arange(0, R)
        d = tl.arange(0, D)
        ok = (sp[:, None] < SPLITS) & (r[None, :] < T * G)  # [SP, R]
        base = (bh * SPLITS + sp[:, None]) * 2 * R + r[None, :]
        m = tl.load(part_ml + base, mask=ok, other=float("-inf"))
        l = tl.load(part_ml + base + R, mask=ok, other=0.0)
        top = tl.max(m, axis=0)  # [R]: finite for every query (split 0 holds slot 0)
        top = tl.where(top == float("-inf"), 0.0, top)
        w = tl.exp(m - top[None, :])  # [SP, R]; splits with no slot for a query: 0
        den = tl.sum(w * l, axis=0)
        o = tl.load(part_o + ((bh * SPLITS + sp[:, None, None]) * R + r[None, :, None]) * D + d[None, None, :],
                    mask=ok[:, :, None], other=0.0)  # [SP, R, D]
        res = tl.sum(w[:, :, None] * o, axis=0) / den[:, None]  # [R, D]
        ti, gi = r // G, r % G
        tl.store(out + b * s_ob + ti[:, None] * s_ot + (h * G + gi[:, None]) * D + d[None, :],
                 res.to(out.dtype.element_ty), mask=(r < T * G)[:, None])


def split_attention(qkv, qn, kn, cos_tab, sin_tab, pos, kc, vc, n_heads: int, n_kv: int, eps: float,
                    ks=None, vs=None, splits: Optional[int] = None, launch: Optional[dict] = None):
    """engines.runtime.attention.decode_attention's contract (same arguments and result) through the split
    kernel: `splits` programs per (row, key/value head) (None: `splits_for`), then the combine kernel where
    there are several. `launch`: BLOCK_S / num_warps / num_stages in place of `launch_for`'s."""
    from engines.runtime.attention import scale_strides, v_layout

    b, t, _ = qkv.shape
    d = kc.shape[-1]
    g = n_heads // n_kv
    fp8 = ks is not None
    n = splits or splits_for(b, n_kv, kc.shape[2], qkv.device)
    out = torch.empty(b, t, n_heads * d, device=qkv.device, dtype=qkv.dtype)
    rq = triton.next_power_of_2(t * g)  # query rows kept per split
    if n > 1:
        part_o = torch.empty(b * n_kv, n, rq, d, device=qkv.device, dtype=torch.float32)
        part_ml = torch.empty(b * n_kv, n, 2, rq, device=qkv.device, dtype=torch.float32)
    else:
        part_o = part_ml = out  # unused
    k_sc, v_sc, s_sb, s_sh = scale_strides(kc, ks, vs)
    s_vs, s_vd, vt = v_layout(vc)
    interpret = qkv.device.type != "cuda"
    _split_attention_kernel[(b * n_kv, n)](
        qkv, qn, kn, cos_tab, sin_tab, pos, kc, vc, k_sc, v_sc, out, part_o, part_ml,
        qkv.stride(0), qkv.stride(1), pos.stride(0), kc.stride(0), kc.stride(1), kc.stride(2),
        vc.stride(0), vc.stride(1), s_vs, s_vd, s_sb, s_sh, out.stride(0), out.stride(1), kc.shape[2],
        eps, d ** -0.5, T=t, H=n_heads, KV=n_kv, G=g, D=d, M=max(16, rq), R=rq,
        PREC="ieee" if qkv.dtype == torch.float32 else "tf32", INTERPRET=interpret, FP8=fp8, VT=vt, SPLITS=n,
        **(launch or launch_for(kc.shape[2], fp8)))
    if n > 1:
        _split_attention_combine[(b * n_kv,)](part_o, part_ml, out, out.stride(0), out.stride(1), T=t, KV=n_kv, G=g, D=d,
                                     R=rq, SPLITS=n, SP=triton.next_power_of_2(n), num_warps=4)
    return out


_OPS: dict = {}
_SCHEMA = ("(Tensor qkv, Tensor qn, Tensor kn, Tensor cos, Tensor sin, Tensor pos, Tensor(a!) kc, Tensor(b!) vc, "
           "Tensor(c!)? ks, Tensor(d!)? vs, int n_heads, int n_kv, float eps) -> Tensor")


def opaque(fn):
    """A decode-attention function (decode_attention's arguments and result) as a torch custom op: a compiled
    region calls it as one opaque call, its Triton kernels launched by Triton itself as outside a region, not
    recompiled by inductor as a user-defined kernel (the question of docs/PERFORMANCE.md: the launch timed at
    ~258 us inside the step, 176 us alone). The cache arguments are declared mutated."""
    if fn.__name__ not in _OPS:
        op = torch.library.custom_op(f"tts_appliance::{fn.__name__}", mutates_args=("kc", "vc", "ks", "vs"),
                                     schema=_SCHEMA)(
            lambda qkv, qn, kn, cos, sin, pos, kc, vc, ks, vs, n_heads, n_kv, eps:
                fn(qkv, qn, kn, cos, sin, pos, kc, vc, n_heads, n_kv, eps, ks, vs))
        op.register_fake(lambda qkv, qn, kn, cos, sin, pos, kc, vc, ks, vs, n_heads, n_kv, eps:
                         qkv.new_empty(qkv.shape[0], qkv.shape[1], n_heads * kc.shape[-1]))
        _OPS[fn.__name__] = lambda qkv, qn, kn, cos, sin, pos, kc, vc, n_heads, n_kv, eps, ks=None, vs=None: \
            op(qkv, qn, kn, cos, sin, pos, kc, vc, ks, vs, n_heads, n_kv, eps)
    return _OPS[fn.__name__]
