"""Admission for the engine loop (engines.runtime.runner.EngineRunner): the sequences the scheduler picked made
ready (voice, prompt, settings), given a FrameStore row and a place in their codec lane, held to the positions
the memory plan allows; batch requests sent back to the queue when a stream needs their slot.

A mixin of EngineRunner: it uses the runner's engine, cfg, sched, slots, store, lanes and `_end`
(engines.runtime.postprocess).
"""
from __future__ import annotations

import time

from engines.model.errors import TTSError
from engines.runtime.codec_lane import CodecLane
from engines.runtime.prepare import prepare
from engines.runtime.sequence import Sequence


class Admission:
    """Schedule -> admission: who joins the prefill group, and who gives a slot up for a stream."""

    def _lane(self, seq: Sequence) -> CodecLane:
        return self.lanes["stream" if seq.is_stream else "batch"]

    def _admit(self, picked: list) -> None:
        """Prepare the sequences the scheduler picked; each joins the prefill group, or fails alone. One whose
        positions do not fit now (`_fits`) goes back to the queue with those after it."""
        for i, seq in enumerate(picked):
            try:
                seq.handle.marks["admit"] = time.perf_counter()
                prepare(seq, self.engine, self.cfg.max_context)
            except TTSError as exc:
                seq.handle.fail(exc)
                continue
            if not self._fits(seq):
                self.sched.requeue(picked[i:])
                return
            self._prepare(seq)
            self.sched.join(seq)

    def _fits(self, seq: Sequence) -> bool:
        """Whether `seq`'s positions (its prompt and frame limit) fit beside those of the requests admitted
        already, within cfg.max_positions (the CPU's memory plan, engines.runtime.memory; 0: no limit). Batch
        work leaves one stream's worst case free; a request always runs when none is admitted."""
        limit = self.cfg.max_positions
        held = self.slots.seqs + self.sched.prefilling
        if not limit or not held:
            return True
        room = limit - (0 if seq.is_stream else self.cfg.max_context)
        return sum(s.reserve for s in held) + seq.reserve <= room

    def _prepare(self, seq: Sequence) -> None:
        """A prepared sequence's FrameStore row and place in its codec lane."""
        ref_codes = seq.ref_codes
        seq.frame_row = self.store.take(ref_codes)
        seq.member = self._lane(seq).add(seq, seq.frame_row, 0 if ref_codes is None else int(ref_codes.shape[0]))


    def _preempt(self) -> None:
        """Streams always win: for each stream waiting while every slot is taken, the batch request with the
        fewest frames made leaves its slot now and goes back to the queue; it starts over later with the same
        settings (same seed: the same audio), its handle forgetting what it had (`restart`)."""
        waiting = self.sched.queue.waiting(0)
        free = self.cfg.max_slots - self.slots.n_active - len(self.sched.prefilling)
        need = min(waiting, self.cfg.prefill_batch) - max(free, 0)
        if need <= 0:
            return
        victims = sorted((s for s in self.slots.seqs if not s.is_stream and not s.done),
                         key=lambda s: s.member.emitted)[:need]
        for seq in victims:
            seq.requeued = True
            self._end(seq, dropped=True)
            seq.handle.restart()
            self.sched.push(Sequence(seq.handle, seq.request, seq.priority), seq.priority)
            self.preempted += 1

