"""Per-request output (StreamHandle) and the slot-batched streaming codec (CodecStreams)."""
from __future__ import annotations

import logging
import queue
import time
from typing import Optional

import numpy as np
import torch

from engines.api import SynthesisResult

from engines.runtime.scheduler import pick_bucket

log = logging.getLogger(__name__)
_END = object()


class StreamHandle:
    """One request's audio as it is made: iterate for float32 PCM chunks; `cancel()` frees its slot."""

    def __init__(self, runner, sample_rate: int):
        self._runner, self.sample_rate = runner, sample_rate
        self._q: queue.Queue = queue.Queue()
        self.created = time.perf_counter()
        self.ttfa_s: Optional[float] = None
        self.samples = 0
        self.cancelled = False
        self.done = False
        self.error: Optional[BaseException] = None
        self.finished_by_eos = False
        self._codes: list[torch.Tensor] = []
        self._consumed: list[np.ndarray] = []
        self.on_done = None  # optional callback(handle), called from the runner thread at the end

    @property
    def audio_seconds(self) -> float:
        return self.samples / self.sample_rate

    def cancel(self) -> None:
        self.cancelled = True
        self._runner.wake()

    def __iter__(self):
        while True:
            item = self._q.get()
            if item is _END:
                if self.error is not None:
                    raise self.error
                return
            self._consumed.append(item)
            yield item

    def result(self, timeout: Optional[float] = None) -> SynthesisResult:
        """Wait for the end and return the whole audio (chunks not yet iterated included)."""
        for _ in self:
            pass
        audio = np.concatenate(self._consumed) if self._consumed else np.zeros(0, np.float32)
        codes = torch.stack(self._codes).numpy() if self._codes else np.zeros((0, 16), np.int64)
        return SynthesisResult(audio=audio, sample_rate=self.sample_rate, codes=codes,
                               finished_by_eos=self.finished_by_eos)

    # called by the runner thread
    def add_codes(self, frame: torch.Tensor) -> None:
        self._codes.append(frame)

    def add_audio(self, audio: np.ndarray) -> None:
        if audio.size == 0:
            return
        if self.ttfa_s is None:
            self.ttfa_s = time.perf_counter() - self.created
        self.samples += audio.size
        self._q.put(audio)

    def finish(self) -> None:
        if not self.done:
            self.done = True
            self._q.put(_END)
            if self.on_done is not None:
                self.on_done(self)

    def fail(self, exc: BaseException) -> None:
        if not self.done:
            self.error = exc
            self.finish()


class CodecStreams:
    """Streaming codec over the slot table: row i decodes the frames of the request in slot i.

    Frames wait per slot until a call is due: as soon as any slot has reached its chunk target (1
    frame for the first chunk, then doubling up to `max_chunk`) or has finished, one batched call
    decodes every slot's pending frames. Reference codes of a cloned voice are decoded first as
    context and their audio dropped, as the official package does.

    `codec` is a CodecDecoder (decoded by the eager torch codec, the default) or a codec backend
    with the interface of engines.codec.backend (torch, torch-compiled, ONNX Runtime, TensorRT;
    see engines.codec.build.runtime_codec) holding at least `n_slots` streams. A call pushes the first
    b rows, b the batch bucket of the active slots. With `use_graphs` and a graphable backend, each
    (batch, frames) bucket is captured once in a device graph and replayed after.
    """

    def __init__(self, codec, n_slots: int, first_chunk: int, max_chunk: int, sample_rate: int,
                 use_graphs: bool = False):
        from engines.codec.backend_torch import TorchCodec
        from engines.codec.decoder import CodecDecoder

        if isinstance(codec, CodecDecoder):
            codec = TorchCodec(codec, n_slots)
        if codec.batch_size < n_slots:
            raise ValueError(f"the {codec.name} codec holds {codec.batch_size} streams, the runner has "
                             f"{n_slots} slots: build it with batch_size >= {n_slots}")
        self.codec = codec
        self.use_graphs = use_graphs
        if use_graphs and not getattr(codec, "graphable", False):
            log.info("the %s codec is not graph-captured (runs as is)", codec.name)
        self.graphs: dict = {}  # (b, n) -> (graph, codes_in, valid_in, wav_out)
        self._pool = None
        self.before_capture = None  # called before a new graph is captured (the runner drains its step)
        self.spf = codec.samples_per_frame
        self.num_quantizers = self._num_quantizers(codec)
        self.first, self.max_chunk = first_chunk, max_chunk
        self.buckets = tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if b < n_slots) + (n_slots,)
        self.n_slots = n_slots
        self.pending: list[list[torch.Tensor]] = [[] for _ in range(n_slots)]
        self.target = [first_chunk] * n_slots
        self.discard = [0] * n_slots

    @staticmethod
    def _num_quantizers(codec) -> int:
        dec = getattr(codec, "decoder", None)
        return dec.config.num_quantizers if dec is not None else codec.num_quantizers

    @property
    def graphed(self) -> bool:
        return self.use_graphs and getattr(self.codec, "graphable", False)

    def start(self, slot: int, ref_codes: Optional[torch.Tensor]) -> None:
        mask = torch.zeros(self.codec.batch_size, dtype=torch.bool, device=self.codec.device)
        mask[slot] = True
        self.codec.reset(mask)
        self.pending[slot] = list(ref_codes.cpu()) if ref_codes is not None else []
        self.discard[slot] = 0 if ref_codes is None else ref_codes.shape[0] * self.spf
        self.target[slot] = self.first + len(self.pending[slot])

    def push_frame(self, slot: int, frame: torch.Tensor) -> None:
        self.pending[slot].append(frame)

    def n_pending(self, slot: int) -> int:
        return len(self.pending[slot])

    def run(self, n_active: int, finished: list[bool]) -> list[tuple[int, np.ndarray]]:
        """Decode pending frames when a call is due -> [(slot, audio)]."""
        due = any(len(self.pending[i]) >= self.target[i] or (finished[i] and self.pending[i])
                  for i in range(n_active))
        if not due:
            return []
        b = pick_bucket(n_active, self.buckets)
        key = (b, 1 << (max(len(self.pending[i]) for i in range(n_active)) - 1).bit_length())
        if self.graphed and key not in self.graphs and self.before_capture is not None:
            self.before_capture()  # may add frames: count after it
        counts = [len(self.pending[i]) for i in range(n_active)]
        n = 1 << (max(counts) - 1).bit_length()  # frame-count bucket
        codes = torch.zeros(b, self.num_quantizers, n, dtype=torch.long)
        for i in range(n_active):
            if counts[i]:
                codes[i, :, :counts[i]] = torch.stack(self.pending[i], dim=1)
        valid = torch.zeros(b, dtype=torch.long)
        valid[:n_active] = torch.tensor(counts)
        wav = self._push(codes, valid, b)  # [b, n * spf]
        out = []
        for i in range(n_active):
            if not counts[i]:
                continue
            audio = wav[i, : counts[i] * self.spf]
            if self.discard[i]:
                cut = min(self.discard[i], audio.shape[0])
                audio, self.discard[i] = audio[cut:], self.discard[i] - cut
            out.append((i, audio))
            self.pending[i] = []
            self.target[i] = min(max(self.target[i] * 2, self.first), self.max_chunk)
        return out

    @torch.no_grad()
    def _push(self, codes: torch.Tensor, valid: torch.Tensor, b: int) -> np.ndarray:
        """Decode codes [b, K, n] for rows [0, b), advancing their state -> wav [b, n * spf] (numpy)."""
        dev = self.codec.device
        if not self.graphed:
            return self.codec.push(codes.to(dev), valid.to(dev))[:, 0].float().cpu().numpy()
        key = (b, codes.shape[-1])
        entry = self.graphs.get(key)
        if entry is None:  # first use of this bucket: run it for real, then capture it for the next calls
            from engines.device.graphs import make_graph

            codes_in, valid_in = codes.to(dev), valid.to(dev)
            wav = self.codec.push(codes_in, valid_in)[:, 0].float().cpu().numpy()
            if self._pool is None and dev.type == "cuda":
                self._pool = torch.cuda.graph_pool_handle()
            graph = make_graph(dev, self._pool)
            out = graph.capture(lambda: self.codec.push(codes_in, valid_in), warmup=0)
            self.graphs[key] = (graph, codes_in, valid_in, out)
            log.debug("captured %s codec graph batch=%d frames=%d", self.codec.name, b, codes.shape[-1])
            return wav
        graph, codes_in, valid_in, out = entry
        codes_in.copy_(codes, non_blocking=True)
        valid_in.copy_(valid, non_blocking=True)
        graph.replay()
        return out[:, 0].float().cpu().numpy()

    def move(self, src: int, dst: int) -> None:
        self.codec.move(src, dst)
        for lst in (self.pending, self.target, self.discard):
            lst[dst] = lst[src]
        self.pending[src] = []

    def reset_all(self) -> None:
        self.codec.reset()
        self.pending = [[] for _ in self.pending]
