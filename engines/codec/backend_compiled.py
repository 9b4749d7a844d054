"""torch.compile (inductor) of the streaming codec step: one fused graph for every (batch, frames).

The streaming step (`engines.codec.streaming.stream_step`) runs ~20 small elementwise
kernels per residual unit in eager mode (SnakeBeta's exp / sin / pow / add, the residual adds, the
ConvNeXt norm and GELU, the RMSNorms, RoPE and layer scales of the transformer, the state-tail
gathers). Inductor fuses them around the convolutions and GEMMs (which stay cuDNN / cuBLAS /
oneDNN calls), so the codec costs fewer launches inside the same CUDA graphs.

One compiled graph serves every shape: batch and frames are marked dynamic, and pushes of one row
or one frame are padded to two (an extra row with n_valid 0 is an exact no-op on its state; the
codec is causal, so a padding frame after the real ones changes nothing before it), which keeps
torch from specialising on sizes 0/1 and compiling again. The graph is traced once per process on
fixed scratch shapes (`TorchCodec.warm`), so a process finds the graph that `tts-appliance build-engines`
wrote into the inductor cache at install time (`inductor_cache`: the engine cache folder's
`inductor/`), and then only pays for tracing, not for code generation.

Needs a C++ compiler on the CPU and Triton on NVIDIA GPUs; `unavailable_reason(device)` says what
is missing. The Ascend NPU is not supported (torch_npu's own compile backend is not wired up).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
from pathlib import Path

import torch

from engines.codec.streaming import stream_step

log = logging.getLogger(__name__)

NAME = "torch-compiled"
MIN_ROWS = MIN_FRAMES = 2  # pushes are padded to at least this (sizes 0/1 would be specialised)
# the trace's example sizes: distinct (torch would otherwise assume batch == frames) and large enough
# that the size hints inductor picks kernel configurations with are those of real work, not of a toy
WARM_ROWS, WARM_FRAMES = 6, 12


def unavailable_reason(device: str | torch.device) -> str | None:
    """Why inductor cannot compile the codec for `device` here (None: it can try)."""
    dev = torch.device(device) if not str(device).startswith("npu") else None
    if dev is None or dev.type not in ("cpu", "cuda"):
        return f"torch.compile of the codec is not supported on {device} (CPU and NVIDIA GPUs only)"
    if dev.type == "cuda":
        try:
            from torch.utils._triton import has_triton
        except ImportError:
            return "missing library: triton (inductor's GPU code generator) is not importable"
        if not has_triton():
            return "missing library: triton is not installed or does not support this GPU"
        return None
    cxx = os.environ.get("CXX")
    if cxx and shutil.which(cxx):
        return None
    if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "missing compiler: inductor needs a C++ compiler on the CPU (apt install g++)"
    return None


@contextlib.contextmanager
def inductor_cache(path: str | Path | None):
    """Point inductor's on-disk caches (FX graphs, generated code, Triton kernels) at `path` for the
    duration (None: leave them where they are). The variables are read at compile time, so wrapping
    the calls that may compile is enough; the previous values come back afterwards."""
    if path is None:
        yield
        return
    path = Path(path).resolve()
    path.mkdir(parents=True, exist_ok=True)
    want = {"TORCHINDUCTOR_CACHE_DIR": str(path), "TRITON_CACHE_DIR": str(path / "triton")}
    saved = {k: os.environ.get(k) for k in want}
    os.environ.update(want)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@functools.lru_cache(maxsize=None)
def compiled_step():
    """`stream_step` under torch.compile (inductor, whole graph); one object per process, so every
    codec of the process shares dynamo's cache of traced graphs."""
    import torch._dynamo

    cfg = torch._dynamo.config
    limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, limit, max(getattr(cfg, limit), 64))  # one entry per decoder, dtype and device
    return torch.compile(stream_step, fullgraph=True, dynamic=None)


def mark_dynamic(codes: torch.Tensor, n_valid: torch.Tensor, pos: torch.Tensor, bufs: dict) -> None:
    """Batch (all inputs) and frames (codes) are symbolic in the compiled graph."""
    from torch._dynamo import mark_dynamic as mark

    mark(codes, 0)
    mark(codes, 2)
    mark(n_valid, 0)
    mark(pos, 0)
    for buf in bufs.values():
        mark(buf, 0)
