"""The dtype the runner's codec lanes decode in (`runtime.codec_dtype`): the model's, or bf16 on a CPU that has
bf16 dot instructions.

On a GPU the engine runs in bf16, its codec too. On a CPU the engine's weights are fp32 (their decoder layers
packed as fp16, engines.runtime.linears) and its codec was fp32 as well: the codec's convolutions are
compute-bound there and take about half a book's CPU time. Where the CPU multiplies bf16 pairs natively
(AVX512_BF16, AMX-BF16) oneDNN runs them in bf16 with fp32 sums about twice as fast, the precision the GPU's codec
has. Only the audio changes (by about 44 dB below the signal on random weights, docs/PERFORMANCE.md "the codec on
the CPU"), never the codes. The eager reference decode (`TTSEngine.decode`) keeps the model's dtype.
"""
from __future__ import annotations

import copy
from typing import Optional

import torch

from engines.names import CODEC_DTYPES

BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of native bf16 dot products (x86)


def bf16_reason(device) -> Optional[str]:
    """Why a bf16 codec would not pay on `device` (None: it does)."""
    from engines.device.detect import cpu_flags

    if torch.device(device).type != "cpu":
        return f"on {device} the codec runs in the model's dtype"
    if not set(BF16_FLAGS) & cpu_flags():
        return "this CPU has no bf16 dot instructions (AVX512_BF16, AMX-BF16)"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN"
    return None


def codec_dtype_setting(setting: str, device, model_dtype: torch.dtype) -> tuple[str, str]:
    """`runtime.codec_dtype` decided: ("model" or "bfloat16", why). auto: bf16 for an fp32 engine on a CPU with
    bf16 dot instructions, else the model's dtype. bfloat16 asked for runs wherever torch has the dtype."""
    if setting not in CODEC_DTYPES:
        raise ValueError(f"runtime.codec_dtype: {setting!r} is not one of {', '.join(CODEC_DTYPES)}")
    if setting == "model":
        return "model", "configured"
    if setting == "bfloat16":
        return ("model" if model_dtype == torch.bfloat16 else "bfloat16"), "runtime.codec_dtype: bfloat16"
    if model_dtype != torch.float32:
        return "model", f"auto: the model's dtype ({str(model_dtype).replace('torch.', '')})"
    why = bf16_reason(device)
    if why:
        return "model", f"auto: the model's dtype ({why})"
    return "bfloat16", "auto: bf16 (a CPU with bf16 dot instructions)"


def lane_decoder(decoder: torch.nn.Module, choice: str) -> torch.nn.Module:
    """The decoder the codec lanes decode with: `decoder` itself, or a copy in bf16 (`choice` "bfloat16")."""
    if choice != "bfloat16" or next(decoder.parameters()).dtype == torch.bfloat16:
        return decoder
    out = copy.deepcopy(decoder).to(torch.bfloat16)
    for m in out.modules():  # non-persistent fp32 buffers stay fp32 (RoPE frequencies)
        if hasattr(m, "rope_inv_freq"):
            m.inv_freq = m.rope_inv_freq(next(decoder.parameters()).device)
    return out
