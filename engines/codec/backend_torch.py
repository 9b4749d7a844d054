"""Torch codec backends: `StreamingCodecDecoder` behind the common backend interface.

`TorchCodec(decoder, batch)` is the reference and the fallback everywhere (CPU, CUDA, Ascend NPU).
`TorchCodec(decoder, batch, compile=True, cache_dir=...)` runs the same streaming step through
torch.compile (engines.codec.backend_compiled): name "torch-compiled". `fast=True` runs the upsampling
stack channels-last and fused (engines.codec.fast; the default of the eager codec on CUDA). Both are graphable: the
runtime (engines.runtime.stream.CodecStreams) captures their `push` per (batch, frames) bucket in
CUDA graphs, the compiled kernels inside the captured graph.
"""
from __future__ import annotations

import logging
import time

import torch
import torch.nn.functional as F
from torch import Tensor

from engines.codec.decoder import CodecDecoder
from engines.codec.streaming import StreamingCodecDecoder, stream_step

from engines.codec.backend import check_move, check_push, row_mask

log = logging.getLogger(__name__)


class TorchCodec:
    """Streaming codec on the decoder's own device and dtype (see engines.codec.backend).

    With `compile=True` the step is compiled by inductor, its on-disk cache in `cache_dir` (None:
    inductor's default). Compilation happens at the first push or at `warm()`; when it fails (no
    compiler, an inductor error) the codec logs why and runs eagerly from then on (`name` becomes
    "torch", `fallback_reason` says why). Raises RuntimeError at once when compiling cannot work
    on this device (engines.codec.backend_compiled.unavailable_reason). `row_threads` (the eager codec on
    the CPU): a push's rows are decoded in that many groups at once, each on a thread of its own
    (engines.codec.streaming.StreamingCodecDecoder); `close()` lets those threads go.
    """

    graphable = True
    row_windows = True  # push(..., first_row=r) decodes rows [r, r + b) (engines.codec.backend)

    def __init__(self, decoder: CodecDecoder, batch_size: int = 1, compile: bool = False, cache_dir=None,
                 fast: bool | None = None, row_threads: int = 1):
        from engines.codec import backend_compiled as cc

        self.decoder, self.batch_size, self.compiled = decoder, batch_size, compile
        p = next(decoder.parameters())
        if compile:
            reason = cc.unavailable_reason(p.device)
            if reason:
                raise RuntimeError(f"cannot compile the codec: {reason}")
        # the compiled step pads one-row pushes to MIN_ROWS: keep a spare row for that
        if compile and fast:
            raise ValueError("the fast codec stack is not compiled: choose compile or fast")
        if fast is None:  # the eager codec on CUDA runs the fused stack
            fast = not compile and p.device.type == "cuda"
        self.stream = StreamingCodecDecoder(decoder, max(batch_size, cc.MIN_ROWS) if compile else batch_size,
                                            fast=fast, row_threads=1 if compile else row_threads)
        if fast:
            decoder.fast_stack()  # built now, not inside the first graph capture
        self.device, self.dtype = self.stream.device, self.stream.dtype
        self.samples_per_frame = self.stream.samples_per_frame
        self.name = cc.NAME if compile else "torch"
        self.cache_dir = cache_dir
        self.fallback_reason: str | None = None
        self.compile_seconds: float | None = None
        self._fn = None if compile else stream_step

    @property
    def frames_decoded(self) -> Tensor:
        pos = self.stream.frames_decoded
        return pos if pos.shape[0] == self.batch_size else pos[:self.batch_size]

    def push(self, codes: Tensor, n_valid: Tensor | None = None, first_row: int = 0) -> Tensor:
        """codes [b, K, n] for rows [first_row, first_row + b) (within batch_size) -> wav [b, 1, n *
        samples_per_frame] (decoder dtype and device)."""
        check_push(codes, self.batch_size, self.decoder.config.num_quantizers, first_row)
        if not self.compiled or codes.shape[-1] == 0:
            return self.stream.push(codes, n_valid, first_row)
        return self._push_compiled(codes, n_valid, first_row)

    @torch.inference_mode()
    def _push_compiled(self, codes: Tensor, n_valid: Tensor | None, first_row: int = 0) -> Tensor:
        from engines.codec.backend_compiled import MIN_FRAMES, MIN_ROWS

        b, n = codes.shape[0], codes.shape[-1]
        # fresh inference tensors every call: the same kind of inputs as the warm-up trace
        codes = codes.to(self.device, torch.long, copy=True)
        nv = torch.full((b,), n, dtype=torch.long, device=self.device) if n_valid is None else \
            n_valid.to(self.device, torch.long, copy=True)
        rows, frames = max(b, MIN_ROWS), max(n, MIN_FRAMES)
        # padding rows consume 0 frames (their state is untouched) and follow the real ones, or precede them where
        # the real ones end the state (a one-row push on the last row); padding frames come after the real ones
        lead = max(0, first_row + rows - self.stream.batch_size)
        if (rows, frames) != (b, n):
            codes = F.pad(codes, (0, frames - n, 0, 0, lead, rows - b - lead))
            nv = F.pad(nv, (lead, rows - b - lead))
        bufs, pos = self.stream.rows(first_row - lead + rows, first_row - lead)
        wav = self._run(codes, nv, pos, bufs)
        return wav if (rows, frames) == (b, n) else wav[lead:lead + b, :, :n * self.samples_per_frame]

    def _run(self, codes: Tensor, nv: Tensor, pos: Tensor, bufs: dict) -> Tensor:
        from engines.codec.backend_compiled import inductor_cache, mark_dynamic

        if self._fn is None:
            self.warm()
        if self._fn is stream_step:
            return stream_step(self.decoder, codes, nv, pos, bufs)
        mark_dynamic(codes, nv, pos, bufs)
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return self._fn(self.decoder, codes, nv, pos, bufs)  # nothing to fall back to inside a capture
        try:
            with inductor_cache(self.cache_dir):
                return self._fn(self.decoder, codes, nv, pos, bufs)
        except Exception as exc:  # a recompile that fails: keep decoding, eagerly
            self._fall_back(exc)
            return stream_step(self.decoder, codes, nv, pos, bufs)

    def warm(self) -> float:
        """Compile the step now (or load it from the inductor cache); returns the seconds it took.

        Traces on scratch state of fixed shapes, so every process compiles the same graph (the
        one `build-engines` cached). On failure the codec falls back to eager (logged)."""
        if not self.compiled or self._fn is not None:
            return 0.0
        from engines.codec.backend_compiled import WARM_FRAMES, WARM_ROWS, compiled_step, inductor_cache, mark_dynamic

        t0 = time.perf_counter()
        fn = compiled_step()
        k = self.decoder.config.num_quantizers
        try:
            with torch.inference_mode(False):  # scratch state of the same kind as the real one
                scratch = StreamingCodecDecoder(self.decoder, WARM_ROWS)
            with torch.inference_mode(), inductor_cache(self.cache_dir):
                codes = torch.zeros(WARM_ROWS, k, WARM_FRAMES, dtype=torch.long, device=self.device)
                nv = torch.full((WARM_ROWS,), WARM_FRAMES, dtype=torch.long, device=self.device)
                bufs, pos = scratch.rows(WARM_ROWS)
                mark_dynamic(codes, nv, pos, bufs)
                fn(self.decoder, codes, nv, pos, bufs)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
        except Exception as exc:
            self._fall_back(exc)
            return time.perf_counter() - t0
        self._fn = fn
        self.compile_seconds = time.perf_counter() - t0
        log.info("codec step compiled (or loaded from %s) for %s %s in %.1f s",
                 self.cache_dir or "inductor's default cache", self.device, str(self.dtype).split(".")[-1],
                 self.compile_seconds)
        return self.compile_seconds

    def _fall_back(self, exc: BaseException) -> None:
        self.fallback_reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        log.warning("torch.compile of the codec failed (%s): using the eager torch codec", self.fallback_reason)
        self._fn, self.name = stream_step, "torch"

    def reset(self, rows: Tensor | None = None) -> None:
        if rows is not None and self.stream.batch_size != self.batch_size:
            spare = torch.zeros(self.stream.batch_size - self.batch_size, dtype=torch.bool)
            rows = torch.cat([row_mask(rows, self.batch_size), spare])
        self.stream.reset(rows)

    def flush(self, rows: Tensor | None = None) -> Tensor:
        self.reset(rows)
        return torch.zeros(self.batch_size, 1, 0, device=self.device, dtype=self.dtype)

    def move(self, src: int, dst: int) -> None:
        check_move(src, dst, self.batch_size)
        self.stream.move(src, dst)

    def close(self) -> None:
        self.stream.close()

    def __repr__(self) -> str:
        return f"TorchCodec({self.name}, batch={self.batch_size}, device={self.device}, dtype={self.dtype})"
