"""Slot bookkeeping and bucket choice for continuous batching (plain Python, no tensors).

Active sequences always occupy slots [0, n_active): when one leaves, the last active slot moves into
its place, so one decode step over the first B slots (B = the batch bucket) covers every live request.
"""
from __future__ import annotations

import bisect
import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any, Optional


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
    """Waiting requests, lowest priority value first (streams use priority 0, batch work higher), FIFO within."""

    def __init__(self, max_size: int):
        self.max_size = max_size
        self._heap: list[_Queued] = []
        self._count = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def full(self, priority: int = 0) -> bool:
        """Whether `priority`'s class is at its limit: streams and batch work are counted apart, so a
        backlog of batch segments never turns a streaming client away."""
        return sum(1 for q in self._heap if q.priority == priority) >= self.max_size

    def push(self, item: Any, priority: int = 0) -> None:
        heapq.heappush(self._heap, _Queued(priority, next(self._count), item))

    def pop(self) -> Optional[Any]:
        return heapq.heappop(self._heap).item if self._heap else None

    def remove_if(self, pred) -> list:
        """Take out every queued item for which pred(item) holds (cancelled requests)."""
        out = [q.item for q in self._heap if pred(q.item)]
        if out:
            self._heap = [q for q in self._heap if not pred(q.item)]
            heapq.heapify(self._heap)
        return out


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
