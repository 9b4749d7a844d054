"""Who runs when: the waiting queue, admission into the prefill group, slots and buckets (plain Python).

Streams (priority 0) are admitted before batch work (higher numbers), FIFO within a priority. While
streams are being served (one arrived within `STREAM_WINDOW_S`), batch work keeps `stream_reserve`
slots free for them, so a stream arriving while a book fills the engine starts at once instead of
waiting for a batch row to end; with no streams about, batch work may take every slot. A
request is admitted into the prefill group while the group has room (`prefill_batch` side-cache rows)
and slots remain for it. Active sequences always occupy slots [0, n_active): when one leaves, the last
active slot moves into its place, so one decode step over the first B slots (B = the batch bucket)
covers every live request.
"""
from __future__ import annotations

import bisect
import heapq
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional


STREAM_WINDOW_S = 60.0  # streams seen this recently keep their reserve of slots


def pick_bucket(n: int, buckets: tuple[int, ...]) -> int:
    """Smallest bucket >= n (the largest bucket when n exceeds them all)."""
    i = bisect.bisect_left(buckets, n)
    return buckets[min(i, len(buckets) - 1)]


def length_bucket(need: int, step: int, cap: int) -> int:
    """Cache length to attend over: `need` rounded up to a multiple of `step`, at most `cap`."""
    return min(cap, -(-need // step) * step)


@dataclass(order=True)
class _Queued:
    priority: int
    order: int
    item: Any = field(compare=False)


class AdmissionQueue:
    """Waiting requests, lowest priority value first (streams use priority 0, batch work higher), FIFO within.

    Only streams are refused when `max_size` of them wait (the client gets "busy" and retries); batch
    work is never refused: its producers (the jobs workers) bound how much of it they hand over."""

    def __init__(self, max_size: int):
        self.max_size = max_size
        self._heap: list[_Queued] = []
        self._count = itertools.count()
        self._front = itertools.count(-1, -1)  # orders of items put back in front of their priority
        self._per_priority: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._heap)

    def waiting(self, priority: int) -> int:
        return self._per_priority.get(priority, 0)

    def full(self, priority: int = 0) -> bool:
        """Whether a new request of `priority` must be refused now (streams only, see the class doc)."""
        return priority <= 0 and self.waiting(priority) >= self.max_size

    def push(self, item: Any, priority: int = 0) -> None:
        heapq.heappush(self._heap, _Queued(priority, next(self._count), item))
        self._per_priority[priority] = self.waiting(priority) + 1

    def push_front(self, items: list, priority: int) -> None:
        """Put `items` (in this order) back before every other waiting item of `priority`."""
        for item in reversed(items):
            heapq.heappush(self._heap, _Queued(priority, next(self._front), item))
            self._per_priority[priority] = self.waiting(priority) + 1

    def peek(self) -> Optional[Any]:
        return self._heap[0].item if self._heap else None

    def peek_priority(self) -> Optional[int]:
        return self._heap[0].priority if self._heap else None

    def pop(self) -> Optional[Any]:
        if not self._heap:
            return None
        q = heapq.heappop(self._heap)
        self._per_priority[q.priority] -= 1
        return q.item

    def remove_if(self, pred) -> list:
        """Take out every queued item for which pred(item) holds (cancelled requests)."""
        out = [q for q in self._heap if pred(q.item)]
        if out:
            self._heap = [q for q in self._heap if not pred(q.item)]
            heapq.heapify(self._heap)
            for q in out:
                self._per_priority[q.priority] -= 1
        return [q.item for q in out]


class SlotMap:
    """Which sequence sits in which slot; keeps the active ones packed at the front."""

    def __init__(self, n_slots: int):
        self.n_slots = n_slots
        self.seqs: list[Any] = []  # seqs[i] occupies slot i

    @property
    def n_active(self) -> int:
        return len(self.seqs)

    def has_room(self) -> bool:
        return len(self.seqs) < self.n_slots

    def add(self, seq: Any) -> int:
        if not self.has_room():
            raise RuntimeError("no free slot")
        self.seqs.append(seq)
        return len(self.seqs) - 1

    def remove(self, slot: int) -> Optional[tuple[int, int]]:
        """Free `slot`; returns (src, dst) when the last sequence must move from slot src to dst."""
        last = len(self.seqs) - 1
        if slot == last:
            self.seqs.pop()
            return None
        self.seqs[slot] = self.seqs.pop()
        return last, slot


class Scheduler:
    """Owns admission: the waiting queue, the prefill group (with its side-cache rows) and the slot map.

    Sequences need `.handle` (with `.cancelled` and `.finish()`), `.priority`, `.side_row` and `.slot`.
    `schedule()` decides who joins the prefill group; it calls nothing of the runner's. Submitters on other
    threads push under `lock`.
    """

    def __init__(self, max_slots: int, max_queue: int, prefill_batch: int, stream_reserve: int = 0,
                 batch_admit: int = 1 << 30, stream_rows: int = 0):
        self.max_slots, self.prefill_batch = max_slots, prefill_batch
        self.stream_reserve = min(stream_reserve, max_slots - 1) if max_slots > 1 else 0
        # while streams are about: batch requests picked per iteration, prefill-group rows kept for streams
        self.batch_admit, self.stream_rows = max(1, batch_admit), min(stream_rows, prefill_batch - 1)
        self.last_stream = float("-inf")  # time.monotonic() of the latest stream's arrival
        self.queue = AdmissionQueue(max_queue)
        self.slots = SlotMap(max_slots)
        self.prefilling: list = []  # the prefill group, each with its side-cache row
        self.lock = threading.Lock()  # the waiting queue: pushed from submitting threads, popped by the loop

    def full(self, priority: int) -> bool:
        return self.queue.full(priority)

    def push(self, seq: Any, priority: int) -> None:
        with self.lock:
            if priority <= 0:
                self.last_stream = time.monotonic()
            self.queue.push(seq, priority)

    def unmark_stream(self, mark: float, before: float) -> None:
        """Forget the stream that arrived at `mark` (a warm-up request) if none arrived since: the time of
        the last stream goes back to `before`."""
        with self.lock:
            if self.last_stream == mark:
                self.last_stream = before

    def streams_about(self) -> bool:
        """Whether a stream arrived within STREAM_WINDOW_S (batch work then yields to streams)."""
        return time.monotonic() - self.last_stream < STREAM_WINDOW_S

    def batch_blocked(self, group: list, picked_now: int = 0) -> bool:
        """Whether batch work must wait, which it does only while streams are about: when `batch_admit` batch
        requests were picked in this iteration already (book segments join steadily, not in bursts that
        make one iteration long), when batch rows fill the prefill group but `stream_rows` (a stream never
        waits for a free side row), or when batch rows fill all slots but the reserve (rows in slots and in
        the prefill group count)."""
        if not self.streams_about():
            return False
        if picked_now >= self.batch_admit:
            return True
        in_group = sum(1 for s in group if s.priority > 0)
        if in_group >= self.prefill_batch - self.stream_rows:
            return True
        if not self.stream_reserve:
            return False
        batch = sum(1 for s in self.slots.seqs if s.priority > 0) + in_group
        return batch >= self.max_slots - self.stream_reserve

    @property
    def has_work(self) -> bool:
        return bool(len(self.queue) or self.slots.n_active or self.prefilling)

    def schedule(self, rows_free: int, lane_free: dict) -> list:
        """Pop the waiting sequences that join the prefill group now: while the group (`prefill_batch` side
        rows) and the slots have room, batch work is not held back for streams, and the next one's other
        resources are free (`rows_free` FrameStore rows; `lane_free[is_stream]` places in its codec lane).
        Cancelled ones are finished on the way. The caller prepares each and `join`s it (or fails it)."""
        picked: list = []
        with self.lock:
            while (len(self.prefilling) + len(picked) < self.prefill_batch and len(self.queue)
                   and self.slots.n_active + len(self.prefilling) + len(picked) < self.max_slots):
                if self.queue.peek_priority() > 0 and self.batch_blocked(self.prefilling + picked,
                                                                         sum(1 for p in picked if p.priority > 0)):
                    break
                head = self.queue.peek()
                if head.handle.cancelled:
                    self.queue.pop().handle.finish()
                    continue
                if rows_free <= 0 or lane_free[head.priority <= 0] <= 0:
                    break
                rows_free -= 1
                lane_free[head.priority <= 0] -= 1
                picked.append(self.queue.pop())
        return picked

    def requeue(self, seqs: list) -> None:
        """Picked sequences that cannot join now (no memory for them yet) go back to the front of the queue,
        in order: they are the next ones picked."""
        with self.lock:
            for priority in sorted({s.priority for s in seqs}):
                self.queue.push_front([s for s in seqs if s.priority == priority], priority)

    def join(self, seq: Any) -> None:
        """A prepared sequence enters the prefill group, on the first free side-cache row."""
        used = {s.side_row for s in self.prefilling}
        seq.side_row = min(set(range(self.prefill_batch)) - used)
        self.prefilling.append(seq)

    def prefilled(self, seq: Any) -> int:
        """`seq` finished its prefill: it leaves the group and takes a slot (returned)."""
        self.prefilling.remove(seq)
        seq.slot = self.slots.add(seq)
        return seq.slot

    def drop_all(self) -> list:
        """Forget every admitted sequence (engine failure); returns them."""
        out = list(self.slots.seqs) + list(self.prefilling)
        self.slots.seqs.clear()
        self.prefilling.clear()
        return out
