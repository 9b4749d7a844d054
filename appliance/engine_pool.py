"""Several engines (one EngineRunner per device) behind the shape of one runner.

`model.device: all` or a list such as `cuda:0,cuda:1` gives the daemon one runner per device. The
pool is what the rest of the daemon talks to, so nothing else knows how many engines there are:

- streams (priority 0) go to the least-loaded engine: the one with the most free slots for its size,
  then the one serving the fewest streams;
- batch segments (the jobs worker feeds the pool like one runner, with the slots of all engines in
  flight) go to the least-loaded engine that has no streams waiting, so one book runs on every device;
- when the chosen engine's admission queue is full the next one is tried; EngineBusy only when all are.

An engine's load is what it last reported (an engine process reports every quarter second) or the
requests the pool handed it that have not ended, whichever is larger: a burst of submissions (a worker
filling every slot at once) is spread at once instead of all going where the last report looked emptiest.

One worker feeding the pool (rather than one worker per engine) keeps one writer per book: the jobs
worker writes a book's chapters as its segments end, and two workers following one book would write
the same files.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Optional

from engines.runtime.runner import EngineBusy
from engines.runtime.stream import collect, submit_waiting

log = logging.getLogger(__name__)

STREAM_PRIORITY = 0  # the runner serves lower values first
BATCH_PRIORITY = 1


class EnginePool:
    """One or more started engines (`runners`: EngineRunners in this process or EngineProcesses, same
    checkpoint) used as one; `catalog` answers what the checkpoint offers (engines.catalog)."""

    def __init__(self, runners: list, catalog=None):
        if not runners:
            raise ValueError("an engine pool needs at least one runner")
        self.runners = list(runners)
        self.catalog = catalog if catalog is not None else self.runners[0].engine
        self.streams = [0] * len(self.runners)  # streaming requests being served, per engine
        self._owner: dict = {}  # stream handle -> index of its engine
        self._live: list[list] = [[] for _ in self.runners]  # handles given to each engine, not known to have ended
        self._lock = threading.Lock()

    # -- what callers read from "the" engine (every engine runs the same checkpoint) ------------------
    @property
    def engine(self):
        return self.catalog

    @property
    def sample_rate(self) -> int:
        return self.runners[0].sample_rate

    @property
    def voices(self) -> list:
        return self.catalog.voices

    @property
    def languages(self) -> list:
        return self.catalog.languages

    @property
    def model_id(self) -> str:
        return self.runners[0].model_id

    @property
    def running(self) -> bool:
        return all(r.running for r in self.runners)

    def clone_voice(self, ref_audio, ref_text: Optional[str] = None):
        """A cloned voice usable on every engine (its tensors move to each engine's device when used)."""
        return self.runners[0].clone_voice(ref_audio, ref_text)

    # -- routing ------------------------------------------------------------------------------------
    def _pending(self, i: int) -> list:
        """The handles given to engine `i` that have not ended (the ended ones are dropped; under the lock)."""
        live = self._live[i] = [h for h in self._live[i] if not h.done]
        return live

    def _occupancy(self, i: int) -> float:
        s = self.runners[i].stats()
        return max(s["active_slots"] + s["queued"], len(self._pending(i))) / max(s["max_slots"], 1)

    def streams_waiting(self, i: int) -> bool:
        """True when streams fill every slot of engine `i` or requests wait there behind streams."""
        n, r = self.streams[i], self.runners[i]
        return n >= r.max_slots or (n > 0 and bool(r.stats().get("queued")))

    def order(self, priority: int) -> list[int]:
        """Engine indices, best first, for a request of `priority`."""
        idx = range(len(self.runners))
        if len(self.runners) == 1:
            return [0]
        with self._lock:
            if priority <= STREAM_PRIORITY:
                return sorted(idx, key=lambda i: (self._occupancy(i), self.streams[i], i))
            return sorted(idx, key=lambda i: (self.streams_waiting(i), self._occupancy(i), i))

    def submit(self, request, priority: int = STREAM_PRIORITY):
        """Queue `request` on the best engine (see the module docstring) -> its StreamHandle. Streams
        are counted against their engine until `finished(handle)`. EngineBusy when every queue is full."""
        busy = None
        for i in self.order(priority):
            try:
                handle = self.runners[i].submit(request, priority)
            except EngineBusy as exc:
                busy = exc
                continue
            with self._lock:  # ended handles go at each submit: the list stays as long as the work in flight
                self._pending(i).append(handle)
                if priority <= STREAM_PRIORITY:
                    self.streams[i] += 1
                    self._owner[handle] = i
            return handle
        raise busy

    def finished(self, handle) -> None:
        """A stream ended (or its client left): it no longer counts against its engine."""
        with self._lock:
            i = self._owner.pop(handle, None)
            if i is not None:
                self.streams[i] -= 1

    def synthesize(self, requests: list, priority: int = BATCH_PRIORITY) -> list:
        """Whole-audio results for a batch spread over the engines (a single engine, or engines whose
        loops are not started, work as `EngineRunner.synthesize`). Raises the first request's error."""
        if len(self.runners) == 1 or not self.running:
            return self.runners[0].synthesize(requests, priority)
        return collect(submit_waiting(self.submit, requests, priority))

    # -- life cycle and figures ---------------------------------------------------------------------
    def stats(self) -> dict:
        """Figures summed over the engines (the shape of one runner's stats, as they are now), and
        `engines`: each engine's own figures with its device and streams."""
        per = []
        for i, r in enumerate(self.runners):
            s = {**(getattr(r, "settings", None) or {}), **r.stats(fresh=True)}  # chosen dtype, slots and why; load
            s.update(device=str(r.device), streams=self.streams[i], alive=r.alive)
            per.append(s)
        out = {k: sum(s.get(k, 0) for s in per) for k in ("active_slots", "queued", "steps", "frames", "graphs",
                                                            "max_slots")}
        phases = [s["ttfa_phases_s"] for s in per if "ttfa_phases_s" in s]
        if phases:
            out["ttfa_phases_s"] = {k: sum(p[k] for p in phases) for k in phases[0]}
        out["alive"] = all(s["alive"] for s in per)
        out["engines"] = per
        return out

    def stop(self, timeout: float = 10.0) -> None:
        for r in self.runners:
            r.stop(timeout)
