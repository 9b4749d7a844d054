"""One small graph-capture interface for every device: eager on CPU, CUDA graphs, Ascend NPU graphs.

    g = make_graph(device)
    out = g.capture(fn, *static_inputs)   # out: fn's tensor(s), static: the same objects every replay
    static_inputs[0].copy_(new_values)     # refresh inputs IN PLACE (never rebind them)
    g.replay()                             # reruns fn's work; `out` now holds the new results

Rules (the CUDA-graph rules, kept on every device so code written against CPU behaves the same
on an accelerator):
- `fn` takes tensors and returns a tensor, or a tuple / list / dict of tensors.
- `capture(fn, *inputs, warmup=N)` executes `fn` for real exactly N times on every device (the
  warm-up runs; the recorded run itself has no effect on CUDA/NPU, and on CPU it IS the last of
  the N runs). So with N >= 1 the effect is the same everywhere: state `fn` mutates (caches,
  counters) has advanced N steps after capture; the first warm-up can be the real first step.
  N = 0 is only meaningful on CUDA/NPU: EagerGraph must run `fn` once to get its outputs.
- Shapes are fixed at capture: one graph per shape bucket. Work must be sync-free (no `.item()`,
  no host branching on tensor values) for the accelerator graphs.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import torch
from torch import Tensor

from engines.device.npu import import_torch_npu

log = logging.getLogger(__name__)


def _tensors(out: Any) -> list[Tensor]:
    """The tensors of fn's output, in a fixed order (tensor, tuple/list, or dict)."""
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in _tensors(out[k])]
    raise TypeError(f"graph functions must return tensors (or tuples/lists/dicts of them), got {type(out)}")


class DeviceGraph:
    """Base class: `capture(fn, *static_inputs)` -> static outputs; `replay()` refreshes them."""

    kind = "base"

    def __init__(self, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.outputs: Any = None
        self._fn: Callable | None = None
        self._inputs: tuple = ()

    @property
    def captured(self) -> bool:
        return self._fn is not None

    def capture(self, fn: Callable, *static_inputs: Tensor, warmup: int = 1) -> Any:
        raise NotImplementedError

    def replay(self) -> Any:
        raise NotImplementedError

    def _need_capture(self) -> None:
        if not self.captured:
            raise RuntimeError(f"{type(self).__name__}.replay() before capture(): call capture(fn, *inputs) first")


class EagerGraph(DeviceGraph):
    """CPU (and any device without graphs): replay calls `fn` again and copies into the static outputs."""

    kind = "eager"

    def capture(self, fn: Callable, *static_inputs: Tensor, warmup: int = 1) -> Any:
        if warmup < 1:
            log.debug("EagerGraph.capture(warmup=0) still runs fn once (CPU has no record-only capture)")
        self._fn, self._inputs = fn, static_inputs
        for _ in range(max(warmup - 1, 0)):
            fn(*static_inputs)
        self.outputs = fn(*static_inputs)
        self._static = _tensors(self.outputs)
        return self.outputs

    def replay(self) -> Any:
        self._need_capture()
        fresh = _tensors(self._fn(*self._inputs))
        if len(fresh) != len(self._static):
            raise RuntimeError(f"fn returned {len(fresh)} tensors on replay, {len(self._static)} at capture")
        for static, new in zip(self._static, fresh):
            if static.shape != new.shape:
                raise RuntimeError(f"fn output shape changed from {tuple(static.shape)} to {tuple(new.shape)}: "
                                   "graphs are per shape; capture one graph per shape bucket")
            if static.data_ptr() != new.data_ptr():
                with torch.inference_mode(static.is_inference()):  # outputs made under inference_mode
                    static.copy_(new)
        return self.outputs


class StreamGraph(DeviceGraph):
    """Capture on a side stream with a device namespace `ns` shaped like `torch.cuda`.

    `ns` must offer Stream, current_stream, stream (context), and `graph(g, pool=, stream=)`;
    `graph_cls` is the native graph class (torch.cuda.CUDAGraph, torch_npu.npu.NPUGraph). `pool`
    (a graph_pool_handle()) lets many bucket graphs share one memory pool.

    `stream`: the stream to capture on (default: a fresh side stream). Library handles keep a workspace
    per stream (cuBLAS), and a captured graph keeps using the workspace of the stream it was captured on:
    graphs that may replay at the same time on different streams must be captured on different streams.
    """

    kind = "stream"

    def __init__(self, device, ns, graph_cls, pool=None, stream=None):
        super().__init__(device)
        self.ns, self.graph_cls, self.pool, self.stream = ns, graph_cls, pool, stream
        self.graph = None

    def capture(self, fn: Callable, *static_inputs: Tensor, warmup: int = 1) -> Any:
        ns = self.ns
        side = self.stream if self.stream is not None else ns.Stream(self.device)
        side.wait_stream(ns.current_stream(self.device))
        with ns.stream(side):  # warm-up off the capture: lazy inits, allocator, autotuning
            for _ in range(warmup):
                fn(*static_inputs)
        ns.current_stream(self.device).wait_stream(side)
        self.graph = self.graph_cls()
        with ns.graph(self.graph, pool=self.pool, stream=side), _no_autotune_search():
            self.outputs = fn(*static_inputs)
        _tensors(self.outputs)  # type check
        self._fn, self._inputs = fn, static_inputs
        log.debug("captured %s graph on %s", self.kind, self.device)
        return self.outputs

    def replay(self) -> Any:
        self._need_capture()
        self.graph.replay()
        return self.outputs


class _no_autotune_search:
    """cuDNN's benchmark mode times candidate kernels (FIND), which cannot run inside a capture: a conv
    whose cached choice misses (seen for some codec shapes) would invalidate the capture. Inside a
    capture cuDNN picks by its heuristics instead."""

    def __enter__(self):
        self.saved = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = False

    def __exit__(self, *exc):
        torch.backends.cudnn.benchmark = self.saved


class CudaGraph(StreamGraph):
    """torch.cuda.CUDAGraph behind the DeviceGraph interface."""

    kind = "cuda"

    def __init__(self, device="cuda", pool=None, stream=None):
        super().__init__(device, torch.cuda, torch.cuda.CUDAGraph, pool, stream)


class NPUGraph(StreamGraph):
    """torch_npu.npu.NPUGraph behind the DeviceGraph interface (capture / replay, static buffers).

    NOT RUN ON HARDWARE: no Ascend machine was available; the calls follow torch_npu's documented API
    (`torch_npu.npu.NPUGraph`, the `torch_npu.npu.graph(g, pool=, stream=)` context manager, streams
    mirroring torch.cuda). The capture logic is StreamGraph's, tested on CPU with a stand-in namespace."""

    kind = "npu"

    def __init__(self, device="npu", pool=None):
        tn = import_torch_npu()
        if tn is None:
            raise RuntimeError("NPU graphs need torch_npu (Ascend's PyTorch adapter) and the CANN toolkit; "
                               "install them, or use device 'cpu' / 'cuda'")
        import torch

        super().__init__(torch.device(device), tn.npu, tn.npu.NPUGraph, pool)


def distinct_streams(device, priorities: tuple) -> list:
    """One CUDA stream per entry of `priorities` (lower = more urgent), pairwise distinct: torch hands out
    pooled streams round-robin, and work that may run at the same time needs different streams (and so
    different library workspaces, see StreamGraph)."""
    out, seen = [], set()
    for p in priorities:
        for _ in range(64):
            s = torch.cuda.Stream(device, priority=p)
            if s.cuda_stream not in seen:
                break
        else:
            raise RuntimeError("could not get distinct CUDA streams")
        seen.add(s.cuda_stream)
        out.append(s)
    return out


def make_graph(device: str | torch.device, pool=None, stream=None) -> DeviceGraph:
    """CudaGraph on CUDA, NPUGraph on Ascend (needs torch_npu), EagerGraph elsewhere."""
    if str(device).startswith("npu"):  # checked first: "npu" is only a torch device once torch_npu is loaded
        return NPUGraph(device, pool)
    dev = torch.device(device)
    if dev.type == "cuda":
        return CudaGraph(dev, pool, stream)
    return EagerGraph(dev)
