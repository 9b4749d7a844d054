"""Decode attention over the static cache as one Triton kernel (the device path of the fast step).

A decoder layer's attention at decode time (one or two new tokens per row) took ~8 kernels in the
compiled layer: q/k RMSNorm and RoPE, two cache writes, the scores matmul over the whole cache bucket,
the mask and softmax, the weighted sum. `decode_attention` does all of it in one launch per layer, one
program per (row, key/value head):

- the row's new keys and values are normed, rotated and written to the cache at their positions;
- the queries of the head's group (tokens x query heads, grouped-query attention) are normed, rotated and
  laid out as one tile of at least 16 rows, so scores and weighted sums run on the tensor cores;
- the scores, an online softmax and the weighted sum run over blocks of cache slots up to each query's
  own position only (the old path read the whole length bucket and masked the rest).

Numbers are fp32 inside; values are rounded to the model's dtype where the reference rounds them (the
normed q/k before the weight, the rotated q/k, the output). `reference_attention` is the same
computation in torch (the compiled layer's form), used by the tests and as the path without Triton.

An fp8 cache (engines.model.kv_cache; scales ks, vs `[B, KV, S]` given): the new keys and values are
quantized where they are written (amax / 448 scale per vector), and read without a dequantized copy: the
float8 tiles are widened in registers, each slot's key scale multiplies its scores and each slot's value
scale its softmax weights before the weighted sum. The torch form dequantizes the cache explicitly. An fp8
cache keeps its values with their positions contiguous (`v_layout`); the kernels read either layout.

Long contexts split over several programs per (row, key/value head): engines.runtime.attention_split
(`runtime.attn_split`).
"""
from __future__ import annotations

import os

import torch

from engines.model import kv_cache
from engines.model.kv_cache import FP8_EPS, FP8_MAX

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU builds: the layer keeps its torch form
    triton = None


def available(device: torch.device) -> bool:
    """Whether the kernel can run on `device`: an NVIDIA GPU of compute capability 8.0 or later (Ampere on:
    bf16 tensor-core tiles) with Triton, or any device under TRITON_INTERPRET=1 (the tests' interpreter)."""
    if triton is None:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


def reference_attention(qkv, qn, kn, cos_tab, sin_tab, pos, kc, vc, n_heads: int, n_kv: int, eps: float,
                        ks=None, vs=None):
    """The layer's attention in torch: qkv `[B, T, (H + 2 KV) D]` at positions `pos` `[B, T]`; writes the
    new keys/values into kc, vc `[B, KV, S, D]` (an fp8 cache: quantized, their scales into ks, vs
    `[B, KV, S]`); returns `[B, T, H D]`."""
    b, t, _ = qkv.shape
    d = kc.shape[-1]
    g, s = n_heads // n_kv, kc.shape[2]
    q, k, v = qkv.split((n_heads * d, n_kv * d, n_kv * d), dim=-1)
    cos, sin = cos_tab[pos].to(qkv.dtype)[:, :, None], sin_tab[pos].to(qkv.dtype)[:, :, None]
    q = rope(rms(q.reshape(b, t, n_heads, d), qn, eps), cos, sin)
    k = rope(rms(k.reshape(b, t, n_kv, d), kn, eps), cos, sin)
    rows = torch.arange(b, device=qkv.device)[:, None].expand(b, t)
    kv_cache.write(kc, ks, rows, pos, k)  # [B, T, KV, D] at (rows, pos)
    kv_cache.write(vc, vs, rows, pos, v.reshape(b, t, n_kv, d))
    kc, vc = kv_cache.read(kc, ks, qkv.dtype), kv_cache.read(vc, vs, qkv.dtype)  # [B, KV, S, D]
    qg = q.reshape(b, t, n_kv, g, d).permute(0, 2, 1, 3, 4).reshape(b, n_kv, t * g, d)
    scores = torch.matmul(qg, kc.transpose(2, 3)).float().view(b, n_kv, t, g, s) * d ** -0.5
    hidden = torch.arange(s, device=qkv.device)[None, None, :] > pos[:, :, None]  # [B, T, S]
    scores = scores.masked_fill(hidden[:, None, :, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1).to(qkv.dtype).view(b, n_kv, t * g, s)
    return torch.matmul(p, vc).view(b, n_kv, t, g, d).permute(0, 2, 1, 3, 4).reshape(b, t, n_heads * d)


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


if triton is not None:
    @triton.jit
    def _normed_rotated(ptr, offs, d, rot, sign, w, w_rot, cos, sin, mask, eps: tl.constexpr, D: tl.constexpr):
        """RMSNorm (weight w) then RoPE of the vectors at ptr + offs (`[..., D]` offsets): fp32, rounded
        to the stored dtype where the reference rounds; masked-off vectors come out as zeros."""
        x = tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)
        xr = tl.load(ptr + offs - d + rot, mask=mask, other=0.0).to(tl.float32)  # rotate-half partners
        r = tl.math.rsqrt((tl.sum(x * x, axis=-1, keep_dims=True) / D + eps).to(tl.float32))
        dt = ptr.dtype.element_ty
        n = w * (x * r).to(dt).to(tl.float32)
        nr = w_rot * (xr * r).to(dt).to(tl.float32)
        n = n.to(dt).to(tl.float32)
        nr = nr.to(dt).to(tl.float32)
        a = (n * cos).to(dt).to(tl.float32)
        c = (sign * nr * sin).to(dt).to(tl.float32)
        return (a + c).to(dt)

    _FP8_MAX = tl.constexpr(FP8_MAX)
    _FP8_EPS = tl.constexpr(FP8_EPS)

    @triton.jit
    def _e4m3_round(x):
        """x (fp32, |x| <= 448) rounded to the nearest float8 e4m3 value (ties to even), in fp32 arithmetic:
        the interpreter's own float8 conversion truncates ties and drops mantissa carries (Triton 3.x); on
        the GPU the conversion instruction rounds this way by itself."""
        bits = x.to(tl.int32, bitcast=True)
        e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)  # e4m3's exponent of x (-6 and below: subnormal)
        c = ((e + 146) << 23).to(tl.float32, bitcast=True) * 3.0  # 1.5 * 2^23 * ulp, ulp = 2^(e - 3)
        r = ((tl.abs(x) + c) - c).to(tl.int32, bitcast=True) | (bits & -2147483648)  # the sign back (-0 too)
        return r.to(tl.float32, bitcast=True)

    @triton.jit
    def _store_fp8(ptr, scale_ptr, x, INTERPRET: tl.constexpr):
        """The vector x `[D]` as float8 e4m3 at ptr and its scale at scale_ptr: engines.model.kv_cache.quantize
        (same fp32 operations, correctly rounded divisions)."""
        x = x.to(tl.float32)
        s = tl.maximum(tl.math.div_rn(tl.max(tl.abs(x), axis=0), _FP8_MAX), _FP8_EPS)
        y = tl.minimum(tl.maximum(tl.math.div_rn(x, s), -_FP8_MAX), _FP8_MAX)
        if INTERPRET:
            y = _e4m3_round(y)
        tl.store(ptr, y.to(ptr.dtype.element_ty))
        tl.store(scale_ptr, s)

    @triton.jit
    def _v_offsets(slot, d, s_vs, s_vd, VT: tl.constexpr):
        """Offsets of values (slot, d) in a value cache of either layout (`v_layout`)."""
        if VT:
            return slot + d * s_vd
        return slot * s_vs + d

    @triton.jit
    def _decode_attention_kernel(qkv, qn_w, kn_w, cos_tab, sin_tab, pos, kc, vc, ks, vs, out,
                                 s_qb, s_qt, s_pb, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_vd, s_sb, s_sh, s_ob, s_ot,
                                 eps: tl.constexpr, scale: tl.constexpr,
                                 T: tl.constexpr, H: tl.constexpr, KV: tl.constexpr, G: tl.constexpr,
                                 D: tl.constexpr, M: tl.constexpr, BLOCK_S: tl.constexpr, PREC: tl.constexpr,
                                 INTERPRET: tl.constexpr, FP8: tl.constexpr, VT: tl.constexpr):
        attend(qkv, qn_w, kn_w, cos_tab, sin_tab, pos, kc, vc, out, tl.program_id(0), tl.program_id(1),
               s_qb, s_qt, s_pb, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ob, s_ot, eps, scale, T, H, KV, G, D, M,
               BLOCK_S, PREC, INTERPRET, ks, vs, s_sb, s_sh, FP8, s_vd, VT)

    @triton.jit
    def attend(qkv, qn_w, kn_w, cos_tab, sin_tab, pos, kc, vc, out, b, h,
               s_qb, s_qt, s_pb, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ob, s_ot,
               eps: tl.constexpr, scale: tl.constexpr, T: tl.constexpr, H: tl.constexpr, KV: tl.constexpr,
               G: tl.constexpr, D: tl.constexpr, M: tl.constexpr, BLOCK_S: tl.constexpr, PREC: tl.constexpr,
               INTERPRET: tl.constexpr, ks, vs, s_sb, s_sh, FP8: tl.constexpr, s_vd=1, VT: tl.constexpr = False):
        """Row b, key/value head h of the decode attention (the kernel's one program; the layer kernel of
        engines.runtime.layer_kernel calls it from its attention phase). FP8: kc, vc hold float8 e4m3 and
        ks, vs their scales (strides s_sb, s_sh; positions contiguous); otherwise ks, vs are unused. VT: the
        values' positions are contiguous (an fp8 cache's layout, `v_layout`), s_vd their dimension's stride;
        otherwise the dimension is contiguous and s_vs the positions' stride."""
        d = tl.arange(0, D)
        rot = tl.where(d < D // 2, d + D // 2, d - D // 2)
        sign = tl.where(d < D // 2, -1.0, 1.0)
        kw = tl.load(kn_w + d).to(tl.float32)
        kw_rot = tl.load(kn_w + rot).to(tl.float32)
        qw = tl.load(qn_w + d).to(tl.float32)
        qw_rot = tl.load(qn_w + rot).to(tl.float32)
        dt = qkv.dtype.element_ty
        # the new keys and values of this row and head go to the cache first
        for t in tl.static_range(T):
            p = tl.load(pos + b * s_pb + t)
            cos = tl.load(cos_tab + p * D + d).to(dt).to(tl.float32)
            sin = tl.load(sin_tab + p * D + d).to(dt).to(tl.float32)
            row = qkv + b * s_qb + t * s_qt
            k = _normed_rotated(row, (H + h) * D + d, d, rot, sign, kw, kw_rot, cos, sin, d < D, eps, D)
            v = tl.load(row + (H + KV + h) * D + d)
            if FP8:
                _store_fp8(kc + b * s_kb + h * s_kh + p * s_ks + d, ks + b * s_sb + h * s_sh + p, k, INTERPRET)
                _store_fp8(vc + b * s_vb + h * s_vh + _v_offsets(p, d, s_vs, s_vd, VT), vs + b * s_sb + h * s_sh + p, v,
                           INTERPRET)
            else:
                tl.store(kc + b * s_kb + h * s_kh + p * s_ks + d, k)
                tl.store(vc + b * s_vb + h * s_vh + _v_offsets(p, d, s_vs, s_vd, VT), v)
        tl.debug_barrier()  # the writes above are read below by other threads of this program
        # every query of the group (T tokens x G heads) is one row of an M-row tile for the tensor cores
        i = tl.arange(0, M)
        ti, gi, real = i // G, i % G, i < T * G
        pi = tl.load(pos + b * s_pb + ti, mask=real, other=0)  # each query's own position
        last = tl.max(pi, axis=0)
        cos = tl.load(cos_tab + pi[:, None] * D + d[None, :]).to(dt).to(tl.float32)
        sin = tl.load(sin_tab + pi[:, None] * D + d[None, :]).to(dt).to(tl.float32)
        q = _normed_rotated(qkv + b * s_qb, ti[:, None] * s_qt + (h * G + gi[:, None]) * D + d[None, :], d[None, :],
                            rot[None, :], sign[None, :], qw[None, :], qw_rot[None, :], cos, sin, real[:, None],
                            eps, D)  # [M, D]
        m = tl.full((M,), float("-inf"), tl.float32)
        l = tl.zeros((M,), tl.float32)
        acc = tl.zeros((M, D), tl.float32)
        s = tl.arange(0, BLOCK_S)
        for start in range(0, last + 1, BLOCK_S):  # slots 0..p of each query: its past and itself
            slot = start + s
            if VT:  # whole 16-slot groups (a mask constant over them: 16-byte loads of the position-contiguous
                inside = slot < tl.minimum(tl.cdiv(last + 1, 16) * 16, s_vd)  # values); past `last`: masked below
            else:
                inside = slot <= last
            kblk = tl.load(kc + b * s_kb + h * s_kh + slot[:, None] * s_ks + d[None, :], mask=inside[:, None],
                           other=0.0)  # [S, D]
            vblk = tl.load(vc + b * s_vb + h * s_vh + _v_offsets(slot[:, None], d[None, :], s_vs, s_vd, VT),
                           mask=inside[:, None], other=0.0)
            if FP8:  # float8 tiles widened in registers (exact); the scales of their slots [S]
                kblk, vblk = kblk.to(dt), vblk.to(dt)
                k_sc = tl.load(ks + b * s_sb + h * s_sh + slot, mask=inside, other=0.0)
                v_sc = tl.load(vs + b * s_sb + h * s_sh + slot, mask=inside, other=0.0)
            if INTERPRET:  # the interpreter multiplies no bf16 tiles (numpy has no bf16)
                kblk, vblk = kblk.to(tl.float32), vblk.to(tl.float32)
            sc = tl.dot(q.to(kblk.dtype), tl.trans(kblk), input_precision=PREC)  # [M, S]
            if FP8:
                sc = sc * k_sc[None, :]
            sc = tl.where(slot[None, :] <= pi[:, None], sc * scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(sc, axis=1))
            alpha = tl.exp(m - m_new)
            e = tl.exp(sc - m_new[:, None])
            l = l * alpha + tl.sum(e, axis=1)
            w = e
            if FP8:
                w = e * v_sc[None, :]
            acc = acc * alpha[:, None] + tl.dot(w.to(dt).to(vblk.dtype), vblk, input_precision=PREC)
            m = m_new
        o = acc / l[:, None]
        tl.store(out + b * s_ob + ti[:, None] * s_ot + (h * G + gi[:, None]) * D + d[None, :], o.to(dt),
                 mask=real[:, None])


def v_layout(vc) -> tuple[int, int, bool]:
    """(position stride, dimension stride, positions contiguous) of a value cache `[B, KV, S, D]`: the model-dtype
    cache keeps each vector contiguous; an fp8 cache keeps each (row, head)'s positions contiguous (its storage
    is `[.., D, S]`, engines.model.kv_cache), so the float8 values reach the tensor cores' operand loads in
    whole words (docs/PERFORMANCE.md)."""
    if vc.stride(3) == 1:
        return vc.stride(2), 1, False
    assert vc.stride(2) == 1, "a value cache with neither its positions nor its dimension contiguous"
    return 1, vc.stride(3), True


def scale_strides(kc, ks, vs) -> tuple:
    """(ks, vs, row stride, head stride) of an fp8 cache's scales `[B, KV, S]` as the kernels take them (one
    layout for both, positions contiguous); for a model-dtype cache (ks None) the cache itself, unused."""
    if ks is None:
        return kc, kc, 0, 0
    assert ks.stride() == vs.stride() and ks.stride(2) == 1, "key and value scales of one layout, positions contiguous"
    return ks, vs, ks.stride(0), ks.stride(1)


SMALL_CACHE = 32  # caches of at most this many slots per row (the code predictor's 17) take the small launch


def launch_for(slots: int) -> dict:
    """The kernel's block of cache slots and its warps for a cache of `slots` positions per row. A cache as
    short as the code predictor's is read in one or two blocks of 16 by one warp: 2.6x faster than blocks of
    64 by four warps at 256 rows on an H100 (12 vs 31 us a call); at book contexts (450 positions) the two
    are alike, and the default stays (benchmarks.attention_tune; docs/PERFORMANCE.md)."""
    if slots <= SMALL_CACHE:
        return {"BLOCK_S": 16, "num_warps": 1, "num_stages": 1}
    return {"BLOCK_S": 64, "num_warps": 4}


def decode_attention(qkv, qn, kn, cos_tab, sin_tab, pos, kc, vc, n_heads: int, n_kv: int, eps: float,
                     ks=None, vs=None, launch: dict | None = None):
    """`reference_attention` as one kernel launch (see the module doc). qkv `[B, T, (H + 2 KV) D]` with a
    contiguous last dimension, pos `[B, T]` int64, kc/vc `[B, KV, S, D]` views with a contiguous last
    dimension (row slices of the slot cache; vc may instead have its positions contiguous, `v_layout`), cos/sin
    tables `[P, D]` fp32 contiguous; an fp8 cache's scales
    ks, vs `[B, KV, S]` (row slices too). `launch`: BLOCK_S / num_warps / num_stages in place of `launch_for`'s
    (benchmarks.attention_tune sweeps them)."""
    b, t, _ = qkv.shape
    d = kc.shape[-1]
    out = torch.empty(b, t, n_heads * d, device=qkv.device, dtype=qkv.dtype)
    k_sc, v_sc, s_sb, s_sh = scale_strides(kc, ks, vs)
    s_vs, s_vd, vt = v_layout(vc)
    _decode_attention_kernel[(b, n_kv)](
        qkv, qn, kn, cos_tab, sin_tab, pos, kc, vc, k_sc, v_sc, out,
        qkv.stride(0), qkv.stride(1), pos.stride(0), kc.stride(0), kc.stride(1), kc.stride(2),
        vc.stride(0), vc.stride(1), s_vs, s_vd, s_sb, s_sh, out.stride(0), out.stride(1),
        eps, d ** -0.5, T=t, H=n_heads, KV=n_kv, G=n_heads // n_kv, D=d, M=max(16, triton.next_power_of_2(t * n_heads // n_kv)),
        PREC="ieee" if qkv.dtype == torch.float32 else "tf32", INTERPRET=qkv.device.type != "cuda",
        FP8=ks is not None, VT=vt, **(launch or launch_for(kc.shape[2])))
    return out

