"""Streaming codec decoding: feed code frames as they are generated, get the matching PCM at once.

The codec decoder is causal end to end with no look-ahead, so it streams exactly by carrying
state: every causal conv keeps its last (kernel-1)*dilation input frames, every upsampling
transposed conv its last ceil(k/s)-1 input frames (the overlap), and every transformer layer the
RoPE'd keys/values of its last `sliding_window - 1` positions, plus a per-row frame counter for the
rotary positions. Each pushed frame yields exactly `samples_per_frame` (1920) samples; nothing is
held back, so concatenating all pushes equals `CodecDecoder.forward` on the whole sequence and
`flush()` has nothing left to emit. "Equals" is exact math: in fp64 the two agree to ~1e-14; in fp32
they differ only by rounding, because conv/GEMM kernels sum in a length-dependent order (~1e-5 on
the tiny random test codec, whose fp32-vs-fp64 error is of the same size).

Re-decoding with left context instead of carrying state would need the full receptive field to be
exact: 2 frames (pre-conv) + num_layers * (sliding_window - 1) frames for the transformer (568 at
real size) + the upsampling convs' context; the stateful design avoids that cost entirely.
Per stream the state is about 1.3 M values at real size (5 MB in fp32).
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Optional

import torch
from torch import Tensor

from engines.codec.decoder import CodecDecoder
from engines.codec.state import StreamState
from engines.device.threads import own_torch_threads

log = logging.getLogger(__name__)


def stream_step(decoder: CodecDecoder, codes: Tensor, n_valid: Tensor, pos: Tensor, bufs: dict,
                fast: bool = False) -> Tensor:
    """One streaming step on explicit state: decode codes [b, K, n] continuing the rows whose
    left-context buffers are `bufs` ({name: [b, ...]}) and frame counters `pos` [b], both updated in
    place; row r consumes its first n_valid[r] frames. Returns wav [b, 1, n * samples_per_frame].

    Sync-free and shape-static for a given (b, n): the function the CUDA graphs capture and the
    one torch.compile fuses (engines.codec.backend_compiled). `fast`: see CodecDecoder.forward."""
    st = StreamState(bufs, pos, n_valid=n_valid)
    wav = decoder(codes, st, fast=fast)
    pos.add_(n_valid)
    return wav


class StreamingCodecDecoder:
    """Batched streaming front end of a CodecDecoder: one independent stream per batch row.

    `push(codes [b, K, n])` decodes the first b <= batch_size rows and returns wav
    [b, 1, n * samples_per_frame]; the other rows are untouched; `n` may change between calls.
    With `n_valid` [b] (ints, best on the decoder's device) row r consumes only its first
    n_valid[r] frames this call (0 = idle row, state unchanged); its valid output is the first
    n_valid[r] * samples_per_frame samples, the rest is padding to drop. `reset(rows)` and
    `flush(rows)` start new streams in the rows of a bool mask; `move(src, dst)` copies a stream.

    CUDA graphs: one graph per (b, n) bucket captures `push(codes_in, n_valid_in)` (= `stream_step`
    on views of the first b rows), where `codes_in` [b, K, n] and `n_valid_in` [b] are static input
    tensors and the state buffers (allocated once here, updated only in place by `copy_`) are the
    graph's static memory. Everything inside is shape-static for the bucket and sync-free: masks,
    rotary angles and the per-row gather of the state tails are computed on device from `pos` and
    `n_valid`; `state.rate` is a Python int fixed by the layer order. Always pass `n_valid` when
    capturing so the same graph serves full and partial steps; `reset(rows)` stays outside the graph
    (masked in-place fills, also sync-free).

    `row_threads` > 1 (CPU): a push of several rows splits them into that many groups, decoded at once on
    threads of their own, each with one torch thread (rows are independent streams). Unlike one call with
    that many torch threads, the groups never wait for each other inside an op, so they share cores with
    other busy threads (the decode loop) without stalling: when the loop waits, the codec has every core
    (docs/PERFORMANCE.md, "Books on the CPU"). The calling thread decodes the first group; `close()` lets
    the others go (a later push starts them again).
    """

    def __init__(self, decoder: CodecDecoder, batch_size: int = 1, fast: bool = False, row_threads: int = 1):
        self.decoder, self.fast = decoder, fast
        p = next(decoder.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.samples_per_frame = decoder.samples_per_frame
        bufs = {k: torch.zeros(s, device=self.device, dtype=self.dtype)
                for k, s in decoder.stream_state_shapes(batch_size).items()}
        self.state = StreamState(bufs, torch.zeros(batch_size, dtype=torch.long, device=self.device))
        self.batch_size = batch_size
        self.row_threads = max(1, row_threads) if self.device.type == "cpu" else 1
        self._helpers: Optional[ThreadPoolExecutor] = None

    @property
    def frames_decoded(self) -> Tensor:
        """[B] frames consumed so far by each row's current stream."""
        return self.state.pos

    def rows(self, stop: int, start: int = 0) -> tuple[dict, Tensor]:
        """(bufs, pos) views of rows [start, stop) (writes through to the state)."""
        st = self.state
        return {k: v[start:stop] for k, v in st.bufs.items()}, st.pos[start:stop]

    @torch.inference_mode()
    def push(self, codes: Tensor, n_valid: Tensor | None = None, first_row: int = 0) -> Tensor:
        """Decode the next frames of b streams, rows [first_row, first_row + b) (default: the first b):
        codes [b, K, n] -> wav [b, 1, n * samples_per_frame]."""
        b = codes.shape[0]
        if not 1 <= b <= self.batch_size - first_row or first_row < 0:
            raise ValueError(f"expected a batch of 1 to {self.batch_size - first_row} streams from row {first_row}, "
                             f"got {b}")
        if codes.shape[-1] == 0:
            return torch.zeros(b, 1, 0, device=self.device, dtype=self.dtype)
        codes = codes.to(self.device)
        n_valid = None if n_valid is None else n_valid.to(self.device, torch.long)
        groups = min(self.row_threads, b)
        if groups == 1:
            return self._push_rows(codes, n_valid, 0, b, first_row)
        if self._helpers is None:
            self._helpers = ThreadPoolExecutor(self.row_threads - 1, thread_name_prefix="codec-rows",
                                               initializer=own_torch_threads)
        cuts = [b * g // groups for g in range(groups + 1)]  # contiguous groups of (nearly) equal rows
        later = [self._helpers.submit(self._push_group, codes, n_valid, lo, hi, first_row)
                 for lo, hi in zip(cuts[1:-1], cuts[2:])]
        try:
            first = self._push_rows(codes, n_valid, 0, cuts[1], first_row)
        finally:  # (on an error too: no group may still write the state when the caller resets it)
            wait(later)
        return torch.cat([first, *(f.result() for f in later)])

    def _push_group(self, codes: Tensor, n_valid: Optional[Tensor], lo: int, hi: int, first_row: int) -> Tensor:
        with torch.inference_mode():  # (grad mode is per thread)
            return self._push_rows(codes, n_valid, lo, hi, first_row)

    def _push_rows(self, codes: Tensor, n_valid: Optional[Tensor], lo: int, hi: int, first_row: int = 0) -> Tensor:
        """Decode rows [lo, hi) of the push (codes [b, K, n]) on their own state rows, those rows shifted by
        `first_row` (views: written through)."""
        (bufs, pos), codes = self.rows(first_row + hi, first_row + lo), codes[lo:hi]
        if n_valid is not None:
            return stream_step(self.decoder, codes, n_valid[lo:hi], pos, bufs, self.fast)
        wav = self.decoder(codes, StreamState(bufs, pos), fast=self.fast)  # all frames valid: contiguous tail copies
        pos += codes.shape[-1]
        return wav

    def close(self) -> None:
        """Let the row threads go once idle (a later push starts them again)."""
        if self._helpers is not None:
            self._helpers.shutdown(wait=False)
            self._helpers = None

    def flush(self, rows: Tensor | None = None) -> Tensor:
        """End the streams in `rows` (all when None) and return their pending audio.

        The decoder has no look-ahead, so every pushed frame was already returned in full: the
        result is always empty ([B, 1, 0]); the rows are then reset for a new stream.
        """
        self.reset(rows)
        return torch.zeros(self.batch_size, 1, 0, device=self.device, dtype=self.dtype)

    def reset(self, rows: Tensor | None = None) -> None:
        """Forget the history of all rows, or of the rows where bool mask `rows` [B] is True."""
        self.state.reset(rows)

    def move(self, src: int, dst: int) -> None:
        """Copy the stream in row `src` (state and frame counter) to row `dst` (one multi-tensor launch)."""
        bufs = (*self.state.bufs.values(), self.state.pos)
        torch._foreach_copy_([b[dst] for b in bufs], [b[src] for b in bufs])
