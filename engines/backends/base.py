"""What every codec backend offers: the interface of `StreamingCodecDecoder`.

A backend decodes `batch_size` independent streams, one per row:

    push(codes [B, K, n] int64, n_valid [B] | None) -> wav [B, 1, n * samples_per_frame] float
    reset(rows: bool [B] | None)   forget the history of those rows (all when None)
    flush(rows: bool [B] | None)   end those streams; returns [B, 1, 0] (the codec has no look-ahead)
    frames_decoded -> [B] int64    frames consumed by each row's current stream

With `n_valid`, row b consumes only its first n_valid[b] frames (0 = idle row) and its valid output
is the first n_valid[b] * samples_per_frame samples. `name` says which backend it is
("torch", "onnxruntime", "tensorrt"); `device` where its output tensors live.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

BACKENDS = ("torch", "onnxruntime", "tensorrt")


@runtime_checkable
class CodecBackend(Protocol):
    name: str
    batch_size: int
    samples_per_frame: int
    device: torch.device

    @property
    def frames_decoded(self) -> Tensor: ...

    def push(self, codes: Tensor, n_valid: Tensor | None = None) -> Tensor: ...

    def reset(self, rows: Tensor | None = None) -> None: ...

    def flush(self, rows: Tensor | None = None) -> Tensor: ...


def check_push(codes: Tensor, batch_size: int, num_quantizers: int) -> None:
    """Raise a ValueError that says what is wrong with the shape of pushed codes."""
    if codes.dim() != 3 or codes.shape[0] != batch_size or codes.shape[1] != num_quantizers:
        raise ValueError(f"push expects codes [{batch_size}, {num_quantizers}, n] (one row per stream), "
                         f"got {tuple(codes.shape)}")


def row_mask(rows: Tensor | None, batch_size: int) -> Tensor:
    """A bool [B] CPU mask from `rows` (None = all rows)."""
    if rows is None:
        return torch.ones(batch_size, dtype=torch.bool)
    rows = torch.as_tensor(rows).to("cpu", torch.bool).reshape(-1)
    if rows.numel() != batch_size:
        raise ValueError(f"rows must be a bool mask of {batch_size} entries, got {rows.numel()}")
    return rows
