"""The static key/value cache of a decoder stack, in the model's dtype or as float8 with a scale per vector.

An fp8 cache (the talker's, `runtime.kv_cache: fp8`) stores each written key or value vector `[D]` as
float8 e4m3 (`q`) with one float32 scale `s` per (layer, row, key/value head, position):

    s = max(amax(|x|) / 448, FP8_EPS)        (448: e4m3's largest finite value; a zero vector gets FP8_EPS)
    q = e4m3(clamp(x / s, -448, 448))        (round to nearest even)
    x ~ q * s                                (every e4m3 value is exact in bf16, fp16 and fp32)

so the vector's largest element lands on 448 and the relative error of each element is at most 2^-4 (three
mantissa bits) above e4m3's subnormal range. The math is done in fp32 on the value the model-dtype cache would
have stored. The Triton decode kernel (engines.runtime.attention) quantizes the same way where it writes and
folds the scales into its scores and weights where it reads; here is the torch form: `write` and `read`.

An allocated fp8 cache stores its values with the positions of each (row, head, element) contiguous (the
storage is `[.., D, S]`, the tensors are its transposed views `[.., S, D]`, so every caller indexes them as
the keys): the tensor cores take the weighted sum's float8 operand in whole words only along the positions
(the keys' dot runs along the vector, which they keep contiguous).
"""
from __future__ import annotations

import functools
import math
import mmap
from dataclasses import dataclass, field
from typing import Optional

import torch

FP8_MAX = 448.0  # largest finite float8 e4m3fn value
FP8_EPS = 2.0 ** -126  # the smallest scale (a zero vector's): fp32's smallest normal, never flushed to zero
SCALE_DTYPE = torch.float32
FP8 = getattr(torch, "float8_e4m3fn", None)  # None: a torch without float8


@functools.lru_cache(maxsize=None)
def _cpu_ops_take_fp8() -> bool:
    """Whether this torch's CPU ops take float8: the casts, indexed writes and copies an fp8 cache uses."""
    try:
        c = torch.zeros(1, 1, 2, 2, dtype=FP8)
        c[torch.zeros(1, 1, dtype=torch.long), :, torch.ones(1, 1, dtype=torch.long)] = torch.ones(1, 1, 1, 2).to(c.dtype)
        c[:, :, :1].copy_(c[:, :, 1:])
        c[:, :, 1:].zero_()
        return bool(c.float().sum() == 2)
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def fp8_available(device: torch.device) -> bool:
    """Whether an fp8 cache can run on `device`: torch with float8 e4m3 and, on the CPU, ops that take it (the
    torch form); on CUDA an NVIDIA GPU of compute capability 8.9 or later (Ada, Hopper: float8 conversions in
    Triton, for the kernel and the compiled regions) with the triton package."""
    if FP8 is None:
        return False
    if device.type == "cpu":
        return _cpu_ops_take_fp8()
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Vectors x `[..., D]` -> (q `[..., D]` float8 e4m3, scales `[...]` float32): see the module doc."""
    xf = x.float()
    amax = xf.abs().amax(-1)  # [...]
    # a true division, as the kernels' div_rn: CUDA divides by a Python number as a product with its reciprocal,
    # which differs in the last bit (seen on an H100: the kernel's and this form's scales were not equal)
    s = (amax / torch.full_like(amax, FP8_MAX)).clamp_min(FP8_EPS)  # [...]
    return (xf / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), s


def dequantize(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float8 vectors q `[..., D]` with their scales s `[...]` -> `[..., D]` in dtype."""
    return (q.float() * s[..., None]).to(dtype)


def write(cache: torch.Tensor, scale: Optional[torch.Tensor], rows: torch.Tensor, pos: torch.Tensor,
          x: torch.Tensor) -> None:
    """cache `[B, KV, S, D]` at (rows, pos) `[B, T]` <- x `[B, T, KV, D]`; with a scale tensor `[B, KV, S]` (an
    fp8 cache) x is quantized and its scales stored beside it."""
    if scale is None:
        cache[rows, :, pos] = x
        return
    q, s = quantize(x)
    cache[rows, :, pos] = q
    scale[rows, :, pos] = s


def read(cache: torch.Tensor, scale: Optional[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The cache's values `[B, KV, S, D]` in dtype: itself, or an fp8 cache dequantized (a copy)."""
    return cache if scale is None else dequantize(cache, scale, dtype)


@dataclass
class KVCache:
    """Static per-layer key/value buffers: k, v `[L][B, kv_heads, S, D]`. An allocated cache keeps every
    layer in one tensor each for keys and values (`all_k`, `all_v` `[L, B, kv_heads, S, D]`, the layers
    views of them), so a request's rows move across all layers in one copy (`copy_row`). An fp8 cache also
    has the scales of its vectors: k_scale, v_scale `[L][B, kv_heads, S]` (all_k_scale, all_v_scale)."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    all_k: Optional[torch.Tensor] = None
    all_v: Optional[torch.Tensor] = None
    k_scale: Optional[list[torch.Tensor]] = None
    v_scale: Optional[list[torch.Tensor]] = None
    all_k_scale: Optional[torch.Tensor] = None
    all_v_scale: Optional[torch.Tensor] = None
    maps: list = field(default_factory=list)  # a lazy cache's anonymous memory maps (all_k's, all_v's)

    @staticmethod
    def allocate(cfg, batch: int, max_len: int, device, dtype, fp8: bool = False, lazy: bool = False) -> "KVCache":
        """Zeroed buffers for `cfg`'s stack (a DecoderStackConfig); `fp8`: float8 e4m3 values with scales.
        `lazy` (CPU, model dtype): the buffers are anonymous memory maps, so memory is taken only where
        positions are written, and `clear` hands cleared pages back (a CPU cache of many slots of the full
        context holds only what its requests use)."""
        shape = (cfg.num_hidden_layers, batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
        kind = FP8 if fp8 else dtype
        if lazy and not fp8 and torch.device(device).type == "cpu":
            (k, mk), (v, mv) = _mapped_zeros(shape, dtype), _mapped_zeros(shape, dtype)
            return KVCache(list(k.unbind(0)), list(v.unbind(0)), k, v, maps=[mk, mv])
        k = torch.zeros(shape, device=device, dtype=kind)
        if not fp8:
            v = torch.zeros(shape, device=device, dtype=kind)
            return KVCache(list(k.unbind(0)), list(v.unbind(0)), k, v)
        # the values' storage is [L, B, KV, D, S] (each vector's elements a position apart), seen as [L, B, KV, S, D]:
        # the attention kernels read a block of positions of one element as whole words (module doc)
        v = torch.zeros(shape[:3] + shape[:2:-1], device=device, dtype=kind).transpose(3, 4)
        ks, vs = (torch.zeros(shape[:-1], device=device, dtype=SCALE_DTYPE) for _ in range(2))  # [L, B, KV, S]
        return KVCache(list(k.unbind(0)), list(v.unbind(0)), k, v, list(ks.unbind(0)), list(vs.unbind(0)), ks, vs)

    @property
    def fp8(self) -> bool:
        return self.k_scale is not None

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    def layer(self, i: int) -> tuple:
        """(k, v, k_scale, v_scale) of layer i (the scales None for a cache in the model's dtype)."""
        return self.k[i], self.v[i], *((self.k_scale[i], self.v_scale[i]) if self.fp8 else (None, None))

    def rows(self, start: int, stop: int, length: Optional[int] = None) -> "KVCache":
        """A view of rows [start, stop) (and positions [0, length)) of every layer, scales included."""
        cut = lambda ts: None if ts is None else [t[start:stop, :, :length] for t in ts]  # noqa: E731
        return KVCache(cut(self.k), cut(self.v), k_scale=cut(self.k_scale), v_scale=cut(self.v_scale))

    def copy_row(self, dst: int, src_cache: "KVCache", src: int, length: int, clear_rest: bool = False) -> None:
        """Row `dst` of every layer = the first `length` positions of row `src` of `src_cache` (which may be
        this cache), scales too; with `clear_rest` the positions after them are zeroed. Both caches as
        `allocate` made them, of one kind."""
        assert self.fp8 == src_cache.fp8, "copy_row between an fp8 and a model-dtype cache"
        pairs = [(self.all_k, src_cache.all_k), (self.all_v, src_cache.all_v)]
        if self.fp8:
            pairs += [(self.all_k_scale, src_cache.all_k_scale), (self.all_v_scale, src_cache.all_v_scale)]
        for a, b in pairs:
            a[:, dst, :, :length].copy_(b[:, src, :, :length])
        if clear_rest:
            self.clear(dst, length)

    def clear(self, row: int, start: int = 0) -> None:
        """Zero positions [start, max_len) of `row` in every layer (scales too). A lazy cache hands the whole
        pages among them back to the system (they read as zeros and take no memory until written again)."""
        tensors = [self.all_k, self.all_v] + ([self.all_k_scale, self.all_v_scale] if self.fp8 else [])
        if not self.maps or not _release_rows(tensors, self.maps, row, start):
            for t in tensors:
                t[:, row, :, start:].zero_()


PAGE = mmap.PAGESIZE


def _mapped_zeros(shape: tuple, dtype: torch.dtype) -> tuple[torch.Tensor, mmap.mmap]:
    """A zeroed CPU tensor over anonymous memory of its own (taken page by page as it is written)."""
    n = math.prod(shape)
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    m = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(m, dtype=dtype, count=n).view(shape), m


def _release_rows(tensors: list, maps: list, row: int, start: int) -> bool:
    """Zero positions [start, S) of `row` of each [L, B, KV, S, D] tensor over its own map: the partial pages
    by writing zeros, the whole pages by handing them back (madvise DONTNEED: they read as zeros again).
    False (nothing done) when a position's bytes do not tile a page, or a (layer, row, head)'s do not fill
    whole pages: the caller writes the zeros then."""
    done = []
    for t, m in zip(tensors, maps):
        L, B, KV, S, D = t.shape
        per_pos = D * t.element_size()
        if PAGE % per_pos or (S * per_pos) % PAGE:
            return False
        done.append((t, m, L, B, KV, S, per_pos))
    for t, m, L, B, KV, S, per_pos in done:
        first = min(S, -(-start * per_pos // PAGE) * PAGE // per_pos)  # the first position on a page of its own
        if first > start:
            t[:, row, :, start:first].zero_()
        if first >= S:
            continue
        span = (S - first) * per_pos
        for layer in range(L):
            base = ((layer * B + row) * KV * S) * per_pos
            if first == 0:  # the whole (layer, row) block: one call
                m.madvise(mmap.MADV_DONTNEED, base, KV * S * per_pos)
                continue
            for h in range(KV):
                m.madvise(mmap.MADV_DONTNEED, base + (h * S + first) * per_pos, span)
    return True

