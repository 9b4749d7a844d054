"""EngineRunner: continuous batching over a fixed slot table, streaming PCM out per request.

    runner = EngineRunner(engine, max_slots=64); runner.start()
    h = runner.submit(SynthesisRequest(...))        # EngineBusy when the admission queue is full
    for chunk in h: ...                             # float32 PCM chunks as they are made
    h.cancel()                                      # frees the slot at the next step

The loop is schedule -> run -> postprocess: admit queued requests (prefill in chunks, up to
`prefill_batch` requests together, into side-cache rows then copied into free slots), run one decode
step for every active slot (a captured device graph per (batch bucket, cache-length bucket) on CUDA,
the same code eagerly elsewhere; each frame is written to the request's FrameStore row on the
device), free the slot of a request as soon as its last frame is made (the last slot moves into the
hole), and let the codec lanes turn stored frames into PCM (streams and batch work in separate lanes;
see engines.runtime.stream).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import torch

from engines.api import SynthesisRequest, SynthesisResult
from engines.model.errors import TTSError, UnsupportedMode
from engines.model.generate import control_mask
from engines.device.graphs import distinct_streams, make_graph
from engines.model.layers import KVCache

from engines.runtime.scheduler import Scheduler, length_bucket, pick_bucket
from engines.runtime.decode_step import FastStep
from engines.runtime.slots import SlotTable
from engines.runtime.codec_lane import CodecLane
from engines.runtime.stream import FrameStore, StreamHandle, collect

log = logging.getLogger(__name__)


URGENT_S = 0.3  # a stream with less audio ahead of its listener than this gets its next chunk at once
PREFILL_LENGTHS = (16, 32, 64, 128)  # prompt-chunk length buckets of the captured prefill (then prefill_chunk)


class EngineBusy(TTSError):
    """The admission queue is full: try again shortly."""


@dataclass(frozen=True)
class EngineConfig:
    max_slots: int = 64
    max_queue: int = 256
    stream_reserve: int = -1  # slots batch work leaves free while streams are about (-1: a quarter of the slots)
    max_context: int = 2048  # talker cache length per slot (prompt + frames)
    max_text_rows: int = 1024  # streaming-text rows per request
    prefill_chunk: int = 256  # prompt tokens per request per loop iteration (keeps streams flowing)
    prefill_batch: int = 8  # requests prefilled together (side-cache rows)
    length_step: int = 256  # cache-length bucket granularity
    batch_buckets: tuple = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    use_graphs: Optional[bool] = None  # None: on CUDA
    prefill_graphs: bool = True  # with graphs: prompt chunks prefilled by captured graphs (per rows/length bucket)
    # read a step's codes back while the next step runs (pinned buffers + events)
    overlap: bool = True
    compile: Optional[bool] = None  # compile the step's regions with torch.compile; None: on CUDA
    gemv: bool = True  # compiled path: one-row matmuls as fused reductions (batch-1 bucket)
    fuse: str = "layer"  # compiled regions: "layer" (one per decoder layer) or "pass" (per predictor step / talker step)
    topk_cap: int = 64  # steps whose every row samples with 0 < top-k <= this sort only that many ids (0: never)
    topk_min_batch: int = 16  # ... from this batch bucket up (measured: below it the full sort is faster)
    first_chunk_frames: int = 1  # streams: frames in the first codec chunk (then doubling up to max_chunk_frames)
    max_chunk_frames: int = 16
    batch_chunk_frames: int = 64  # batch work: frames per codec chunk (at most batch_call_frames / rows)
    batch_call_frames: int = 1024  # rows x frames of one codec call (bounds its memory: 4096 at 256 slots ran out)
    batch_call_frames_streams: int = 512  # ... while streams are about (a long call delays their decode steps)
    codec_streams: bool = True  # codec lanes on their own device streams, overlapping the decode steps
    codec_backend: str = "torch"  # torch | torch-compiled | built | auto (engines.codec.build.runtime_codec)
    codec_fast: Optional[bool] = None  # torch codec: channels-last fused upsampling stack (None: on CUDA)
    engine_cache: Optional[str] = None  # build-engines cache folder (None: next to the model)


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


class _Seq:
    def __init__(self, handle: StreamHandle, request: SynthesisRequest):
        self.handle, self.request = handle, request
        self.prompt = self.settings = None
        self.offset = 0  # prefill progress
        self.slot = -1  # current slot (slots move when others leave)
        self.side_row = -1  # side-cache row while prefilling
        self.pos = 0  # tokens in its cache (host copy of the device value)
        self.done = False  # no more frames will be made (finished, cancelled)
        self.priority = 0
        self.ref_codes = None
        self.frame_row = -1  # FrameStore row (from admission until its audio is decoded)
        self.member = None  # its place in a codec lane
        self.feed = request.text_feed  # text still arriving (engines.runtime.text_feed), or None
        self.text_open = False  # more text may come: its row is held when it has used every text row
        self.fed_ids: list = []  # text token ids given to the model so far (the first one in the prompt)
        self.text_rows = 0  # trailing rows in its slot
        self.feed_version = -1
        self.held = False  # the last collected step held its row (waiting for text)


@dataclass
class _Step:
    """A launched decode step whose outputs are on their way to host buffers."""

    seqs: list  # the sequence in each row at launch time
    n: int
    buf: torch.Tensor  # host flags [5, N]: emit, done, eos, bad, hold
    event: Optional[object]


class EngineRunner:
    def __init__(self, engine, config: Optional[EngineConfig] = None, **overrides):
        self.engine = engine
        self.cfg = replace(config or EngineConfig(), **overrides)
        self.device = engine.device
        talker = self.talker = engine.talker
        tc = talker.cfg
        dtype = talker.codec_head.weight.dtype
        n = self.cfg.max_slots
        self.buckets = tuple(b for b in self.cfg.batch_buckets if b < n) + (n,)
        self.table = SlotTable.allocate(n, tc.hidden_size, tc.vocab_size, tc.num_code_groups,
                                        self.cfg.max_text_rows, self.device, dtype)
        self.cache = talker.new_cache(n, self.cfg.max_context, self.device, dtype)
        self.side = talker.new_cache(self.cfg.prefill_batch, self.cfg.max_context, self.device, dtype)
        with torch.no_grad():
            ids = torch.tensor([engine.cfg.tts_pad_token_id], device=self.device)
            self.pad = talker.text_embed(ids)[0]  # [H]
        self.suppress = control_mask(talker, self.device)
        compile_regions = self.cfg.compile if self.cfg.compile is not None else self.device.type == "cuda"
        if compile_regions and getattr(engine, "root", None) is not None and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
            # compiled step regions persist next to the built codec engines: later starts load them
            from engines.codec.build import INDUCTOR_DIR, default_cache_dir

            cache = Path(self.cfg.engine_cache or default_cache_dir(engine.root)) / INDUCTOR_DIR
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
            os.environ.setdefault("TRITON_CACHE_DIR", str(cache / "triton"))
        self.fast = FastStep(talker, n, compile=compile_regions, gemv=self.cfg.gemv, fuse=self.cfg.fuse)
        # device graphs on accelerators only (on the CPU a "graph" would just run the work twice at capture)
        self.use_graphs = self.device.type != "cpu" and (self.cfg.use_graphs if self.cfg.use_graphs is not None
                                                         else self.device.type == "cuda")
        from engines.codec.build import runtime_codec

        cfg = self.cfg
        self.store = FrameStore(2 * n, cfg.max_context, tc.num_code_groups, self.device)
        # one memory pool for the decode graphs (they replay on one stream, one at a time); each codec lane
        # has its own stream and pool, so its calls overlap the decode steps
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs and self.device.type == "cuda" else None
        cuda = self.device.type == "cuda"
        # decode graphs are captured on one stream, each lane works on its own: never one cuBLAS workspace twice
        self._capture_stream, s_stream, b_stream = distinct_streams(self.device, (0, -1, 0)) if cuda else (None,) * 3
        self.lanes = {  # priority 0 (streams): waited for at once, high-priority stream; batch work: collected later
            "stream": CodecLane("stream", runtime_codec(engine, n, cfg.codec_backend, cfg.engine_cache, cfg.codec_fast),
                                self.store,
                                cfg.first_chunk_frames, cfg.max_chunk_frames, cfg.batch_call_frames, self.use_graphs,
                                wait=True, stream=s_stream),
            "batch": CodecLane("batch", runtime_codec(engine, n, cfg.codec_backend, cfg.engine_cache, cfg.codec_fast),
                               self.store,
                               cfg.batch_chunk_frames, cfg.batch_chunk_frames, cfg.batch_call_frames, self.use_graphs,
                               lazy_finish=True, wait=False, stream=b_stream),
        }
        self.lanes["stream"].urgent = self._running_dry
        for lane in self.lanes.values():
            lane.before_capture = self._drain
            lane.use_stream(cfg.codec_streams)
        reserve = n // 4 if self.cfg.stream_reserve < 0 else self.cfg.stream_reserve
        self.sched = Scheduler(n, self.cfg.max_queue, self.cfg.prefill_batch, reserve)
        self.slots = self.sched.slots
        self.table.frame_row.fill_(self.store.trash)  # free slots write their frames to the scratch row
        self.graphs: dict = {}
        # prefill graphs per (rows bucket, length bucket): a prompt chunk costs one replay, not ~30 launches/layer
        self.prefill_graphs: dict = {}
        pb, chunk = self.cfg.prefill_batch, self.cfg.prefill_chunk
        self.prefill_rows = tuple(b for b in self.cfg.batch_buckets if b < pb) + (pb,)
        self.prefill_lengths = tuple(t for t in PREFILL_LENGTHS if t < chunk) + (chunk,)
        self.overlap = self.cfg.overlap
        self._inflight: Optional[_Step] = None
        pin = self.device.type == "cuda"
        self._host = [torch.empty(5, n, dtype=torch.bool, pin_memory=pin) for _ in range(2)]
        self._cv = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._stop = False
        self.steps = 0
        self.frames = 0
        self.holds = 0  # rows x steps that waited for text
        # where streams' time to first audio goes, summed (seconds): submit -> admitted (queue), -> in a slot
        # (prefill), -> first frame read back (first_frame), -> first audio handed out (codec)
        self.ttfa_phases = dict.fromkeys(("queue", "prefill", "first_frame", "codec"), 0.0) | {"n": 0}
        # where the loop's wall time goes (seconds, summed): host work per phase, and waits for the device
        self.loop_s = dict.fromkeys(("admit", "decode_launch", "step_wait", "step_rows", "codec"), 0.0)

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

    def submit(self, request: SynthesisRequest, priority: int = 0) -> StreamHandle:
        """Queue a request; streams (priority 0) go before batch work (higher numbers)."""
        with self._cv:
            if self.sched.full(priority):
                raise EngineBusy(f"busy: {len(self.sched.queue)} requests already waiting; retry shortly")
            handle = StreamHandle(self, self.engine.sample_rate)
            seq = _Seq(handle, request)
            if seq.feed is not None:
                seq.feed.on_change = self.wake
            seq.priority = priority
            self.sched.push(seq, priority)
            self._cv.notify()
        return handle

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
        (batch bucket, cache-length bucket) and each codec lane call (batch, frames). Afterwards no
        capture or compilation happens on the request path. Call while idle (start-up). Returns the
        seconds spent and the graph counts (empty on the CPU, where nothing is captured)."""
        if not self.use_graphs:
            return {}
        if self.slots.n_active or self.sched.prefilling or any(l.busy for l in self.lanes.values()):
            raise RuntimeError("prepare() captures graphs on idle slots: call it before submitting requests")
        t0 = time.perf_counter()
        self._warm_prefill()
        for b in self.prefill_rows if self.use_graphs and self.cfg.prefill_graphs else ():
            for t in self.prefill_lengths:
                self._prefill_graph(b, t)
        step, cap = self.cfg.length_step, self.cfg.max_context
        lengths = sorted({length_bucket(x, step, cap) for x in range(step, cap + step, step)})
        for b in self.buckets:
            for length in lengths:
                cap = self.cfg.topk_cap if b >= self.cfg.topk_min_batch else 0  # the official defaults' variant
                if (b, length, cap) not in self.graphs:
                    cache = KVCache([k[:b, :, :length] for k in self.cache.k], [v[:b, :, :length] for v in self.cache.v])
                    args = (self.table.rows(b), cache, self.pad, self.suppress, self.store.codes, cap)
                    self.fast(*args)  # warm-up (and compilation) on free rows: they write only scratch
                    self._capture_step(b, length, args)
        t1 = time.perf_counter()
        for lane in self.lanes.values():  # largest calls first: the smaller ones reuse their pool's blocks
            for b, n in sorted(lane.shapes(), key=lambda s: -s[0] * s[1]):
                if (b, n) not in lane.graphs:
                    lane.capture(b, n)
        self._drain()
        t2 = time.perf_counter()
        out = {"decode_graphs": len(self.graphs), "prefill_graphs": len(self.prefill_graphs), "decode_capture_s": t1 - t0,
               "codec_graphs": sum(len(l.graphs) for l in self.lanes.values()), "codec_capture_s": t2 - t1}
        log.info("prepared %d decode graphs in %.1f s and %d codec graphs in %.1f s", out["decode_graphs"],
                 out["decode_capture_s"], out["codec_graphs"], out["codec_capture_s"])
        return out

    def _warm_prefill(self) -> None:
        """Run the prefill once per kind of shape it meets (one row or many, one token or many) on scratch
        side-cache rows, so its compiled regions exist before the first request (they are not captured:
        prompt lengths vary)."""
        pb, chunk = self.cfg.prefill_batch, self.cfg.prefill_chunk
        for b, t in {(1, 1), (min(2, pb), 1), (1, 5), (1, 9), (min(2, pb), 7), (min(3, pb), 11), (pb, chunk)}:
            x = torch.zeros(b, t, self.talker.cfg.hidden_size, device=self.device, dtype=self.table.hidden.dtype)
            pos = torch.arange(t, device=self.device)[None].expand(b, t).contiguous()
            side = KVCache([k[:b] for k in self.side.k], [v[:b] for v in self.side.v])
            self.fast.prefill(x, pos, side, torch.full((b,), t - 1, dtype=torch.long, device=self.device))

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

    def wake(self) -> None:
        with self._cv:
            self._cv.notify()

    def stats(self) -> dict:
        return {"active_slots": self.slots.n_active, "queued": len(self.sched.queue), "steps": self.steps,
                "frames": self.frames, "text_holds": self.holds, "ttfa_phases_s": dict(self.ttfa_phases), "graphs": len(self.graphs), "max_slots": self.cfg.max_slots,
                "loop_s": {k: round(v, 3) for k, v in self.loop_s.items()}
                | {"codec_wait": round(sum(lane.wait_s for lane in self.lanes.values()), 3)}}  # (inside "codec")

    # ----- loop ------------------------------------------------------------------------------------
    def _loop(self) -> None:
        if self.device.type == "cuda" and self.device.index is not None:  # a new thread starts on cuda:0;
            torch.cuda.set_device(self.device)  # one engine per GPU runs on its own ("cuda": the current one)
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

    def _has_work(self) -> bool:
        """Anything to do now (a loop with only rows waiting for text sleeps until a feed wakes it)."""
        return ((self.sched.has_work and not self._starved()) or self._inflight is not None
                or any(l.active for l in self.lanes.values()))

    def _starved(self) -> bool:
        """Every running request waits for text that has not come, and nothing else is queued or prefilling."""
        seqs = self.slots.seqs
        return (bool(seqs) and not len(self.sched.queue) and not self.sched.prefilling
                and all(seq.held and seq.text_open and seq.feed.version == seq.feed_version
                        and not seq.handle.cancelled for seq in seqs))

    @torch.no_grad()
    def step_once(self) -> None:
        """One iteration: cancellations, admission/prefill, one decode step, codec lanes."""
        for seq in list(self.slots.seqs):
            if seq.handle.cancelled and not seq.done:
                self._end(seq, dropped=True)
        t0 = time.perf_counter()
        self._admit()
        self._feed_text()
        self.loop_s["admit"] += time.perf_counter() - t0
        n = self.slots.n_active
        if n and not self._starved():
            self._decode(n)
        elif self._inflight is not None:
            self._collect(self._inflight)
            self._inflight = None
        t0 = time.perf_counter()
        self._run_codec()
        self.loop_s["codec"] += time.perf_counter() - t0

    def _lane(self, seq: _Seq) -> CodecLane:
        return self.lanes["stream" if seq.priority <= 0 else "batch"]

    def _room(self, seq: _Seq) -> bool:
        """Whether `seq` can be admitted now: a frame row and a place in its codec lane are free."""
        return self.store.n_free > 0 and self._lane(seq).free > 0

    def _admit(self) -> None:
        """Let the scheduler fill the prefill group, then prefill one chunk of every request in it."""
        group = self.sched.admit(self._cv, self._prepare, TTSError, self._room)
        if group:
            self._prefill_chunk(group)

    def _prepare(self, seq: _Seq) -> None:
        eng = self.engine
        seq.handle.marks["admit"] = time.perf_counter()
        if seq.feed is None:
            spec, ref_codes = eng.resolve(seq.request)
            seq.prompt = eng.prompts.build(spec)
            seq.settings = eng.sampling(seq.request.sampling, seq.request.text)
        else:
            spec, ref_codes = self._prepare_feed(seq)
        need = seq.prompt.prefill.shape[0] + seq.settings.max_new_tokens + 1
        if need > self.cfg.max_context:
            seq.settings = replace(seq.settings, max_new_tokens=self.cfg.max_context - seq.prompt.prefill.shape[0] - 1)
            if seq.settings.max_new_tokens < 2:
                raise TTSError(f"text too long for one request ({seq.prompt.prefill.shape[0]} prompt tokens); "
                               "split it into shorter segments")
        seq.ref_codes = ref_codes
        seq.frame_row = self.store.take(ref_codes)
        seq.member = self._lane(seq).add(seq, seq.frame_row, 0 if ref_codes is None else int(ref_codes.shape[0]))

    def _count_ttfa(self, h: StreamHandle) -> None:
        m, p = h.marks, self.ttfa_phases
        if all(k in m for k in ("admit", "slot", "frame", "audio")):
            for phase, a, b in (("queue", h.created, m["admit"]), ("prefill", m["admit"], m["slot"]),
                                ("first_frame", m["slot"], m["frame"]), ("codec", m["frame"], m["audio"])):
                p[phase] += b - a
            p["n"] += 1

    def _prepare_feed(self, seq: _Seq):
        """A request whose text is still arriving: streaming-text mode over the words there so far."""
        eng, feed = self.engine, seq.feed
        seq.feed_version = feed.version
        text, ended = feed.take()
        if not text:
            raise TTSError("no complete word to speak yet: append text (ending in a space) or end the feed "
                           "before submitting")
        req = replace(seq.request, text=text, non_streaming_text=False)
        spec, ref_codes = eng.resolve(req)
        if ref_codes is not None:
            raise UnsupportedMode("text that is still arriving cannot be spoken with a voice cloned with its "
                                  "reference text (ICL needs the whole text up front); use a voice saved without "
                                  "reference text, or send whole sentences")
        seq.prompt = eng.prompts.build(spec, text_open=not ended)
        seq.settings = eng.sampling(req.sampling, None)
        seq.fed_ids = eng.prompts.text_ids(text)
        seq.text_rows = seq.prompt.trailing.shape[0]
        seq.text_open = not ended
        return spec, ref_codes

    def _feed_text(self) -> None:
        """Give each running request whose feed changed its new complete words (and tts_eos at its end)."""
        prompts, cap = self.engine.prompts, self.cfg.max_text_rows
        for seq in self.slots.seqs:
            if not seq.text_open or seq.feed.version == seq.feed_version:
                continue
            seq.feed_version = seq.feed.version
            text, ended = seq.feed.take()
            ids = prompts.text_ids(text) if text else []
            if ids[:len(seq.fed_ids)] != seq.fed_ids:
                log.debug("live text re-tokenized differently at a word boundary; going on from token %d",
                          len(seq.fed_ids))
            new = ids[len(seq.fed_ids):]
            room = cap - seq.text_rows - 1  # one row kept for tts_eos
            if len(new) > room:
                log.warning("text still arriving passed %d tokens for one request: ending it there "
                            "(start a new request for the rest)", cap)
                new, ended = new[:max(room, 0)], True
            if not new and not ended:
                continue
            rows = prompts.text_rows(new, end=ended)
            self.table.append_text(seq.slot, seq.text_rows, rows, ended)
            seq.text_rows += rows.shape[0]
            seq.fed_ids += new
            seq.text_open = not ended
            seq.held = seq.member.stalled = False

    def _prefill_chunk(self, group: list) -> None:
        """Up to `prefill_chunk` prompt rows of every request in `group`, as one batch over side-cache rows
        [0, b) (shorter rows are padded; their padding lands beyond their own length, which is never
        attended to nor copied). Requests whose prompt is complete move into a slot."""
        b = max(seq.side_row for seq in group) + 1
        t = min(self.cfg.prefill_chunk, max(seq.prompt.prefill.shape[0] - seq.offset for seq in group))
        dev, cap = self.device, self.cfg.max_context - 1
        graph = None
        if self.use_graphs and self.cfg.prefill_graphs:  # padded up to a captured (rows, length) bucket
            b, t = pick_bucket(b, self.prefill_rows), pick_bucket(t, self.prefill_lengths)
            graph, x, pos, last, hidden = self._prefill_graph(b, t)
            x.zero_()
            pos.fill_(cap)
            last.zero_()
        else:
            x = torch.zeros(b, t, self.talker.cfg.hidden_size, device=dev, dtype=self.table.hidden.dtype)
            pos = torch.full((b, t), cap, device=dev, dtype=torch.long)  # idle rows write only the never-used last slot
            last = torch.zeros(b, dtype=torch.long, device=dev)
        for seq in group:
            rows = seq.prompt.prefill[seq.offset:seq.offset + t]
            x[seq.side_row, :rows.shape[0]] = rows
            pos[seq.side_row] = torch.arange(seq.offset, seq.offset + t, device=dev).clamp(max=cap)
            last[seq.side_row].fill_(rows.shape[0] - 1)  # (a plain setitem would sync the stream)
        if graph is not None:
            graph.replay()
        else:
            side = KVCache([k[:b] for k in self.side.k], [v[:b] for v in self.side.v])
            hidden = self.fast.prefill(x, pos, side, last)  # [b, H]
        t = min(t, max(seq.prompt.prefill.shape[0] - seq.offset for seq in group))  # rows taken per request
        for seq in list(group):
            seq.offset = min(seq.offset + t, seq.prompt.prefill.shape[0])
            if seq.offset < seq.prompt.prefill.shape[0]:
                continue
            end, row = seq.offset, seq.side_row
            slot = self.sched.prefilled(seq)
            seq.handle.marks["slot"] = time.perf_counter()
            seq.pos = end
            # masked positions still enter attention as 0 * value: clear what a free slot left there
            self.cache.copy_row(slot, self.side, row, end, clear_rest=True)
            self.table.load(slot, seq.prompt, hidden[row], seq.settings, seq.frame_row, seq.member.n_ref,
                            seq.text_open)

    def _prefill_graph(self, b: int, t: int) -> tuple:
        """(graph, x, pos, last, hidden) of the prefill over side-cache rows [0, b) for chunks of t rows,
        captured on first use (prepare() captures every bucket at start-up)."""
        if (b, t) not in self.prefill_graphs:
            self._drain()
            dev, cap = self.device, self.cfg.max_context - 1
            x = torch.zeros(b, t, self.talker.cfg.hidden_size, device=dev, dtype=self.table.hidden.dtype)
            pos = torch.full((b, t), cap, device=dev, dtype=torch.long)
            last = torch.zeros(b, dtype=torch.long, device=dev)
            side = KVCache([k[:b] for k in self.side.k], [v[:b] for v in self.side.v])
            self.fast.prefill(x, pos, side, last)  # warm-up (and compilation): writes only the unused last slot
            graph = make_graph(self.device, self._pool, self._capture_stream)
            hidden = graph.capture(lambda: self.fast.prefill(x, pos, side, last), warmup=0)
            self.prefill_graphs[(b, t)] = (graph, x, pos, last, hidden)
            log.info("captured prefill graph rows=%d length=%d", b, t)
        return self.prefill_graphs[(b, t)]

    def _drain(self) -> None:
        """Finish the step in flight before a graph capture: no copy or event may be pending then."""
        if self._inflight is not None:
            rec, self._inflight = self._inflight, None
            self._collect(rec)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _decode(self, n: int) -> None:
        """Launch one step; read back the previous one meanwhile (overlap) or this one (no overlap)."""
        b, length = self._bucket(n)
        if self.use_graphs and (b, length, self._k_cap(self.slots.seqs, b)) not in self.graphs:
            self._drain()
        t0 = time.perf_counter()
        rec = self._launch(n)
        self.loop_s["decode_launch"] += time.perf_counter() - t0
        prev, self._inflight = self._inflight, rec
        if prev is not None:
            self._collect(prev)
        if not self.overlap:
            self._collect(rec)
            self._inflight = None

    def _bucket(self, n: int) -> tuple[int, int]:
        """(batch bucket, cache-length bucket) of a step over slots [0, n), from host-side lengths."""
        need = max(seq.pos for seq in self.slots.seqs[:n]) + 2
        return pick_bucket(n, self.buckets), length_bucket(need, self.cfg.length_step, self.cfg.max_context)

    def _launch(self, n: int) -> "_Step":
        """Replay the step for slots [0, n) and queue the copy of its flags to a host buffer."""
        seqs = list(self.slots.seqs)
        self._run_step(*self._bucket(n))
        self.steps += 1
        for seq in seqs:
            seq.pos += 1
        t, buf = self.table, self._host[self.steps % 2]
        for i, src in enumerate((t.emit, t.done, t.eos, t.bad, t.hold)):
            buf[i, :n].copy_(src[:n], non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        return _Step(seqs, n, buf, event)

    def _collect(self, rec: "_Step") -> None:
        """Count a finished step's frames for the codec lanes; end the requests that are done."""
        t0 = time.perf_counter()
        if rec.event is not None:
            rec.event.synchronize()
        t1 = time.perf_counter()
        self.loop_s["step_wait"] += t1 - t0
        emit, done, eos, bad, hold = rec.buf[:, :rec.n].tolist()
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

    def _k_cap(self, seqs, b: int) -> int:
        """The top-k cap a step over `seqs` in batch bucket b sorts with: cfg.topk_cap when b >= topk_min_batch
        and every sampling row keeps at most that many ids (true for the official defaults, top-k 50), else 0
        (the whole vocabulary is sorted)."""
        cap = self.cfg.topk_cap if b >= self.cfg.topk_min_batch else 0
        for seq in seqs if cap else ():
            s = seq.settings
            if (s.do_sample and not 0 < s.top_k <= cap) or (s.subtalker_dosample and not 0 < s.subtalker_top_k <= cap):
                return 0
        return cap

    def _run_step(self, b: int, length: int) -> None:
        cache = KVCache([k[:b, :, :length] for k in self.cache.k], [v[:b, :, :length] for v in self.cache.v])
        k_cap = self._k_cap(self.slots.seqs, b)
        args = (self.table.rows(b), cache, self.pad, self.suppress, self.store.codes, k_cap)
        if not self.use_graphs:
            self.fast(*args)
            return
        graph = self.graphs.get((b, length, k_cap))
        if graph is None:
            self.fast(*args)  # this iteration's real step, also the warm-up (and compilation) before capture
            self._capture_step(b, length, args)
            return
        graph.replay()

    def _capture_step(self, b: int, length: int, args: tuple) -> None:
        graph = make_graph(self.device, self._pool, self._capture_stream)
        graph.capture(lambda: (self.fast(*args), self.table.codes)[1], warmup=0)
        self.graphs[(b, length, args[-1])] = graph
        log.info("captured decode graph batch=%d length=%d top-k cap=%d", b, length, args[-1])

    def _end(self, seq: _Seq, dropped: bool = False) -> None:
        """No more frames for `seq`: its slot is freed now; its codec lane decodes what is left (or drops it)."""
        seq.done = True
        seq.member.finished = True
        seq.member.dropped = dropped
        if seq.slot >= 0:
            self._retire(seq.slot)
            seq.slot = -1

    def _run_codec(self) -> None:
        """Every lane that is due launches a call; what finished calls made goes to the requests, and the
        requests whose audio is complete end (their FrameStore row is free again)."""
        idle = not self.slots.n_active and self._inflight is None and not self.sched.has_work
        batch = self.lanes["batch"]  # while streams are about, its calls are kept short
        batch.frames_per_call = min(self.cfg.batch_call_frames_streams, batch.max_frames_per_call) \
            if self.sched.streams_about() else batch.max_frames_per_call
        for lane in self.lanes.values():
            self._deliver(*lane.run(block=idle))  # nothing else to do: wait for the codec rather than spin

    def _running_dry(self, m) -> bool:
        """A stream whose listener (playing since its first audio, in real time) has less than
        URGENT_S of audio left: the loop waits for the codec call that carries its next audio."""
        h = m.seq.handle
        start = h.marks.get("audio")
        return start is not None and h.samples / h.sample_rate - (time.perf_counter() - start) < URGENT_S

    def _deliver(self, out: list, complete: list) -> None:
        for m, audio in out:
            first = m.seq.handle.ttfa_s is None
            m.seq.handle.add_audio(audio)
            if first and m.seq.priority <= 0 and m.seq.handle.ttfa_s is not None:
                self._count_ttfa(m.seq.handle)
        for m in complete:
            if not m.dropped:
                m.seq.handle.codes, m.seq.handle.lead = m.codes, m.lead
            self.store.give(m.frame_row)
            m.seq.handle.finish()

    def _retire(self, slot: int) -> None:
        move = self.slots.remove(slot)
        trash = self.store.trash
        self.table.free(slot, trash)  # free slots keep stepping inside the bucket: finite, writing to scratch
        if move is None:
            return
        src, dst = move
        self.slots.seqs[dst].slot = dst
        self.cache.copy_row(dst, self.cache, src, min(self.slots.seqs[dst].pos, self.cfg.max_context))
        self.table.move(src, dst)
        self.table.free(src, trash)

    def _fail_all(self, message: str) -> None:
        for seq in self.sched.drop_all():
            seq.handle.fail(TTSError(message))
        for lane in self.lanes.values():
            _, complete = lane.drain()
            for m in complete + lane.members:
                m.seq.handle.fail(TTSError(message))
                self.store.give(m.frame_row)
            lane.reset_all()
        self._inflight = None
        for slot in range(self.cfg.max_slots):
            self.table.free(slot, self.store.trash)
