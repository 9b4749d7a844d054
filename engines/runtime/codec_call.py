"""The call itself of a codec lane (engines.runtime.codec_lane.CodecLane): codes gathered from the FrameStore,
decoded by the lane's codec backend (eagerly, on the lane's worker thread on the CPU, or as a captured device
graph per (rows, frames) bucket), the audio brought to host memory.

A mixin of CodecLane: it uses the lane's codec, frames (the FrameStore), graphs, pool, streams, worker, ring
buffers and call count.
"""
from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Optional

import numpy as np
import torch

log = logging.getLogger(__name__)


class LaneCalls:
    """One (rows, frames) call: gather, decode, to the host; its device graph."""

    def _gather_decode(self, ctrl: torch.Tensor, n: int, r0: int = 0) -> torch.Tensor:
        """ctrl [3, b] on the device -> wav [b, n * spf] float32: codes gathered from the FrameStore, decoded
        on the codec's rows [r0, r0 + b).

        Only each row's first `valid` frames are its codes; the rest of the window (bucket padding, an idle
        row on the scratch row, a reused row's old frames) holds whatever the decode step wrote there,
        EOS included (an id past the codebook): it is decoded as code 0 (its audio is dropped), on the
        device inside the call, so every backend and every captured graph sees only codes in range."""
        return self._decode(*self._gather(ctrl, n), r0)

    def _gather(self, ctrl: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes [b, K, n] with every code past a row's `valid` frames 0, valid [b]): see `_gather_decode`."""
        rows, start, valid = ctrl[0], ctrl[1], ctrl[2]
        t = torch.arange(n, device=ctrl.device)
        idx = (start[:, None] + t).clamp(max=self.frames.max_frames - 1)
        codes = self.frames.codes[rows[:, None], idx]  # [b, n, K]
        codes = codes.masked_fill((t[None, :] >= valid[:, None])[..., None], 0)  # [b, n, K]: past valid -> 0
        return codes.permute(0, 2, 1).long(), valid

    def _decode(self, codes: torch.Tensor, valid: torch.Tensor, r0: int = 0) -> torch.Tensor:
        wav = self.codec.push(codes, valid, first_row=r0) if r0 else self.codec.push(codes, valid)
        return wav[:, 0].float()

    def _decode_host(self, codes: torch.Tensor, valid: torch.Tensor, r0: int = 0):
        return self._to_host(self._decode(codes, valid, r0))

    def _to_host(self, wav: torch.Tensor):
        """Device wav -> host: numpy at once on the CPU, else a view of a pinned ring buffer filled behind the
        call's event (allocated once: pinned allocations are slow, and the audio is copied out on harvest)."""
        if not self.cuda:
            return wav.cpu().numpy()
        if not self._ring:
            size = max(self.max_frames_per_call, self.size) * self.spf
            self._ring = [torch.empty(size, dtype=torch.float32, pin_memory=True) for _ in range(self.max_inflight)]
        host = self._ring[self.calls % len(self._ring)][:wav.numel()].view(wav.shape)
        host.copy_(wav, non_blocking=True)
        return host

    @torch.no_grad()
    def _call(self, ctrl: torch.Tensor, b: int, n: int, r0: int = 0):
        """Launch the (b, n) call on rows [r0, r0 + b) on the lane's stream (current); returns its host wav
        (see `_to_host`)."""
        dev = self.frames.codes.device
        entry = self.graphs.get((b, n, r0), False) if self.use_graphs else None
        if entry is False:  # first use of this bucket: run it for real, then capture it for the next calls
            return self._to_host(self.capture(b, n, ctrl, r0))
        if entry is None and self.worker is not None:  # codes gathered now (the step goes on writing the
            return self.worker.submit(self._decode_host, *self._gather(ctrl, n), r0)  # store); decoded there
        if entry is None:
            return self._to_host(self._gather_decode(ctrl.to(dev, non_blocking=True), n, r0))
        graph, ctrl_in, out = entry
        ctrl_in.copy_(ctrl.pin_memory() if self.cuda else ctrl, non_blocking=True)
        graph.replay()
        return self._to_host(out)

    def capture(self, b: int, n: int, ctrl: Optional[torch.Tensor] = None, r0: int = 0) -> Optional[torch.Tensor]:
        """Capture the (b, n) call on rows [r0, r0 + b) in a device graph. With `ctrl`, also run it for real first
        (its device wav returned); without, a dry capture at start-up (all rows idle: the codec state is untouched).
        A capture that fails leaves that bucket eager (logged), never the lane broken."""
        from engines.device.graphs import make_graph

        if self.before_capture is not None:
            self.before_capture()
        dev = self.frames.codes.device
        wav = None
        with self._on_stream():
            if ctrl is not None:
                ctrl_in = ctrl.to(dev)
                wav = self._gather_decode(ctrl_in, n, r0)
            else:
                ctrl_in = torch.zeros(3, b, dtype=torch.long, device=dev)
                ctrl_in[0].fill_(self.frames.trash)
                self._gather_decode(ctrl_in, n, r0)  # warm-up (compile, autotune) with every row idle
            if self.pool is None and self.cuda:
                self.pool = torch.cuda.graph_pool_handle()  # one pool for the lane: its calls never overlap
            graph = make_graph(dev, self.pool, self._own_stream)  # its own stream: its own library workspaces
            try:
                out = graph.capture(lambda: self._gather_decode(ctrl_in, n, r0), warmup=0)
            except RuntimeError as exc:
                log.warning("%s codec lane: capturing the %d x %d call from row %d failed (%s); it runs uncaptured",
                            self.name, b, n, r0, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                self.graphs[(b, n, r0)] = None
                return wav
        self.graphs[(b, n, r0)] = (graph, ctrl_in, out)
        log.debug("captured %s codec lane graph batch=%d frames=%d from row %d", self.name, b, n, r0)
        return wav

    def bench_call(self, b: int, n: int) -> np.ndarray:
        """One (b, n) call with every row decoding n frames of the scratch row, waited for (benchmarks: the
        cost of a call; the rows' stream state is reset when a member next takes them). Lane idle only.
        The scratch row is zeroed first: free slots' steps write any id there, EOS included."""
        if self.members or self._inflight:
            raise RuntimeError("bench_call needs an idle lane")
        ctrl = torch.zeros(3, b, dtype=torch.long)
        ctrl[0].fill_(self.frames.trash)
        ctrl[2].fill_(n)
        with self._on_stream():
            self.frames.codes[self.frames.trash].zero_()
            wav = self._call(ctrl, b, n)
        self.calls += 1
        if isinstance(wav, Future):
            wav = wav.result()
        if self.stream is not None:
            self.stream.synchronize()
        elif self.cuda:
            torch.cuda.synchronize(self.frames.codes.device)
        return wav.numpy().copy() if isinstance(wav, torch.Tensor) else wav
