"""ONNX Runtime codec backend: runs the exported streaming step (engines.codec.export).

The stream state lives here as numpy arrays, one row per stream; each `push` feeds them to the
step graph and keeps the returned `new_state.*` tensors for the next call. Meant for CPU machines
(CPUExecutionProvider), where it beats the eager torch codec (docs/PERFORMANCE.md, "Codec on CPU");
other ONNX Runtime providers can be passed but have not been measured.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from engines.codec.backend import check_move, check_push, row_mask
from engines.codec.export import STATE_IN, STATE_OUT

log = logging.getLogger(__name__)


def make_session(path: str | Path, threads: int = 0, providers: list[str] | None = None):
    """An InferenceSession for `path`; `threads` intra-op threads (0 = ONNX Runtime's default)."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise RuntimeError("the onnxruntime codec needs ONNX Runtime: pip install 'tts-appliance[onnx]'") from exc
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3  # errors only: the exported graph triggers harmless shape-merge warnings
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=providers or ["CPUExecutionProvider"])


class OnnxCodec:
    """Streaming codec on ONNX Runtime with the interface of engines.codec.backend.CodecBackend.

    `path` is a streaming-step ONNX file. Output wav tensors are float32 on the CPU.
    """

    name = "onnxruntime"
    graphable = False  # host-side numpy state: nothing a device graph could capture

    def __init__(self, path: str | Path, batch_size: int = 1, samples_per_frame: int = 1920, threads: int = 0,
                 providers: list[str] | None = None):
        self.path, self.batch_size = Path(path), batch_size
        self.session = make_session(self.path, threads, providers)
        self.device = torch.device("cpu")
        ins = {i.name: i for i in self.session.get_inputs()}
        missing = {"codes", "n_valid", "pos"} - ins.keys()
        if missing:
            raise ValueError(f"{self.path} is not a streaming codec step graph (no inputs {sorted(missing)}); "
                             "rebuild it with `tts-appliance build-engines --force`")
        self.num_quantizers = int(ins["codes"].shape[1])
        self.state_names = [n for n in ins if n.startswith(STATE_IN)]
        self.output_names = ["wav", "pos_out", *(STATE_OUT + n[len(STATE_IN):] for n in self.state_names)]
        self.state = {n: np.zeros([batch_size, *ins[n].shape[1:]], np.float32) for n in self.state_names}
        self.pos = np.zeros(batch_size, np.int64)
        self.samples_per_frame = samples_per_frame

    @property
    def frames_decoded(self) -> Tensor:
        return torch.from_numpy(self.pos.copy())

    def push(self, codes: Tensor, n_valid: Tensor | None = None) -> Tensor:
        """codes [b, K, n] (b <= batch_size: the first b streams) -> wav [b, 1, n * samples_per_frame] float32 (CPU)."""
        check_push(codes, self.batch_size, self.num_quantizers)
        b, n = codes.shape[0], codes.shape[-1]
        if n == 0:
            return torch.zeros(b, 1, 0)
        nv = np.full(b, n, np.int64) if n_valid is None else \
            torch.as_tensor(n_valid).to("cpu", torch.int64).numpy()
        if nv.shape != (b,) or nv.min() < 0 or nv.max() > n:
            raise ValueError(f"n_valid must lie in [0, {n}], one count per pushed row ({b}), got {nv.tolist()}")
        whole = b == self.batch_size
        state = self.state if whole else {k: v[:b] for k, v in self.state.items()}  # leading rows: contiguous
        feed = {"codes": codes.to("cpu", torch.int64).numpy(), "n_valid": nv,
                "pos": self.pos if whole else self.pos[:b], **state}
        wav, pos, *states = self.session.run(self.output_names, feed)
        if whole:  # the arrays ORT returned become the state (no copy)
            self.pos = pos
            self.state = dict(zip(self.state_names, states))
        else:
            self.pos[:b] = pos
            for name, new in zip(self.state_names, states):
                self.state[name][:b] = new
        if wav.shape[-1] != n * self.samples_per_frame:
            raise ValueError(f"{self.path}: {n} frames gave {wav.shape[-1]} samples, expected "
                             f"{n * self.samples_per_frame}; pass the codec's samples_per_frame")
        return torch.from_numpy(wav)

    def reset(self, rows: Tensor | None = None) -> None:
        mask = row_mask(rows, self.batch_size).numpy()
        for buf in self.state.values():
            buf[mask] = 0  # the arrays ORT returned are ours to write
        self.pos[mask] = 0

    def flush(self, rows: Tensor | None = None) -> Tensor:
        self.reset(rows)
        return torch.zeros(self.batch_size, 1, 0)

    def move(self, src: int, dst: int) -> None:
        check_move(src, dst, self.batch_size)
        for buf in self.state.values():
            buf[dst] = buf[src]
        self.pos[dst] = self.pos[src]

    def __repr__(self) -> str:
        return f"OnnxCodec({self.path.name}, batch={self.batch_size}, providers={self.session.get_providers()})"
