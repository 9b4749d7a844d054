"""Per-request output and the codec side of the runtime: frames on the device, codec lanes.

- `StreamHandle`: one request's audio as it is made (iterate for PCM chunks).
- `FrameStore`: every in-flight request's codes on the device, one row per request from admission until
  its audio is decoded. The decode step writes each frame there; the codec reads from there. No code
  frame crosses to the host on the way to audio (the host only counts frames).
- `CodecLane`: a contiguous set of codec stream rows with its own chunk policy and its own codec
  backend instance. The runner has two: streams (priority 0: a small first chunk, then doubling, so
  audio starts early and later chunks are cheap) and batch work (large chunks, frames-per-call capped
  so one call's memory stays bounded). A lane call decodes its first b members (b a batch bucket) for
  n frames (a frame bucket) in one batched call, captured once per (b, n) in a device graph on CUDA;
  the codes are gathered from the FrameStore inside the call. A stream's chunk never waits for a big
  batch call and a batch call never runs for one stream's frame.
"""
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
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


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
        self.codes: Optional[np.ndarray] = None  # [frames, 16], set when the request ends
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
        codes = self.codes if self.codes is not None else np.zeros((0, 16), np.int64)
        return SynthesisResult(audio=audio, sample_rate=self.sample_rate, codes=codes,
                               finished_by_eos=self.finished_by_eos)

    # called by the runner thread
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


class FrameStore:
    """Codes `[rows + 1, max_frames, K]` (int32) on the device; row `trash` takes the writes of free slots."""

    def __init__(self, rows: int, max_frames: int, groups: int, device):
        self.codes = torch.zeros(rows + 1, max_frames, groups, dtype=torch.int32, device=device)
        self.max_frames = max_frames
        self.trash = rows
        self._free = list(range(rows - 1, -1, -1))

    @property
    def n_free(self) -> int:
        return len(self._free)

    def take(self, ref_codes: Optional[torch.Tensor] = None) -> int:
        """A row for a new request, starting with its reference codes `[R, K]` (voice clone) if any."""
        row = self._free.pop()
        if ref_codes is not None and ref_codes.shape[0]:
            r = min(ref_codes.shape[0], self.max_frames)
            self.codes[row, :r] = ref_codes[:r].to(self.codes.device, torch.int32)
        return row

    def give(self, row: int) -> None:
        self._free.append(row)

    def read(self, row: int, start: int, end: int) -> np.ndarray:
        """Frames [start, end) of a row as int64 numpy (a device sync: once per finished request)."""
        return self.codes[row, start:end].to("cpu", torch.int64).numpy()


class Member:
    """A request's place in a codec lane; `row` in the lane moves when others leave."""

    __slots__ = ("frame_row", "n_ref", "emitted", "decoded", "target", "discard", "finished", "dropped", "seq")

    def __init__(self, seq, frame_row: int, n_ref: int, first: int, spf: int):
        self.seq, self.frame_row, self.n_ref = seq, frame_row, n_ref
        self.emitted = n_ref  # frames in the FrameStore row (reference codes first)
        self.decoded = 0
        self.target = first + n_ref
        self.discard = n_ref * spf  # samples of reference audio to drop
        self.finished = False  # no more frames will come
        self.dropped = False  # cancelled: decode nothing more

    @property
    def pending(self) -> int:
        return self.emitted - self.decoded


class CodecLane:
    """Codec stream rows [0, size) of one backend instance, members packed at the front.

    Chunk policy: a call is due when a member has `target` frames pending (growing from `first` by
    doubling up to `max_chunk`) or has finished with frames pending. A call covers members [0, b) for
    n = the frame bucket of the largest pending count, capped so that b * n <= `frames_per_call`.
    """

    def __init__(self, name: str, codec, frames: FrameStore, first: int, max_chunk: int, frames_per_call: int,
                 use_graphs: bool, pool=None, lazy_finish: bool = False):
        self.name, self.codec, self.frames = name, codec, frames
        self.first, self.max_chunk, self.frames_per_call = first, max_chunk, frames_per_call
        # lazy_finish: a finished member's last frames wait for the next call that is due anyway (batch
        # work: no call of b rows for one member's tail) unless the lane is full or everyone has finished
        self.lazy_finish = lazy_finish
        self.spf = codec.samples_per_frame
        self.k = self._num_quantizers(codec)
        self.size = codec.batch_size
        self.buckets = tuple(b for b in BUCKETS if b < self.size) + (self.size,)
        self.members: list[Member] = []
        self.use_graphs = use_graphs and getattr(codec, "graphable", False)
        if use_graphs and not self.use_graphs:
            log.info("the %s codec is not graph-captured (runs as is)", codec.name)
        self.graphs: dict = {}  # (b, n) -> (graph, ctrl_in, wav_out)
        self.pool = pool
        self.before_capture = None  # called before a new graph is captured (the runner drains its step)
        self.calls = 0

    @staticmethod
    def _num_quantizers(codec) -> int:
        dec = getattr(codec, "decoder", None)
        return dec.config.num_quantizers if dec is not None else codec.num_quantizers

    @property
    def free(self) -> int:
        return self.size - len(self.members)

    def add(self, seq, frame_row: int, n_ref: int) -> Member:
        m = Member(seq, frame_row, n_ref, self.first, self.spf)
        mask = torch.zeros(self.size, dtype=torch.bool)
        mask[len(self.members)] = True
        self.codec.reset(mask)
        self.members.append(m)
        return m

    def chunk_cap(self, b: int) -> int:
        """Largest frame bucket a call over b rows may use."""
        cap = max(1, min(self.max_chunk, self.frames_per_call // b))
        return 1 << (cap.bit_length() - 1)

    def _is_due(self, m: Member, cap: int, flush: bool) -> bool:
        return m.dropped or m.pending >= min(m.target, cap) or (m.finished and m.pending > 0 and flush)

    def _flush(self) -> bool:
        """Whether finished members' tails are decoded now (always, unless lazy_finish)."""
        return not self.lazy_finish or self.free == 0 or all(m.finished for m in self.members)

    def due(self) -> bool:
        cap = self.chunk_cap(pick_bucket(max(len(self.members), 1), self.buckets))
        flush = self._flush()
        return any(self._is_due(m, cap, flush) for m in self.members)

    def run(self) -> tuple[list, list]:
        """Decode when a call is due -> ([(member, audio)], [members whose audio is complete]).

        The call's frame count n is set by the due members (the bucket of their chunk, at most the cap
        for b rows); every member decodes up to n of its pending frames in the same call (idle rows cost
        as much as busy ones, so they may as well advance). Completed (and dropped) members leave the
        lane (the last member moves into the hole)."""
        if not self.members:
            return [], []
        b = pick_bucket(len(self.members), self.buckets)
        cap = self.chunk_cap(b)
        flush = self._flush()
        due = [m for m in self.members if self._is_due(m, cap, flush)]
        if not due:
            return [], []
        out = []
        want = max((min(m.pending, m.target) for m in due if not m.dropped and m.pending), default=0)
        if want:
            n = min(cap, 1 << (want - 1).bit_length())
            ctrl = torch.zeros(3, b, dtype=torch.long)  # frame row, first frame, frames this call
            ctrl[0].fill_(self.frames.trash)
            for i, m in enumerate(self.members):
                ctrl[0, i], ctrl[1, i] = m.frame_row, m.decoded
                ctrl[2, i] = 0 if m.dropped else min(m.pending, n)
            wav = self._call(ctrl, b, n)  # [b, n * spf] float32 numpy
            self.calls += 1
            for i, m in enumerate(self.members):
                got = int(ctrl[2, i])
                if not got:
                    continue
                audio = wav[i, :got * self.spf]
                if m.discard:
                    cut = min(m.discard, audio.shape[0])
                    audio, m.discard = audio[cut:], m.discard - cut
                m.decoded += got
                m.target = min(max(m.target * 2, self.first), self.max_chunk)
                out.append((m, audio))
        done = [m for m in self.members if m.dropped or (m.finished and not m.pending)]
        for m in done:
            self._remove(m)
        return out, done

    def _remove(self, m: Member) -> None:
        i, last = self.members.index(m), len(self.members) - 1
        if i != last:
            self.codec.move(last, i)
            self.members[i] = self.members[last]
        self.members.pop()

    def reset_all(self) -> None:
        self.codec.reset()
        self.members.clear()

    # ----- the call itself --------------------------------------------------------------------------
    def _gather_decode(self, ctrl: torch.Tensor, n: int) -> torch.Tensor:
        """ctrl [3, b] on the device -> wav [b, n * spf] float32: codes gathered from the FrameStore."""
        rows, start, valid = ctrl[0], ctrl[1], ctrl[2]
        idx = (start[:, None] + torch.arange(n, device=ctrl.device)).clamp(max=self.frames.max_frames - 1)
        codes = self.frames.codes[rows[:, None], idx]  # [b, n, K]
        wav = self.codec.push(codes.permute(0, 2, 1).long(), valid)
        return wav[:, 0].float()

    @torch.no_grad()
    def _call(self, ctrl: torch.Tensor, b: int, n: int) -> np.ndarray:
        dev = self.frames.codes.device
        if not self.use_graphs:
            return self._gather_decode(ctrl.to(dev), n).cpu().numpy()
        entry = self.graphs.get((b, n))
        if entry is None:  # first use of this bucket: run it for real, then capture it for the next calls
            return self.capture(b, n, ctrl)
        graph, ctrl_in, out = entry
        ctrl_in.copy_(ctrl, non_blocking=True)
        graph.replay()
        return out.cpu().numpy()

    def capture(self, b: int, n: int, ctrl: Optional[torch.Tensor] = None) -> Optional[np.ndarray]:
        """Capture the (b, n) call in a device graph. With `ctrl`, also run it for real first (its audio
        returned); without, a dry capture at start-up (all rows idle: the codec state is untouched)."""
        from engines.device.graphs import make_graph

        if self.before_capture is not None:
            self.before_capture()
        dev = self.frames.codes.device
        wav = None
        if ctrl is not None:
            ctrl_in = ctrl.to(dev)
            wav = self._gather_decode(ctrl_in, n).cpu().numpy()
        else:
            ctrl_in = torch.zeros(3, b, dtype=torch.long, device=dev)
            ctrl_in[0].fill_(self.frames.trash)
            self._gather_decode(ctrl_in, n)  # warm-up (compile, autotune) with every row idle
        if self.pool is None and dev.type == "cuda":
            self.pool = torch.cuda.graph_pool_handle()
        graph = make_graph(dev, self.pool)
        out = graph.capture(lambda: self._gather_decode(ctrl_in, n), warmup=0)
        self.graphs[(b, n)] = (graph, ctrl_in, out)
        log.debug("captured %s codec lane graph batch=%d frames=%d", self.name, b, n)
        return wav

    def bench_call(self, b: int, n: int) -> np.ndarray:
        """One (b, n) call with every row decoding n frames of the scratch row (benchmarks: the cost of a
        call; the rows' stream state is reset when a member next takes them). Call while the lane is idle."""
        if self.members:
            raise RuntimeError("bench_call needs an idle lane")
        ctrl = torch.zeros(3, b, dtype=torch.long)
        ctrl[0].fill_(self.frames.trash)
        ctrl[2].fill_(n)
        return self._call(ctrl, b, n)

    def shapes(self) -> list[tuple[int, int]]:
        """Every (b, n) call this lane can make (what start-up captures)."""
        out = []
        for b in self.buckets:
            n = 1
            while n <= self.chunk_cap(b):
                out.append((b, n))
                n *= 2
        return out
