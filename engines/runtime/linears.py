"""The decoder layers' weights in the format `runtime.linear` names (CPU): model, fp16 or int8.

A CPU decode step is bound by reading weights: one frame reads every weight of the talker's 28 layers
once and the code predictor's 5 layers 15 times (~1.6 G weights for the 0.6B model: 6.5 GB in fp32),
so the bytes a weight takes set one stream's speed. The formats:

- `model`: the model's dtype, `F.linear`.
- `fp16`: each weight stored as float16 and multiplied in float32 (torch's fbgemm fp16 GEMM: the weight
  is widened to fp32 in registers, activations and sums stay fp32): half of fp32's bytes. Its products
  are those of fp32 with the weights rounded to fp16 (11 significant bits, twice bf16's); the weights
  of a bf16 checkpoint (the released ones) are fp16 numbers already wherever |w| >= 2^-14, so there it
  is the fp32 engine up to the order of the sums. A row's product does not depend on the rows beside it.
- `int8`: int8 weights with int8 activations (engines.runtime.int8): a quarter of the bytes, lossy.

`runtime.linear: auto` (`linear_setting`) takes fp16 on a CPU engine of fp32 weights where the kernel runs
(x86 torch builds; probed once), the model's dtype elsewhere: fp16 holds the agreement measure
(benchmarks/bf16_agreement.py) closer to fp32 than bf16 does, int8 does not (docs/PERFORMANCE.md,
"Weight formats on the CPU"). With fp16 layers the heads are fp16 too (`head_format`); embeddings, norms,
attention and the key/value cache stay in the model's dtype.
"""
from __future__ import annotations

import functools
import logging
import warnings
from typing import Optional

import torch
import torch.nn.functional as F

from engines.runtime import int8

log = logging.getLogger(__name__)

FORMATS = ("model", "fp16", "int8")  # what runtime.linear resolves to (engines.names.LINEARS adds auto)
LOSSY = ("int8",)  # formats that do not hold the agreement measure: chosen only where asked


class Fp16Weight:
    """A linear's weight `[out, in]` (and bias `[out]`) stored as float16, multiplied in float32; `w(x)` =
    x @ W.T + b with x and the result float32 (other dtypes are converted on the way in and back)."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        with warnings.catch_warnings():  # (a weight beyond fp16's range is saturated: none in these models)
            warnings.simplefilter("ignore")
            self.packed = torch.ops.quantized.linear_prepack_fp16(w.contiguous(), None)
        self.bias = None if bias is None else bias.detach().float()

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out_features, self.in_features))

    def __call__(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        y = torch.ops.quantized.linear_dynamic_fp16(rows if rows.dtype == torch.float32 else rows.float(),
                                                    self.packed)  # [M, out]
        for b in (self.bias, bias):
            if b is not None:
                y = y + b
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def _fp16_reason() -> Optional[str]:
    if not hasattr(torch.ops.quantized, "linear_dynamic_fp16"):
        return "this torch build has no fbgemm fp16 matmul (quantized.linear_dynamic_fp16)"
    try:  # the op exists on every x86 build, but fbgemm refuses CPUs without AVX2
        w = Fp16Weight(torch.ones(8, 16))
        if not torch.allclose(w(torch.ones(2, 16)), torch.full((2, 8), 16.0)):
            return "the fbgemm fp16 matmul gives wrong results on this CPU"
    except RuntimeError as exc:
        return f"the fbgemm fp16 matmul does not run on this CPU ({str(exc).splitlines()[0][:120]})"
    return None


@functools.lru_cache(maxsize=None)
def _probe(fmt: str) -> Optional[str]:
    return _fp16_reason() if fmt == "fp16" else int8.unavailable_reason("cpu") if fmt == "int8" else None


def unavailable_reason(fmt: str, device) -> Optional[str]:
    """Why weights in `fmt` cannot run on `device` (None: they can; `model` always can)."""
    if fmt == "model":
        return None
    if torch.device(device).type != "cpu":
        return f"{fmt} linears run on the CPU only, not on {device}"
    return _probe(fmt)


def pack(w: torch.Tensor, fmt: str, bias: Optional[torch.Tensor] = None):
    """`w` (and `bias`) in format `fmt`: the tensor itself for `model`, else a callable weight (`linear`)."""
    if fmt == "model":
        return w
    return Fp16Weight(w, bias) if fmt == "fp16" else int8.Int8Weight(w, bias)


def linear(x: torch.Tensor, w, b: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`F.linear` for a weight tensor, the packed product for a packed weight (`pack`)."""
    return F.linear(x, w, b) if isinstance(w, torch.Tensor) else w(x, b)


class PackedLinear(torch.nn.Module):
    """An nn.Linear in a packed format (the reference modules of such an engine: `pack_modules`)."""

    def __init__(self, lin: torch.nn.Linear, fmt: str):
        super().__init__()
        self.fmt, self.w = fmt, pack(lin.weight, fmt, lin.bias)
        self.weight = lin.weight.detach()  # (not used by the product: its device and dtype for those who ask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w(x)


def pack_modules(stack: torch.nn.Module, fmt: str) -> int:
    """Replace the linears of every decoder layer of `stack` (a DecoderStack) by their `fmt` form, in place: the
    slow reference path of a step in that format (parity tests, the agreement measure). Returns how many."""
    n = 0
    for layer in stack.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, mod in list(parent.named_children()):
                if isinstance(mod, torch.nn.Linear):
                    setattr(parent, name, PackedLinear(mod, fmt))
                    n += 1
    return n


def head_format(fmt: str) -> str:
    """The format of the heads (the talker's codebook-0 head, the predictor's 15) in a step whose decoder layers
    are in `fmt`: fp16 with fp16 layers (a frame reads the predictor's heads 15 times, ~6% of its bytes in
    fp32), the model's dtype otherwise (int8's rounding is kept off the logits)."""
    return "fp16" if fmt == "fp16" else "model"


def pack_heads(talker: torch.nn.Module, fmt: str) -> int:
    """Replace the talker's codebook-0 head and the code predictor's heads by their `head_format(fmt)` form, in
    place (with `pack_modules`: the slow reference of a step in that format). Returns how many."""
    hf = head_format(fmt)
    if hf == "model":
        return 0
    talker.codec_head = PackedLinear(talker.codec_head, hf)
    heads = talker.code_predictor.lm_head
    for j, head in enumerate(heads):
        heads[j] = PackedLinear(head, hf)
    return 1 + len(heads)


def auto_format(device, dtype: torch.dtype) -> tuple[str, str]:
    """What `runtime.linear: auto` takes: fp16 for fp32 weights on a CPU where it runs, else the model's dtype."""
    if torch.device(device).type != "cpu":
        return "model", "auto: the model's dtype (packed formats are for the CPU)"
    if dtype != torch.float32:
        return "model", f"auto: the model's dtype ({str(dtype).replace('torch.', '')} asked for)"
    why = unavailable_reason("fp16", device)
    if why:
        return "model", f"auto: the model's dtype ({why})"
    return "fp16", "auto: fp16 weights, fp32 compute (the agreement measure holds it closer to fp32 than bf16)"


def linear_setting(setting: str, device, dtype: torch.dtype) -> tuple[str, str]:
    """`runtime.linear` decided: (one of FORMATS, why). A value that is not one of the names, or a format where
    it cannot run, is a ValueError saying what to set."""
    from engines.names import LINEARS

    if setting not in LINEARS:
        raise ValueError(f"runtime.linear: {setting!r} is not one of {', '.join(LINEARS)}")
    if setting == "auto":
        return auto_format(device, dtype)
    why = unavailable_reason(setting, device)
    if why:
        raise ValueError(f"runtime.linear: {setting} cannot run here ({why}); set it to auto or model")
    return setting, "configured" if setting == "model" else f"runtime.linear: {setting}"
