"""Codec lanes: stored code frames -> PCM, batched across requests, on their own device stream.

A `CodecLane` is a contiguous set of codec stream rows with its own chunk policy, its own codec
backend instance and, on CUDA, its own CUDA stream and graph memory pool. The runner has two:
streams (priority 0 requests: a small first chunk, then doubling, so audio starts early and later
chunks are cheap; a high-priority CUDA stream) and batch work (large chunks, frames per call capped so
one call's memory stays bounded). A lane call decodes its first b members (b a batch bucket) for n
frames (a frame bucket) in one batched call, captured once per (b, n) in a device graph on CUDA; the
codes are gathered from the FrameStore inside the call.

Calls overlap the decode steps: they run on the lane's stream, and their audio is copied to pinned
host memory behind an event. A lane with `wait=True` (streams) waits at once for a call that carries
some request's first audio (its time to first audio), which costs the host only that call (the next
decode step is already queued on the GPU), or audio a listener is about to run out of (`urgent`); its
other calls, like every batch-lane call, are collected on later `run()`s once finished, so a long call
does not hold up the loop (admission, the next step). A member's FrameStore row is handed back only when
the call that read its last frames has finished.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future
from contextlib import nullcontext
from typing import Optional

import numpy as np
import torch

from engines.model.voice import reference_cut
from engines.runtime.codec_call import LaneCalls
from engines.runtime.codec_member import Call, Member
from engines.runtime.host_worker import HostCall, HostWorker
from engines.runtime.scheduler import pick_bucket

log = logging.getLogger(__name__)
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class CodecLane(LaneCalls):
    """Codec stream rows [0, size) of one backend instance, members packed at the front (a request's place:
    engines.runtime.codec_member.Member; the call itself: engines.runtime.codec_call.LaneCalls).

    Chunk policy: a call is due when a member has `target` frames pending (growing from `first` by
    doubling up to `max_chunk`) or has finished with frames pending. A call covers members [0, b) for
    n = the frame bucket of the largest pending count, capped so that b * n <= `frames_per_call`.

    Windows (`window_frames` > 0, a backend with `row_windows`): while the members are more than a call of
    `window_frames` frames a row may carry (`window_rows`), a call covers one window of them instead, rows
    [r0, r0 + window_rows), the windows taken in turn: each row's calls then carry up to `window_frames`
    frames, not the few that all rows at once may (a call's cost per row has a fixed part, the stream
    state it reads and writes: at 256 rows x 4 frames a frame-row costs 1.28x what it does at 64 x 16).
    """

    def __init__(self, name: str, codec, frames, first: int, max_chunk: int, frames_per_call: int,
                 use_graphs: bool, pool=None, lazy_finish: bool = False, wait: bool = True, stream=None,
                 max_inflight: int = 2, worker_threads: int = 0, window_frames: int = 0):
        self.name, self.codec, self.frames = name, codec, frames
        self.first, self.max_chunk, self.frames_per_call = first, max_chunk, frames_per_call
        self.max_frames_per_call = frames_per_call  # frames_per_call may be lowered later, never raised above
        # lazy_finish: a finished member's last frames wait for the next call that is due anyway (batch
        # work: no call of b rows for one member's tail) unless the lane is full or everyone has finished
        self.lazy_finish = lazy_finish
        self.spf = codec.samples_per_frame
        self.k = self._num_quantizers(codec)
        self.size = codec.batch_size
        self.buckets = tuple(b for b in BUCKETS if b < self.size) + (self.size,)
        self.window_frames = window_frames if getattr(codec, "row_windows", False) else 0
        self._next_window = 0  # the window the next call looks at first
        self.window_calls = 0  # calls over a window of the members
        self.members: list[Member] = []
        self.use_graphs = use_graphs and getattr(codec, "graphable", False)
        # CPU, eager: calls decode exactly the members and frames due (no graph wants a bucket; padding is work)
        self.exact = frames.codes.device.type == "cpu" and not getattr(codec, "compiled", False)
        if use_graphs and not self.use_graphs:
            log.info("the %s codec is not graph-captured (runs as is)", codec.name)
        self.graphs: dict = {}  # (b, n, r0) -> (graph, ctrl_in, wav_out), or None: runs eagerly (capture failed)
        self.pool = pool
        self.before_capture = None  # called before a new graph is captured (the runner drains its step)
        self.urgent = None  # (member) -> True when its listener is about to run dry: the loop waits for its call
        self.before_inline = None  # called before a waited one-row call runs in the caller's thread (CPU threads)
        self.inline = True  # a CPU lane's waited one-row calls run in the caller's thread (off: A/B runs)
        self.inline_calls = 0  # calls run in the caller's thread
        self.calls = 0
        self.wait_s = 0.0  # host time spent waiting for calls to finish
        dev = frames.codes.device
        self.cuda = dev.type == "cuda"
        # its own stream (given by the runner, distinct from the decode graphs' capture stream)
        self._own_stream = (stream or torch.cuda.Stream(dev)) if self.cuda else None
        self._wait, self.max_inflight = wait, max_inflight
        self._inflight: deque[Call] = deque()
        self._ring: list = []  # pinned host buffers for call outputs, one per call that may be in flight
        # CPU: `worker_threads` > 0 runs the codec on a thread of its own (HostWorker), else in the caller's
        self.worker = HostWorker(name, worker_threads) if worker_threads > 0 and dev.type == "cpu" else None
        self.use_stream(True)

    def use_stream(self, on: bool) -> None:
        """Run calls on the lane's own stream, overlapping the decode steps (on: the default), or on the
        caller's stream, each waited for (off: the behaviour before lanes had streams; for A/B runs)."""
        if self._inflight:
            raise RuntimeError("use_stream needs a lane with no call in flight")
        self.stream = self._own_stream if on else None
        self.wait = self._wait if on else True

    @staticmethod
    def _num_quantizers(codec) -> int:
        dec = getattr(codec, "decoder", None)
        return dec.config.num_quantizers if dec is not None else codec.num_quantizers

    def _on_stream(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()

    @property
    def free(self) -> int:
        return self.size - len(self.members)

    @property
    def busy(self) -> bool:
        """Members to decode, or calls whose audio has not been handed out yet."""
        return bool(self.members or self._inflight)

    @property
    def running(self) -> bool:
        """A call launched and not finished yet (a CPU lane's: its threads are decoding it)."""
        return any(not c.ready() for c in self._inflight)

    @property
    def active(self) -> bool:
        """Calls in flight, a member to complete, or a call due (a lane whose members all wait for frames
        is not active)."""
        return bool(self._inflight) or any(m.finished or m.dropped for m in self.members) or self.due()

    def add(self, seq, frame_row: int, n_ref: int) -> Member:
        m = Member(seq, frame_row, n_ref, self.first, self.spf)
        mask = torch.zeros(self.size, dtype=torch.bool)
        mask[len(self.members)] = True
        with self._on_stream():  # after the lane's earlier calls, which may still use the row
            self._in_order(self.codec.reset, mask)
        self.members.append(m)
        return m

    def _in_order(self, fn, *args) -> None:
        """Codec state work (a row reset or move), after the calls launched before it: on the worker's
        thread where there is one (in its order), else now."""
        if self.worker is not None:
            self.worker.later(fn, *args)
        else:
            fn(*args)

    def chunk_cap(self, b: int, frames_per_call: Optional[int] = None) -> int:
        """Largest frame bucket a call over b rows may use (now, or at `frames_per_call`)."""
        cap = max(1, min(self.max_chunk, (frames_per_call or self.frames_per_call) // b))
        return cap if self.exact else 1 << (cap.bit_length() - 1)

    def _rows(self, members: int) -> int:
        """Rows a call over `members` members decodes: their batch bucket, or exactly them (`exact`)."""
        return members if self.exact else pick_bucket(members, self.buckets)

    def _is_due(self, m: Member, cap: int, flush: bool) -> bool:
        return (m.dropped or m.pending >= min(m.target, cap) or (m.finished and m.pending > 0 and flush)
                or (m.stalled and m.pending > 0))

    def _flush(self) -> bool:
        """Whether finished members' tails are decoded now (always, unless lazy_finish)."""
        return not self.lazy_finish or self.free == 0 or all(m.finished for m in self.members)

    def due(self) -> bool:
        return bool(self._pick(self._flush(), peek=True)[4])

    @property
    def window_rows(self) -> int:
        """Rows of a window call (0: no windows): the largest power of two whose calls may carry `window_frames`
        frames a row at the lane's largest call."""
        w = self.max_frames_per_call // self.window_frames if self.window_frames else 0
        return 1 << (w.bit_length() - 1) if w >= 2 and w < self.size else 0

    @property
    def windowed(self) -> bool:
        """Whether the next call covers one window of the members, not all of them."""
        return len(self.members) > self.window_rows > 0

    def _window_starts(self, members: int) -> list[int]:
        """First rows of the windows over `members` members (the last one ends at the lane's last row)."""
        w = self.window_rows
        return sorted({min(r, self.size - w) for r in range(0, members, w)})

    def _pick(self, flush: bool, peek: bool = False) -> tuple:
        """(first row r0, the members the call covers, its rows b, its frame cap, those due) of the next call:
        every member (rows [0, b)), or, with more members than a window's rows, the next window in turn that
        has a member due (none due: no members). `peek`: the turn does not move."""
        if not self.windowed:
            b = self._rows(max(len(self.members), 1))
            cap = self.chunk_cap(b)
            return 0, self.members, b, cap, [m for m in self.members if self._is_due(m, cap, flush)]
        w = self.window_rows
        starts, cap = self._window_starts(len(self.members)), self.chunk_cap(w)
        for j in range(len(starts)):
            k = (self._next_window + j) % len(starts)
            members = self.members[starts[k]:starts[k] + w]
            due = [m for m in members if self._is_due(m, cap, flush)]
            if due:
                if not peek:
                    self._next_window = k + 1
                return starts[k], members, len(members) if self.exact else w, cap, due
        return 0, [], 0, cap, []

    def run(self, block: bool = False) -> tuple[list, list]:
        """Launch a call when one is due, hand out what finished calls made -> ([(member, audio)], [members
        whose audio is complete]); `block` (or a lane that waits): wait for the calls in flight first.
        See `_launch` for what a call covers."""
        if len(self._inflight) < self.max_inflight:
            self._launch()
        return self._harvest(block=block or (self.wait and any(c.first or c.urgent for c in self._inflight)))

    def drain(self) -> tuple[list, list]:
        """Wait for every launched call and hand out its results (stop, failure)."""
        return self._harvest(block=True)

    def _launch(self) -> None:
        """One call if any member is due. The call's frame count n is set by the due members (the bucket of
        their chunk, at most the cap for b rows); every member decodes up to n of its pending frames in the
        same call (idle rows cost as much as busy ones, so they may as well advance). Completed (and
        dropped) members leave the lane now (the last member moves into the hole); they are reported
        complete when the call has finished."""
        if not self.members:
            return
        windowed = self.windowed  # (before the call: members that end leave below)
        r0, members, b, cap, due = self._pick(self._flush())
        if not due and not any(m.finished and not m.pending for m in self.members):
            return  # (a member that ended with every frame decoded still needs its completion below)
        call = Call()
        want = max((min(m.pending, m.target) for m in due if not m.dropped and m.pending), default=0)
        with self._on_stream():
            if want:
                n = min(cap, want if self.exact else 1 << (want - 1).bit_length())
                rows, starts, valid = [self.frames.trash] * b, [0] * b, [0] * b
                for i, m in enumerate(members):
                    rows[i], starts[i], valid[i] = m.frame_row, m.decoded, 0 if m.dropped else min(m.pending, n)
                ctrl = torch.tensor([rows, starts, valid], dtype=torch.long)
                news = [self._news(m, v * self.spf) for m, v in zip(members, valid)]
                if b == 1 and self.inline and self.worker is not None and self.wait and any(news):
                    call.wav = self._call_inline(ctrl, n, r0)
                else:
                    call.wav = self._call(ctrl, b, n, r0)
                if isinstance(call.wav, Future):  # on the worker's thread: collected like a CUDA call
                    call.event, call.wav = HostCall(call.wav), None
                self.calls += 1  # after _call: it picks the ring buffer by this count
                self.window_calls += windowed
                for i, m in enumerate(members):
                    got = valid[i] * self.spf
                    if not got:
                        continue
                    cut = min(m.discard, got)
                    if cut and cut == m.discard:  # its reference audio ends in this call: keep the last sample
                        call.tails.append((m, i, cut - 1))
                    m.discard -= cut
                    call.parts.append((m, i, cut, got))
                    if news[i] == "first":
                        call.first = m.heard = True
                    elif news[i] == "urgent":
                        call.urgent = True
                    m.decoded += valid[i]
                    m.target = min(max(m.target * 2, self.first), self.max_chunk)
            done = [m for m in self.members if m.dropped or (m.finished and not m.pending)]
            for m in done:
                if not m.dropped:
                    call.codes.append((m, self._codes_to_host(m)))
                self._remove(m)
            call.complete = done
            if self.cuda:
                call.event = torch.cuda.Event()
                call.event.record(self.stream)
        self._inflight.append(call)

    def _news(self, m: Member, got: int) -> Optional[str]:
        """What `got` new samples of member `m` (before its reference audio is cut off them) bring its listener:
        "first" (its first audio), "urgent" (audio it is about to run out of) or None. A lane that waits waits at
        once for a call that brings either (`run`)."""
        if got <= m.discard:  # nothing past the reference's audio
            return None
        if not m.heard:
            return "first"
        return "urgent" if self.urgent is not None and self.urgent(m) else None

    def _call_inline(self, ctrl: torch.Tensor, n: int, r0: int = 0):
        """A one-row call the loop would only wait for, run in the caller's thread instead of the worker's (CPU):
        a row decodes on one thread in the worker, while in the waiting loop's thread it gets the loop's
        threads (`before_inline` picks them: every core while no other lane's call runs). The worker's
        earlier work (calls, row resets and moves) finishes first, so the order is the worker's."""
        self.worker.join()
        self.worker.check()
        if self.before_inline is not None:
            self.before_inline()
        self.inline_calls += 1
        t0 = time.perf_counter()
        wav = self._decode_host(*self._gather(ctrl, n), r0)
        self.wait_s += time.perf_counter() - t0  # (the loop waited for it, as for a worker's call)
        return wav

    def _codes_to_host(self, m: Member) -> torch.Tensor:
        src = self.frames.codes[m.frame_row, m.n_ref:m.emitted]
        if not self.cuda:
            return src.clone()
        host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        host.copy_(src, non_blocking=True)
        return host

    def _harvest(self, block: bool) -> tuple[list, list]:
        out, complete = [], []
        if self.worker is not None:
            self.worker.check()
        while self._inflight and (block or self._inflight[0].ready()):
            call = self._inflight.popleft()
            if call.event is not None:
                t0 = time.perf_counter()
                call.event.synchronize()
                self.wait_s += time.perf_counter() - t0
                if isinstance(call.event, HostCall):
                    call.wav = call.event.future.result()
            pinned = isinstance(call.wav, torch.Tensor)  # a ring buffer the next calls reuse: copy out
            wav = call.wav.numpy() if pinned else call.wav
            for m, row, a, z in call.parts:
                if z > a:
                    out.append((m, wav[row, a:z].copy() if pinned else wav[row, a:z]))
            for m, row, at in call.tails:
                m.ref_tail = wav[row, at:at + 1].copy()
            for m, codes in call.codes:
                m.codes = codes.numpy().astype(np.int64)
                m.lead = self._lead(m)
            complete.extend(call.complete)
        if self.worker is not None:  # (a reset or move before the calls just waited for has run by now)
            self.worker.check()
        return out, complete

    def _lead(self, m: Member) -> Optional[np.ndarray]:
        """The reference audio a complete member's whole result keeps: its chunks were cut at n_ref * spf
        samples while its length was unknown; the official package cuts `reference_cut` samples off the
        whole decode, one less for some lengths: that last reference sample then starts the result."""
        keep = m.n_ref * self.spf - reference_cut(m.n_ref, m.emitted, m.emitted * self.spf)  # 0 or 1
        return m.ref_tail[-keep:] if keep > 0 and m.ref_tail is not None else None

    def _remove(self, m: Member) -> None:
        i, last = self.members.index(m), len(self.members) - 1
        if i != last:
            self._in_order(self.codec.move, last, i)
            self.members[i] = self.members[last]
        self.members.pop()

    def reset_all(self) -> None:
        """Forget every member and launched call (engine failure)."""
        if self.stream is not None:
            self.stream.synchronize()
        if self.worker is not None:
            self.worker.join()
            self.worker.error = None  # (the failure being reset)
        self._inflight.clear()
        with self._on_stream():
            self.codec.reset()
        self.members.clear()

    def close(self) -> None:
        """Let the worker thread (a CPU lane's) and the codec's own threads go when their work is done; later
        work starts them again."""
        close = getattr(self.codec, "close", None)
        if close is not None:
            self._in_order(close)  # (after the calls launched before: they may use those threads)
        if self.worker is not None:
            self.worker.close()

    def shapes(self) -> list[tuple[int, int, int]]:
        """Every (b, n, r0) call this lane can make (what start-up captures): b rows from row r0, n frames."""
        out = []
        for b in self.buckets:
            n = 1
            while n <= self.chunk_cap(b, self.max_frames_per_call):  # smaller frames_per_call: a subset
                out.append((b, n, 0))
                n *= 2
        w = self.window_rows
        for r0 in (self._window_starts(self.size) if w else []):
            n = 1
            while r0 and n <= self.chunk_cap(w, self.max_frames_per_call):
                out.append((w, n, r0))
                n *= 2
        return out
