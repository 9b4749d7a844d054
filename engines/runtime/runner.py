"""EngineRunner: continuous batching over a fixed slot table, streaming PCM out per request.

    runner = EngineRunner(engine, max_slots=64); runner.start()
    h = runner.submit(SynthesisRequest(...))        # EngineBusy when the admission queue is full
    for chunk in h: ...                             # float32 PCM chunks as they are made
    h.cancel()                                      # frees the slot at the next step

One loop iteration (`step_once`) is schedule -> run -> postprocess:
- schedule: the scheduler (engines.runtime.scheduler) picks the waiting requests that join the prefill
  group; the runner prepares them (voice, prompt, settings: engines.runtime.prepare, which also feeds
  live text between steps) and gives each a FrameStore row and a place in its codec lane;
- run: the model runner (engines.runtime.model_runner) prefills one chunk of every prompt in the group
  (complete ones move into slots) and launches one decode step for every active slot (a captured device
  graph per bucket on CUDA), reading the previous step's flags back meanwhile;
- postprocess: frames are counted, finished requests leave their slots (the last slot moves into the
  hole), and the codec lanes (engines.runtime.codec_lane) turn stored frames into PCM for the handles
  (streams and batch work in separate lanes).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Optional

import torch

from engines.api import SynthesisRequest, SynthesisResult
from engines.model.errors import EngineBusy, TTSError  # noqa: F401 - EngineBusy re-exported
from engines.runtime.codec_lane import CodecLane
from engines.runtime.config import EngineConfig
from engines.runtime.model_runner import ModelRunner, Step
from engines.runtime.prepare import feed_text, prepare
from engines.runtime.scheduler import Scheduler
from engines.runtime.sequence import Sequence
from engines.runtime.stream import StreamHandle, collect, submit_waiting

log = logging.getLogger(__name__)

URGENT_S = 0.3  # a stream with less audio ahead of its listener than this gets its next chunk at once


class EngineRunner:
    def __init__(self, engine, config: Optional[EngineConfig] = None, **overrides):
        from engines.codec.build import runtime_codec

        self.engine = engine
        cfg = self.cfg = replace(config or EngineConfig(), **overrides)
        self.device = engine.device
        self.settings: dict = {"device": str(engine.device), "max_slots": cfg.max_slots}  # (engines.load: all of them)
        n = cfg.max_slots
        # where the loop's wall time goes (seconds, summed): host work per phase, and waits for the device
        self.loop_s = dict.fromkeys(("admit", "decode_launch", "step_wait", "step_rows", "codec"), 0.0)
        self.model = ModelRunner(engine, cfg, self.loop_s)
        self.store, self.use_graphs = self.model.store, self.model.use_graphs

        call_frames = cfg.batch_call_frames if engine.device.type != "cpu" else min(cfg.batch_call_frames,
                                                                                    cfg.cpu_call_frames)

        def lane(name, first, max_chunk, stream, **kw):
            codec = runtime_codec(engine, n, cfg.codec_backend, cfg.engine_cache, cfg.codec_fast,
                                  row_threads=cfg.cpu_codec_threads)
            # CPU: the lane's work in order on a thread of its own (one torch thread), a call's rows split over
            # cpu_codec_threads threads by the codec (engines.codec.streaming.StreamingCodecDecoder)
            return CodecLane(name, codec, self.store, first, max_chunk, call_frames, self.use_graphs,
                             stream=stream, worker_threads=min(1, cfg.cpu_codec_threads), **kw)

        s_stream, b_stream = self.model.lane_streams
        self.lanes = {  # priority 0 (streams): waited for at once, high-priority stream; batch work: collected later
            "stream": lane("stream", cfg.first_chunk_frames, cfg.max_chunk_frames, s_stream, wait=True),
            "batch": lane("batch", cfg.batch_chunk_frames, cfg.batch_chunk_frames, b_stream, lazy_finish=True,
                          wait=False),
        }
        self.lanes["stream"].urgent = self._running_dry
        for ln in self.lanes.values():
            ln.before_capture = self._drain
            ln.use_stream(cfg.codec_streams)
        reserve = n // 4 if cfg.stream_reserve < 0 else cfg.stream_reserve
        self.sched = Scheduler(n, cfg.max_queue, cfg.prefill_batch, reserve, cfg.batch_admit_streams,
                               cfg.prefill_rows_streams)
        self.slots = self.sched.slots
        self._inflight: Optional[Step] = None
        self._cv = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._stop = False
        self._torch_threads = torch.get_num_threads()  # the loop thread's (the codec workers set their own)
        if self.device.type == "cpu" and cfg.cpu_idle_threads > self._torch_threads:
            self.model.fast.poll = lambda: self._pick_threads()  # a codec call may end mid-step or mid-prefill
        self.frames = 0
        self.holds = 0  # rows x steps that waited for text
        self.preempted = 0  # batch requests sent back to the queue to give their slot to a stream
        # where streams' time to first audio goes, summed (seconds): submit -> admitted (queue), -> in a slot
        # (prefill), -> first frame read back (first_frame), -> first audio handed out (codec)
        self.ttfa_phases = dict.fromkeys(("queue", "prefill", "first_frame", "codec"), 0.0) | {"n": 0}

    # ----- public API --------------------------------------------------------------------------
    @property
    def sample_rate(self) -> int:
        return self.engine.sample_rate

    @property
    def voices(self) -> list[str]:
        return self.engine.voices

    @property
    def languages(self) -> list[str]:
        return self.engine.languages

    @property
    def model_id(self) -> str:
        return self.engine.model_id

    @property
    def max_slots(self) -> int:
        return self.cfg.max_slots

    @property
    def alive(self) -> bool:
        """Serving: the loop thread runs (what a watchdog and /health ask of every engine)."""
        return self.running

    @property
    def steps(self) -> int:
        return self.model.steps

    @property
    def graphs(self) -> dict:
        return self.model.graphs

    def submit(self, request: SynthesisRequest, priority: int = 0, handle: Optional[StreamHandle] = None) -> StreamHandle:
        """Queue a request; streams (priority 0) go before batch work (higher numbers). `handle`: the
        StreamHandle (or subclass) its output goes to (default: a new one)."""
        with self._cv:
            if self.sched.full(priority):
                raise EngineBusy(f"busy: {len(self.sched.queue)} requests already waiting; retry shortly")
            handle = handle or StreamHandle(self, self.engine.sample_rate)
            seq = Sequence(handle, request, priority)
            if seq.feed is not None:
                seq.feed.on_change = self.wake
            self.sched.push(seq, priority)
            self._cv.notify()
        return handle

    def warm_up(self, request: SynthesisRequest) -> None:
        """Speak `request` once on the stream path (its lane, graphs and first chunks run before a client's
        do). It is no client's stream: batch work does not keep slots for streams because of it (a book
        submitted right after the start would run on three quarters of the slots for a minute)."""
        before = self.sched.last_stream
        handle = self.submit(request, priority=0)
        mark = self.sched.last_stream
        try:
            for _ in handle:
                pass
        finally:
            self.sched.unmark_stream(mark, before)

    def synthesize(self, requests: list[SynthesisRequest], priority: int = 1) -> list[SynthesisResult]:
        """Whole-audio results for a batch (batch priority by default). Waits for room when the admission
        queue is full; runs the loop in this thread when no background thread runs. Raises the first
        request's error, if any (after all have ended)."""
        # streams come first: wait for room in the queue (or make it, without a thread)
        handles = submit_waiting(self.submit, requests, priority,
                                 self.step_once if self._thread is None else lambda: time.sleep(0.02))
        if self._thread is None:
            while not all(h.done for h in handles):
                self.step_once()
        return collect(handles)

    @property
    def running(self) -> bool:
        """Whether the loop runs in its own thread (start()), so submitted requests progress by themselves."""
        return self._thread is not None and self._thread.is_alive()

    def clone_voice(self, ref_audio, ref_text: Optional[str] = None):
        """A voice cloned once from reference audio, to pass as `SynthesisRequest.voice` (Base checkpoints)."""
        return self.engine.make_voice(ref_audio, ref_text)

    @torch.no_grad()
    def prepare(self) -> dict:
        """Capture, before any request, every device graph the loop can replay: the decode step for each
        (batch bucket, cache-length bucket), the prefill for each (rows, length) bucket and each codec lane
        call (batch, frames). Afterwards no capture or compilation happens on the request path. Call while
        idle (start-up). Returns the seconds spent and the graph counts (empty on the CPU, where nothing is
        captured)."""
        if not self.use_graphs:
            return {}
        if self.slots.n_active or self.sched.prefilling or any(ln.busy for ln in self.lanes.values()):
            raise RuntimeError("prepare() captures graphs on idle slots: call it before submitting requests")
        out = self.model.prepare()
        t1 = time.perf_counter()
        for ln in self.lanes.values():  # largest calls first: the smaller ones reuse their pool's blocks
            for b, n in sorted(ln.shapes(), key=lambda s: -s[0] * s[1]):
                if (b, n) not in ln.graphs:
                    ln.capture(b, n)
        self._drain()
        out.update(codec_graphs=sum(len(ln.graphs) for ln in self.lanes.values()),
                   codec_capture_s=time.perf_counter() - t1)
        log.info("prepared %d decode graphs in %.1f s and %d codec graphs in %.1f s", out["decode_graphs"],
                 out["decode_capture_s"], out["codec_graphs"], out["codec_capture_s"])
        return out

    def start(self) -> None:
        if self._thread is None:
            self._stop = False
            self._thread = threading.Thread(target=self._loop, name="engine-runner", daemon=True)
            self._thread.start()

    def stop(self, timeout: Optional[float] = None) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        for ln in self.lanes.values():
            ln.close()

    def wake(self) -> None:
        with self._cv:
            self._cv.notify()

    def stats(self, fresh: bool = True) -> dict:
        """The loop's figures (always as they are now in this process: `fresh` is for the engine process's
        proxy, which otherwise answers with the last figures it was sent)."""
        return {"active_slots": self.slots.n_active, "queued": len(self.sched.queue), "steps": self.steps,
                "frames": self.frames, "text_holds": self.holds, "preempted": self.preempted, "ttfa_phases_s": dict(self.ttfa_phases),
                "graphs": len(self.graphs), "max_slots": self.cfg.max_slots,
                "loop_s": {k: round(v, 3) for k, v in self.loop_s.items()}
                | {"codec_wait": round(sum(ln.wait_s for ln in self.lanes.values()), 3)}}  # (inside "codec")

    # ----- loop ------------------------------------------------------------------------------------
    def _loop(self) -> None:
        if self.device.type == "cuda" and self.device.index is not None:  # a new thread starts on cuda:0;
            torch.cuda.set_device(self.device)  # one engine per GPU runs on its own ("cuda": the current one)
        if self.model.run_stream is not None:  # this thread's device work goes to the loop's own stream
            torch.cuda.set_stream(self.model.run_stream)
        if self.device.type == "cpu" and torch.get_num_threads() != self._torch_threads:
            torch.set_num_threads(self._torch_threads)  # torch's intra-op threads are counted per thread
        while True:
            with self._cv:
                while not self._stop and not self._has_work():
                    self._cv.wait(timeout=0.5)
                if self._stop:
                    return
            try:
                self.step_once()
            except Exception:  # noqa: BLE001 - keep serving: fail the requests in flight, not the daemon
                log.exception("engine step failed; failing the requests in flight")
                self._fail_all("internal engine error (see the daemon log)")

    def _pick_threads(self) -> None:
        """CPU, in the loop's own thread: its torch threads for the work that follows, cpu_idle_threads while no
        codec call runs (the codec's cores would idle: a book's first prompts, a stream between chunks), its
        own count while one does (intra-op threads sharing cores with busy codec threads stall each other).
        Asked before each admission and each step, and inside them (FastStep.poll: between the talker's layers
        and before each predictor pass), so a codec call that ends mid-step hands its cores to the rest of the
        step; calls start only from this thread, between steps."""
        idle = self.cfg.cpu_idle_threads
        if idle <= self._torch_threads or threading.current_thread() is not self._thread:
            return
        want = self._torch_threads if any(ln.running for ln in self.lanes.values()) else idle
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)

    def _has_work(self) -> bool:
        """Anything to do now (a loop with only rows waiting for text sleeps until a feed wakes it)."""
        return ((self.sched.has_work and not self._starved()) or self._inflight is not None
                or any(ln.active for ln in self.lanes.values()))

    def _starved(self) -> bool:
        """Every running request waits for text that has not come, and nothing else is queued or prefilling."""
        seqs = self.slots.seqs
        return (bool(seqs) and not len(self.sched.queue) and not self.sched.prefilling
                and all(seq.held and seq.text_open and seq.feed.version == seq.feed_version
                        and not seq.handle.cancelled for seq in seqs))

    @torch.no_grad()
    def step_once(self) -> None:
        """One iteration: cancellations; schedule and prefill; one decode step; codec lanes."""
        for seq in list(self.slots.seqs):
            if seq.handle.cancelled and not seq.done:
                self._end(seq, dropped=True)
        self._preempt()
        t0 = time.perf_counter()
        self._pick_threads()
        self._admit(self.sched.schedule(self.store.n_free, {True: self.lanes["stream"].free,
                                                            False: self.lanes["batch"].free}))
        if self.sched.prefilling:  # a stream's prompt goes alone: book prompts wait an iteration, not the stream
            group = self.sched.prefilling
            self._prefill([s for s in group if s.is_stream] or group)
        feed_text(self.slots.seqs, self.engine.prompts, self.model.table, self.cfg.max_text_rows)
        self.loop_s["admit"] += time.perf_counter() - t0
        n = self.slots.n_active
        if n and not self._starved():
            self._pick_threads()
            self._decode(n)
        elif self._inflight is not None:
            rec, self._inflight = self._inflight, None
            self._collect(rec)
        t0 = time.perf_counter()
        self._run_codec()
        self.loop_s["codec"] += time.perf_counter() - t0

    # ----- schedule: admission ---------------------------------------------------------------------
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

    # ----- run -----------------------------------------------------------------------------------------
    def _prefill(self, group: list) -> None:
        """One prompt chunk of every sequence in the prefill group; complete ones take a slot."""
        complete, hidden = self.model.prefill(group)
        for seq in complete:
            slot = self.sched.prefilled(seq)
            seq.handle.marks["slot"] = time.perf_counter()
            self.model.place(slot, seq, hidden[seq.side_row])

    def _decode(self, n: int) -> None:
        """Launch one step; read back the previous one meanwhile (overlap) or this one (no overlap)."""
        seqs = self.slots.seqs
        if self.model.will_capture(seqs, n):
            self._drain()
        rec = self.model.launch(seqs, n)
        prev, self._inflight = self._inflight, rec
        if prev is not None:
            self._collect(prev)
        if not self.cfg.overlap:
            self._collect(rec)
            self._inflight = None

    def _drain(self) -> None:
        """Finish the step in flight before a graph capture: no copy or event may be pending then."""
        if self._inflight is not None:
            rec, self._inflight = self._inflight, None
            self._collect(rec)
        self.model.drain()

    # ----- postprocess ---------------------------------------------------------------------------------
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
