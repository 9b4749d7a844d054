"""EngineRunner: continuous batching over a fixed slot table, streaming PCM out per request.

    runner = EngineRunner(engine, max_slots=64); runner.start()
    h = runner.submit(SynthesisRequest(...))        # EngineBusy when the admission queue is full
    for chunk in h: ...                             # float32 PCM chunks as they are made
    h.cancel()                                      # frees the slot at the next step

One loop iteration (`step_once`) is schedule -> run -> postprocess:
- schedule: the scheduler (engines.runtime.scheduler) picks the waiting requests that join the prefill
  group; admission (engines.runtime.admission) prepares them (voice, prompt, settings: engines.runtime.prepare,
  which also feeds live text between steps) and gives each a FrameStore row and a place in its codec lane;
- run: the model runner (engines.runtime.model_runner) prefills one chunk of every prompt in the group
  (complete ones move into slots) and launches one decode step for every active slot (a captured device
  graph per bucket on CUDA), reading the previous step's flags back meanwhile;
- postprocess (engines.runtime.postprocess): frames are counted, finished requests leave their slots (the last
  slot moves into the hole), and the codec lanes (engines.runtime.codec_lane) turn stored frames into PCM for
  the handles (streams and batch work in separate lanes).
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
from engines.runtime.admission import Admission
from engines.runtime.codec_lane import CodecLane
from engines.runtime.config import EngineConfig
from engines.runtime.model_runner import ModelRunner, Step
from engines.runtime.postprocess import Postprocess
from engines.runtime.prepare import feed_text
from engines.runtime.scheduler import Scheduler
from engines.runtime.sequence import Sequence
from engines.runtime.stream import StreamHandle, collect, submit_waiting

log = logging.getLogger(__name__)


class EngineRunner(Admission, Postprocess):
    """The engine loop: the public API and the loop thread here; admission in engines.runtime.admission, the
    steps' postprocess (frames, ends, codec lanes, delivery) in engines.runtime.postprocess."""

    def __init__(self, engine, config: Optional[EngineConfig] = None, **overrides):
        from engines.codec.build import runtime_codec
        from engines.codec.dtype import codec_dtype_setting, lane_decoder

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

        # the codec lanes' decoder: the engine's, or a bf16 copy (runtime.codec_dtype; engines.codec.dtype)
        self.codec_dtype = codec_dtype_setting(cfg.codec_dtype, self.device, engine.dtype)[0]
        decoder = lane_decoder(engine.decoder, self.codec_dtype)
        if decoder is not engine.decoder:
            log.info("codec lanes: %s", self.codec_dtype)

        windows = cfg.codec_windows if cfg.codec_windows is not None else engine.device.type != "cpu"
        window = cfg.batch_window_frames if windows else 0

        def lane(name, first, max_chunk, stream, **kw):
            codec = runtime_codec(engine, n, cfg.codec_backend, cfg.engine_cache, cfg.codec_fast,
                                  row_threads=cfg.cpu_codec_threads, decoder=decoder)
            # CPU: the lane's work in order on a thread of its own (one torch thread), a call's rows split over
            # cpu_codec_threads threads by the codec (engines.codec.streaming.StreamingCodecDecoder)
            return CodecLane(name, codec, self.store, first, max_chunk, call_frames, self.use_graphs,
                             stream=stream, worker_threads=min(1, cfg.cpu_codec_threads), **kw)

        s_stream, b_stream = self.model.lane_streams
        self.lanes = {  # priority 0 (streams): waited for at once, high-priority stream; batch work: collected later
            "stream": lane("stream", cfg.first_chunk_frames, cfg.max_chunk_frames, s_stream, wait=True),
            "batch": lane("batch", cfg.batch_chunk_frames, cfg.batch_chunk_frames, b_stream, lazy_finish=True,
                          wait=False, window_frames=window),
        }
        self.lanes["stream"].urgent = self._running_dry
        self.lanes["stream"].before_inline = self._pick_threads
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
            for b, n, r0 in sorted(ln.shapes(), key=lambda s: -s[0] * s[1]):
                if (b, n, r0) not in ln.graphs:
                    ln.capture(b, n, r0=r0)
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
                | {"codec_wait": round(sum(ln.wait_s for ln in self.lanes.values()), 3)},  # (inside "codec")
                "codec_inline_calls": sum(ln.inline_calls for ln in self.lanes.values())}

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
