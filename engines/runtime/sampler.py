"""The draw of the fast step as one Triton kernel: top-k, top-p and the race without sorting the vocabulary.

`engines.model.sampling.draw` sorts the whole vocabulary per row (one radix sort per draw, 16 draws per
frame) to find the top-k threshold and the top-p cut, then softmaxes, cumsums and scatters back: about
ten kernels per draw, ~20 us each sort at one row. `device_draw` is one launch, one program per row,
the row's logits in registers:

- the k-th largest score is found by a digit-at-a-time search over the scores' order-preserving 32-bit
  keys (16 counting passes of 2-bit digits over the row, no sort: on an H100 12.5 us per draw at one row,
  against 14.8 us for 1-bit and 27.9 us for 4-bit digits: benchmarks/draw_kernel.py);
  every id scoring at least that much is kept (ties with the k-th are kept, as `draw` keeps them);
- top-p (only for rows with top_p < 1) is a second bitwise search: the smallest score whose better ids
  hold less than top_p of the kept probability; ids from there up are kept;
- the draw is `draw`'s exponential race (argmax of p / E, E = -log u with the same counter-based uniforms),
  over the kept ids; greedy rows take the argmax of the logits.

The kept set is `draw`'s except where `draw` cuts a group of equal scores at the top-p boundary (it keeps
such a group whole) or drops a far tail id whose mass before it rounds to 1.0 with top_p = 1 (it keeps
it); the race uses the same uniforms, so codes agree with `draw` except at float near-ties. Same seed,
same codes whatever the batch: each row's program reads only its own row.
"""
from __future__ import annotations

import torch

from engines.model.sampling import SamplingTensors

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU builds: the step keeps `draw`
    triton = None


if triton is not None:
    @triton.jit
    def _mix32(x):
        """engines.model.sampling._mix32 on uint32 (wrapping products are its masked int64 ones)."""
        x = x ^ (x >> 16)
        x = x * tl.full(x.shape, 0x7FEB352D, tl.uint32)
        x = x ^ (x >> 15)
        x = x * tl.full(x.shape, 0x6A09E667, tl.uint32)
        x = x ^ (x >> 16)
        x = x * tl.full(x.shape, 0x2C1B3C6D, tl.uint32)
        return x ^ (x >> 15)

    @triton.jit
    def _u32(x):
        """The low 32 bits of an int64 as uint32 (what `& 0xFFFFFFFF` keeps)."""
        return (x & 0xFFFFFFFF).to(tl.uint32)

    @triton.jit
    def _draw_kernel(logits, s_l, temp, topk, topp, do_sample, seed, gen_step, out, offset, V,
                     BLOCK: tl.constexpr, DIGIT: tl.constexpr):
        b = tl.program_id(0)
        i = tl.arange(0, BLOCK)
        inside = i < V
        x = tl.load(logits + b * s_l + i, mask=inside, other=float("-inf")).to(tl.float32)
        code = tl.argmax(x, axis=0, tie_break_left=True)
        if tl.load(do_sample + b) != 0:
            s = x / tl.load(temp + b)
            k = tl.load(topk + b)
            k = tl.where((k > 0) & (k < V), k, V).to(tl.int32)
            # order-preserving keys: larger score, larger key (negative floats have their bits flipped)
            bits = s.to(tl.int32, bitcast=True)
            key = tl.where(bits < 0, ~bits, bits | -2147483648).to(tl.uint32, bitcast=True)
            key = tl.where(inside, key, tl.zeros_like(key))
            # the k-th largest key, DIGIT bits at a time from the top: the largest digit whose candidate
            # still has k keys at or above it (one count per digit value, all in one reduction)
            kth = tl.full((), 0, tl.uint32)
            digits = tl.arange(0, 1 << DIGIT).to(tl.uint32)
            for step in tl.static_range(32 // DIGIT - 1, -1, -1):
                cand = kth | (digits << (step * DIGIT))  # [2^DIGIT]
                n = tl.sum(((key[None, :] >= cand[:, None]) & inside[None, :]).to(tl.int32), axis=1)
                kth = kth | (tl.max(tl.where(n >= k, digits, 0), axis=0) << (step * DIGIT))
            keep = inside & (key >= kth)
            m = tl.max(tl.where(keep, s, float("-inf")), axis=0)
            e = tl.where(keep, tl.exp(s - m), 0.0)
            p_top = tl.load(topp + b)
            if p_top < 1.0:
                p = e / tl.sum(e, axis=0)
                cut = tl.full((), 0, tl.uint32)  # the largest key whose better ids hold >= top_p of the mass
                for bit in tl.static_range(31, -1, -1):
                    trial = cut | tl.full((), 1 << bit, tl.uint32)
                    mass = tl.sum(tl.where(keep & (key > trial), p, 0.0), axis=0)
                    cut = tl.where(mass >= p_top, trial, cut)
                keep = keep & ((key > cut) | (s == m))  # the best id always stays
                e = tl.where(keep, e, 0.0)
            # the race with engines.model.sampling.uniform_at's uniforms
            counter = tl.load(gen_step + b) * 16 + offset
            rk = _mix32(_mix32(_u32(tl.load(seed + b))) ^ _mix32(_u32(counter + 0x5BD1E995)))
            h = _mix32(rk * tl.full((), 0x9E37, tl.uint32) + i.to(tl.uint32) * tl.full((), 0x3C6EF372, tl.uint32)
                       + tl.full((), 0x1B873593, tl.uint32))
            u = ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
            race = tl.where(keep, e / -tl.log(u), -1.0)
            code = tl.argmax(race, axis=0, tie_break_left=True)
        tl.store(out + b, code.to(tl.int64))


def device_draw(logits: torch.Tensor, st: SamplingTensors, seed: torch.Tensor, gen_step: torch.Tensor,
                offset: int, digit: int = 2) -> torch.Tensor:
    """`draw(logits, st, seed, gen_step * 16 + offset)` as one kernel launch (see the module doc).
    logits `[B, V]` with a contiguous last dimension; returns `[B]` int64. `digit`: bits per counting pass
    of the top-k search (1, 2, 4 or 8; benchmarks/draw_kernel.py times them, 8 is far the slowest)."""
    b, v = logits.shape
    out = torch.empty(b, dtype=torch.int64, device=logits.device)
    block = triton.next_power_of_2(v)
    _draw_kernel[(b,)](logits, logits.stride(0), st.temperature, st.top_k, st.top_p, st.do_sample, seed, gen_step,
                       out, offset, v, BLOCK=block, DIGIT=digit, num_warps=8 if block >= 4096 else 4)
    return out
