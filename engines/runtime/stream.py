"""Per-request output and the frames on the device.

- `StreamHandle`: one request's audio as it is made (iterate for PCM chunks); `submit_waiting` and
  `collect`: a batch of requests submitted to an engine (waiting while its queue is full) and their results.
- `FrameStore`: every in-flight request's codes on the device, one row per request from admission until
  its audio is decoded. The decode step writes each frame there; the codec lanes
  (engines.runtime.codec_lane) read from there. No code frame crosses to the host on the way to audio
  (the host only counts frames).
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Optional

import numpy as np
import torch

from engines.api import SynthesisResult
from engines.model.errors import EngineBusy

_END = object()


def submit_waiting(submit, requests: list, priority: int, wait=lambda: time.sleep(0.02)) -> list[StreamHandle]:
    """`submit(request, priority)` each request in order, calling `wait()` while the queue is full."""
    handles = []
    for req in requests:
        while True:
            try:
                handles.append(submit(req, priority))
                break
            except EngineBusy:
                wait()
    return handles


def collect(handles) -> list[SynthesisResult]:
    """Every handle's whole result, in order; the first error is raised once all have ended."""
    results, error = [], None
    for h in handles:
        try:
            results.append(h.result())
        except Exception as exc:  # noqa: BLE001 - reported after every handle has ended
            error = error or exc
    if error is not None:
        raise error
    return results


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
        # audio the whole result starts with, before the chunks, set when the request ends: a cloned voice's last
        # reference sample where the official whole-file cut keeps it (engines.runtime.codec_lane.CodecLane._lead)
        self.lead: Optional[np.ndarray] = None
        self._consumed: list[np.ndarray] = []
        self._ended = False  # the end marker was read (iterating again yields nothing more)
        self.on_done = None  # optional callback(handle), called from the runner thread at the end
        self.marks: dict = {}  # perf_counter times set by the runner: admit, slot, frame (first), audio (first)
        self._lock = threading.Lock()
        self._listener = None  # (event loop, asyncio.Queue) once a coroutine follows it (`chunks`)

    @property
    def audio_seconds(self) -> float:
        return self.samples / self.sample_rate

    def cancel(self) -> None:
        self.cancelled = True
        self._runner.wake()

    def __iter__(self):
        while not self._ended:
            item = self._q.get()
            if item is _END:
                self._ended = True
                break
            self._consumed.append(item)
            yield item
        if self.error is not None:
            raise self.error

    async def chunks(self):
        """Iterate the chunks from asyncio: the producing thread hands each one to the event loop (no thread
        waits per stream). Raises the request's error at the end. Either this or plain iteration, once."""
        loop = asyncio.get_running_loop()
        aq: asyncio.Queue = asyncio.Queue()
        with self._lock:
            while True:  # what came before we listened
                try:
                    aq.put_nowait(self._q.get_nowait())
                except queue.Empty:
                    break
            self._listener = (loop, aq)
        while True:
            item = await aq.get()
            if item is _END:
                self._ended = True
                break
            yield item
        if self.error is not None:
            raise self.error

    def _put(self, item) -> None:
        with self._lock:
            if self._listener is None:
                self._q.put(item)
            else:
                loop, aq = self._listener
                try:
                    loop.call_soon_threadsafe(aq.put_nowait, item)
                except RuntimeError:  # its event loop has closed (shutting down): nobody listens any more
                    pass

    def result(self, timeout: Optional[float] = None) -> SynthesisResult:
        """Wait for the end and return the whole audio (chunks not yet iterated included, `lead` first)."""
        for _ in self:
            pass
        parts = ([] if self.lead is None else [self.lead]) + self._consumed
        audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        codes = self.codes if self.codes is not None else np.zeros((0, 16), np.int64)
        return SynthesisResult(audio=audio, sample_rate=self.sample_rate, codes=codes,
                               finished_by_eos=self.finished_by_eos)

    # called by the runner thread
    def restart(self) -> None:
        """Its request starts over (the engine gave its slot to a stream): forget the audio made so far."""
        with self._lock:
            while True:
                try:
                    self._q.get_nowait()
                except queue.Empty:
                    break
        self._consumed.clear()
        self.samples, self.ttfa_s, self.codes, self.lead = 0, None, None, None

    def add_audio(self, audio: np.ndarray) -> None:
        if audio.size == 0:
            return
        if self.ttfa_s is None:
            self.marks["audio"] = time.perf_counter()
            self.ttfa_s = self.marks["audio"] - self.created
        self.samples += audio.size
        self._put(audio)

    def finish(self) -> None:
        if not self.done:
            self.done = True
            self._put(_END)
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
            self.codes[row, :r] = ref_codes[:r].to(self.codes.device, torch.int32, non_blocking=True)
        return row

    def give(self, row: int) -> None:
        self._free.append(row)

