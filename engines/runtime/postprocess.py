"""Postprocess for the engine loop (engines.runtime.runner.EngineRunner): a finished step's frames counted and its
ended requests retired from their slots; the codec lanes run and their audio handed to the requests' handles;
what streams' time to first audio went to; every request failed at once when the loop fails.

A mixin of EngineRunner: it uses the runner's model, slots, store, lanes, sched, cfg and its counters.
"""
from __future__ import annotations

import time

from engines.model.errors import TTSError
from engines.runtime.model_runner import Step
from engines.runtime.sequence import Sequence
from engines.runtime.stream import StreamHandle

URGENT_S = 0.3  # a stream with less audio ahead of its listener than this gets its next chunk at once


class Postprocess:
    """Frames counted, requests ended, audio delivered."""

    def _collect(self, rec: Step) -> None:
        """Count a finished step's frames for the codec lanes; end the requests that are done."""
        emit, done, eos, bad, hold = self.model.wait(rec)
        t1 = time.perf_counter()
        if any(bad):
            rows = [i for i, x in enumerate(bad) if x]
            raise AssertionError(f"internal: out-of-range codes in rows {rows} (step {self.steps})")
        for i, seq in enumerate(rec.seqs):
            if seq.done:  # finished (or cancelled) earlier: later rows of it are not real
                continue
            if hold[i]:  # it waited for text: no frame, its position did not move
                seq.pos -= 1
                self.holds += 1
                # held now unless text came after this step was launched
                seq.held = seq.member.stalled = (seq.text_open and
                                                 seq.member.emitted - seq.member.n_ref >= seq.text_rows)
            if emit[i]:
                seq.member.emitted += 1
                self.frames += 1
                seq.handle.marks.setdefault("frame", time.perf_counter())
            if done[i]:
                seq.handle.finished_by_eos = bool(eos[i])
                self._end(seq)
        self.loop_s["step_rows"] += time.perf_counter() - t1


    def _end(self, seq: Sequence, dropped: bool = False) -> None:
        """No more frames for `seq`: its slot is freed now; its codec lane decodes what is left (or drops it)."""
        seq.done = True
        seq.member.finished = True
        seq.member.dropped = dropped
        if seq.slot >= 0:
            move = self.slots.remove(seq.slot)
            if move is not None:
                self.slots.seqs[move[1]].slot = move[1]
            self.model.retire(seq.slot, move, self.slots.seqs[move[1]].pos if move else 0)
            seq.slot = -1

    def _run_codec(self) -> None:
        """Every lane that is due launches a call; what finished calls made goes to the requests, and the
        requests whose audio is complete end (their FrameStore row is free again)."""
        idle = not self.slots.n_active and self._inflight is None and not self.sched.has_work
        batch = self.lanes["batch"]  # while streams are about, its calls are kept short
        batch.frames_per_call = min(self.cfg.batch_call_frames_streams, batch.max_frames_per_call) \
            if self.sched.streams_about() else batch.max_frames_per_call
        for ln in self.lanes.values():
            self._deliver(*ln.run(block=idle))  # nothing else to do: wait for the codec rather than spin

    def _running_dry(self, m) -> bool:
        """A stream whose listener (playing since its first audio, in real time) has less than
        URGENT_S of audio left: the loop waits for the codec call that carries its next audio."""
        h = m.seq.handle
        start = h.marks.get("audio")
        return start is not None and h.samples / h.sample_rate - (time.perf_counter() - start) < URGENT_S

    def _deliver(self, out: list, complete: list) -> None:
        for m, audio in out:
            if m.seq.requeued:  # audio of a preempted try: its request starts over
                continue
            first = m.seq.handle.ttfa_s is None
            m.seq.handle.add_audio(audio)
            if first and m.seq.is_stream and m.seq.handle.ttfa_s is not None:
                self._count_ttfa(m.seq.handle)
        for m in complete:
            self.store.give(m.frame_row)
            if m.seq.requeued:
                continue
            if not m.dropped:
                m.seq.handle.codes, m.seq.handle.lead = m.codes, m.lead
            m.seq.handle.finish()

    def _count_ttfa(self, h: StreamHandle) -> None:
        m, p = h.marks, self.ttfa_phases
        if all(k in m for k in ("admit", "slot", "frame", "audio")):
            for phase, a, b in (("queue", h.created, m["admit"]), ("prefill", m["admit"], m["slot"]),
                                ("first_frame", m["slot"], m["frame"]), ("codec", m["frame"], m["audio"])):
                p[phase] += b - a
            p["n"] += 1

    def _fail_all(self, message: str) -> None:
        for seq in self.sched.drop_all():
            seq.handle.fail(TTSError(message))
        for ln in self.lanes.values():
            _, complete = ln.drain()
            for m in complete + ln.members:
                m.seq.handle.fail(TTSError(message))
                self.store.give(m.frame_row)
            ln.reset_all()
        self._inflight = None
        self.model.free_all()
