"""int8 weights for the decoder layers on the CPU (`runtime.linear: int8`): lossy, a setting.

A CPU decode step reads every weight of the talker once and the code predictor's 15 times per frame;
in fp32 that is ~6.6 GB a frame for the 0.6B model, and at a few rows the matmuls are bound by those
reads. Here each linear of the decoder layers keeps its weight as int8 with a float32 scale per output
channel, prepacked for the CPU's quantized matmul (fbgemm, AVX2), and multiplies int8 activations with it:
4x fewer bytes read, and at many rows the integer kernels do more per cycle than fp32 FMA.

Activations are quantized per row: each row is divided by its largest magnitude before the quantized
matmul and multiplied back after, and one fixed row spanning [-1, 1] is appended, so the kernel's
per-tensor range is always the same. A row's result thus depends on that row only (same seed, same codes
at any batch size or batch company, as the fp32 path), and the quantized layers of the reference modules
(`quantize_modules`) compute exactly what the fused step computes. 7-bit activations (`reduce_range`):
the AVX2 kernel adds pairs of u8 x s8 products in 16 bits, which full 8-bit activations could overflow.

Lossy: benchmarks/bf16_agreement.py measures its greedy agreement with fp32 (docs/PERFORMANCE.md).
"""
from __future__ import annotations

import logging
import warnings
from typing import Optional

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

ENGINES = ("x86", "fbgemm")  # torch's quantized CPU backends that prepack for AVX2/AVX-512


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


def _engine() -> None:
    """Make the quantized backend one that prepacks for this CPU (x86, else fbgemm)."""
    q = torch.backends.quantized
    if q.engine not in ENGINES:
        q.engine = next(e for e in ENGINES if e in q.supported_engines)


class Int8Weight:
    """A linear's weight `[out, in]` (and bias `[out]`) as int8 per output channel; `w(x)` = x @ W.T + b.

    Callable in place of a weight tensor through `linear(x, w, b)`."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
        _engine()
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        scale = w.abs().amax(1).clamp_min(1e-12) / 127  # [out]
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
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

    def __call__(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()  # [M, in]
        peak = rows.abs().amax(1, keepdim=True).clamp_min(1e-30)  # [M, 1]
        y = torch.ops.quantized.linear_dynamic(torch.cat([rows / peak, self._range]), self.packed, True)[:-1]
        y = y * peak  # [M, out]
        for b in (self.bias, bias):
            if b is not None:
                y = y + b
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def linear(x: torch.Tensor, w, b: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`F.linear` for a weight tensor, the int8 product for an `Int8Weight`."""
    return F.linear(x, w, b) if isinstance(w, torch.Tensor) else w(x, b)


def maybe_int8(w: torch.Tensor, on: bool):
    return Int8Weight(w) if on else w


class Int8Linear(torch.nn.Module):
    """An nn.Linear's int8 form (the reference modules of an int8 engine: `quantize_modules`)."""

    def __init__(self, lin: torch.nn.Linear):
        super().__init__()
        self.w = Int8Weight(lin.weight, lin.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w(x)


def quantize_modules(stack: torch.nn.Module) -> int:
    """Replace the linears of every decoder layer of `stack` (a DecoderStack) by their int8 form, in place:
    the slow reference path of the int8 step (parity tests, benchmarks). Returns how many were replaced."""
    n = 0
    for layer in stack.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, mod in list(parent.named_children()):
                if isinstance(mod, torch.nn.Linear):
                    setattr(parent, name, Int8Linear(mod))
                    n += 1
    return n


def linear_setting(setting: str, device, dtype: torch.dtype) -> tuple[str, str]:
    """`runtime.linear` decided: ("model" or "int8", why). auto keeps the model's dtype; int8 is chosen only where
    asked (docs/PERFORMANCE.md, "int8 on the CPU", has the agreement it was measured with). A value that is not
    one of the names, or int8 where it cannot run, is a ValueError saying what to set."""
    from engines.names import LINEARS

    if setting not in LINEARS:
        raise ValueError(f"runtime.linear: {setting!r} is not one of {', '.join(LINEARS)}")
    if setting == "int8":
        why = unavailable_reason(device)
        if why:
            raise ValueError(f"runtime.linear: int8 cannot run here ({why}); set it to auto or model")
        return "int8", "runtime.linear: int8"
    return "model", "configured" if setting == "model" else "auto: the model's dtype"
