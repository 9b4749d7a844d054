"""What every codec backend offers: the interface of `StreamingCodecDecoder`.

A backend holds `batch_size` independent streams, one per row:

    push(codes [b, K, n] int64, n_valid [b] | None) -> wav [b, 1, n * samples_per_frame] float
    reset(rows: bool [B] | None)   forget the history of those rows (all when None)
    flush(rows: bool [B] | None)   end those streams; returns [B, 1, 0] (the codec has no look-ahead)
    move(src, dst)                 copy the stream in row src to row dst (slot compaction)
    frames_decoded -> [B] int64    frames consumed by each row's current stream

`push` decodes the first b <= batch_size rows (the runtime keeps its active streams in the leading
rows and pushes only a bucket of them); rows b.. are left exactly as they were. A backend with
`row_windows` true also takes `push(codes, n_valid, first_row=r)`: rows [r, r + b), the others untouched
(a batch lane with more rows than one call may carry decodes them window by window). With `n_valid`,
row r consumes only its first n_valid[r] frames (0 = idle row, its state is unchanged) and its valid
output is the first n_valid[r] * samples_per_frame samples.

`name` says which backend it is (one of BACKENDS); `device` where its output tensors live;
`graphable` whether `push` may be captured in a device graph (engines.device.graphs): it then
only runs sync-free device work on its own static state.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from engines.names import CODEC_BACKENDS

BACKENDS = CODEC_BACKENDS


@runtime_checkable
class CodecBackend(Protocol):
    name: str
    batch_size: int
    samples_per_frame: int
    device: torch.device
    graphable: bool

    @property
    def frames_decoded(self) -> Tensor: ...

    def push(self, codes: Tensor, n_valid: Tensor | None = None) -> Tensor: ...

    def reset(self, rows: Tensor | None = None) -> None: ...

    def flush(self, rows: Tensor | None = None) -> Tensor: ...

    def move(self, src: int, dst: int) -> None: ...


def check_push(codes: Tensor, batch_size: int, num_quantizers: int, first_row: int = 0) -> None:
    """Raise a ValueError that says what is wrong with the shape of pushed codes (rows from `first_row`)."""
    if codes.dim() != 3 or not 1 <= codes.shape[0] <= batch_size - first_row or codes.shape[1] != num_quantizers \
            or first_row < 0:
        raise ValueError(f"push expects codes [b, {num_quantizers}, n] with 1 <= b <= {batch_size - first_row} "
                         f"(one row per stream, the b streams from row {first_row}), got {tuple(codes.shape)}")


def check_move(src: int, dst: int, batch_size: int) -> None:
    if not (0 <= src < batch_size and 0 <= dst < batch_size):
        raise ValueError(f"move({src}, {dst}): rows must lie in [0, {batch_size})")


def row_mask(rows: Tensor | None, batch_size: int) -> Tensor:
    """A bool [B] CPU mask from `rows` (None = all rows)."""
    if rows is None:
        return torch.ones(batch_size, dtype=torch.bool)
    rows = torch.as_tensor(rows).to("cpu", torch.bool).reshape(-1)
    if rows.numel() != batch_size:
        raise ValueError(f"rows must be a bool mask of {batch_size} entries, got {rows.numel()}")
    return rows
