"""int8 weights for the decoder layers on the CPU (`runtime.linear: int8`): lossy, a setting.

Each linear keeps its weight as int8 with a float32 scale per output channel, prepacked for torch's quantized
CPU matmul (fbgemm), and multiplies int8 activations with it: a quarter of fp32's bytes read, and at many rows
the integer kernels do more per cycle than fp32 FMA.

Activations are quantized per row: each row is divided by its largest magnitude before the quantized
matmul and multiplied back after, and one fixed row spanning [-1, 1] is appended, so the kernel's
per-tensor range is always the same. A row's result thus depends on that row only (same seed, same codes
at any batch size or batch company, as the fp32 path), and the quantized layers of the reference modules
(engines.runtime.linears.pack_modules) compute exactly what the fused step computes. The activations' bits:
8 where the CPU adds u8 x s8 products in 32 bits (AVX-512 VNNI, AVX-VNNI), else 7 (`reduce_range`: AVX2's
kernel adds pairs of them in 16 bits, which full 8-bit activations could overflow).

`act_bits=16` (where the CPU has VNNI): each row goes in as two rows, its 8-bit value and the rest scaled
up, whose products are summed back: 16-bit activations at the cost of a second row (the weights are read
once for both), so only the weights' rounding is left. Measured, not offered: docs/PERFORMANCE.md.

Lossy: benchmarks/bf16_agreement.py measures its greedy agreement with fp32 (docs/PERFORMANCE.md).
"""
from __future__ import annotations

import functools
import logging
import warnings
from typing import Optional

import torch

log = logging.getLogger(__name__)

ENGINES = ("x86", "fbgemm")  # torch's quantized CPU backends that prepack for AVX2/AVX-512
REST_SCALE = 127.0  # act_bits 16: the second row is the first's rounding error times this (|rest| <= 1)


def unavailable_reason(device) -> Optional[str]:
    """Why int8 linears cannot run on `device` (None: they can)."""
    if torch.device(device).type != "cpu":
        return f"int8 linears run on the CPU only, not on {device}"
    engines = getattr(torch.backends.quantized, "supported_engines", [])
    if not any(e in engines for e in ENGINES):
        return f"this torch build has no quantized CPU backend (x86/fbgemm; it has {', '.join(engines) or 'none'})"
    if not hasattr(torch.ops.quantized, "linear_dynamic"):
        return "this torch build has no quantized.linear_dynamic"
    return None


@functools.lru_cache(maxsize=None)
def has_vnni() -> bool:
    """Whether the CPU adds u8 x s8 products in 32 bits (AVX-512 VNNI or AVX-VNNI): 8-bit activations are safe."""
    from engines.device.detect import cpu_flags

    return bool(cpu_flags() & {"avx512_vnni", "avx_vnni"})


def _engine() -> None:
    """Make the quantized backend one that prepacks for this CPU (x86, else fbgemm)."""
    q = torch.backends.quantized
    if q.engine not in ENGINES:
        q.engine = next(e for e in ENGINES if e in q.supported_engines)


def per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight `[out, in]` as int8 `[out, in]` (symmetric, -127..127) and its float32 scale per output channel."""
    scale = w.abs().amax(1).clamp_min(1e-12) / 127  # [out]
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


class Int8Weight:
    """A linear's weight `[out, in]` (and bias `[out]`) as int8 per output channel; `w(x)` = x @ W.T + b.

    Callable in place of a weight tensor through `engines.runtime.linears.linear(x, w, b)`. `act_bits`: 8 (7
    without VNNI) or 16 (VNNI only: two rows per row, see the module's docstring)."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, act_bits: int = 8):
        _engine()
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        self.reduce_range = not has_vnni()
        if act_bits == 16 and self.reduce_range:
            raise ValueError("16-bit activations need a CPU with VNNI (the 7-bit kernel rounds its products)")
        self.act_bits = act_bits
        q, scale = per_channel(w)
        with warnings.catch_warnings():  # quantized tensors are deprecated in torch (unavailable_reason checks the op)
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
            qw = torch._make_per_channel_quantized_tensor(q, scale.double(), torch.zeros_like(scale, dtype=torch.long),
                                                          0)
            self.packed = torch.ops.quantized.linear_prepack(qw, None)
        self.bias = None if bias is None else bias.detach().float()
        self._range = torch.zeros(1, self.in_features)  # the fixed row: the kernel's range is always [-1, 1]
        self._range[0, 0], self._range[0, 1 % self.in_features] = -1.0, 1.0

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out_features, self.in_features))

    def _grid(self, xn: torch.Tensor) -> torch.Tensor:
        """`xn` (in [-1, 1]) on the kernel's activation grid over [-1, 1]: k / 127.5, k in [-127, 127] (8 bits)."""
        return torch.round(xn * 127.5).clamp_(-127, 127) / 127.5

    def __call__(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()  # [M, in]
        peak = rows.abs().amax(1, keepdim=True).clamp_min(1e-30)  # [M, 1]
        xn = rows / peak
        if self.act_bits == 16:  # [M, in] on the grid + [M, in] the rest, scaled up: both quantized exactly
            hi = self._grid(xn)
            m = rows.shape[0]
            y = torch.ops.quantized.linear_dynamic(torch.cat([hi, (xn - hi) * REST_SCALE, self._range]), self.packed,
                                                   False)
            y = y[:m] + y[m:2 * m] / REST_SCALE
        else:
            y = torch.ops.quantized.linear_dynamic(torch.cat([xn, self._range]), self.packed, self.reduce_range)[:-1]
        y = y * peak  # [M, out]
        for b in (self.bias, bias):
            if b is not None:
                y = y + b
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
