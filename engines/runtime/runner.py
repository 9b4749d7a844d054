"""EngineRunner: continuous batching over a fixed slot table, streaming PCM out per request.

    runner = EngineRunner(engine, max_slots=64); runner.start()
    h = runner.submit(SynthesisRequest(...))        # EngineBusy when the admission queue is full
    for chunk in h: ...                             # float32 PCM chunks as they are made
    h.cancel()                                      # frees the slot at the next step

The loop is schedule -> run -> postprocess: admit queued requests (prefill in chunks, up to
`prefill_batch` requests together, into side-cache rows then copied into free slots), run one decode step for every
active slot (a captured device graph per (batch bucket, cache-length bucket) on CUDA, the same code
eagerly elsewhere), hand frames to the streaming codec (batched over slots; a small first chunk,
growing after), and retire finished requests by moving the last slot into the hole.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Optional

import torch

from engines.api import SynthesisRequest, SynthesisResult
from engines.model.errors import TTSError
from engines.model.generate import control_mask
from engines.model.layers import KVCache

from engines.runtime.scheduler import Scheduler, length_bucket, pick_bucket
from engines.runtime.decode_step import FastStep
from engines.runtime.slots import SlotTable
from engines.runtime.stream import CodecStreams, StreamHandle

log = logging.getLogger(__name__)


class EngineBusy(TTSError):
    """The admission queue is full: try again shortly."""


@dataclass(frozen=True)
class EngineConfig:
    max_slots: int = 64
    max_queue: int = 256
    max_context: int = 2048  # talker cache length per slot (prompt + frames)
    max_text_rows: int = 1024  # streaming-text rows per request
    prefill_chunk: int = 256  # prompt tokens per request per loop iteration (keeps streams flowing)
    prefill_batch: int = 8  # requests prefilled together (side-cache rows)
    length_step: int = 256  # cache-length bucket granularity
    batch_buckets: tuple = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    use_graphs: Optional[bool] = None  # None: on CUDA
    # read a step's codes back while the next step runs (pinned buffers + events)
    overlap: bool = True
    compile: Optional[bool] = None  # compile the step's regions with torch.compile; None: on CUDA
    gemv: bool = True  # compiled path: one-row matmuls as fused reductions (batch-1 bucket)
    first_chunk_frames: int = 1
    max_chunk_frames: int = 16
    codec_backend: str = "torch"  # torch | torch-compiled | built | auto (engines.codec.build.runtime_codec)
    engine_cache: Optional[str] = None  # build-engines cache folder (None: next to the model)


class _Seq:
    def __init__(self, handle: StreamHandle, request: SynthesisRequest):
        self.handle, self.request = handle, request
        self.prompt = self.settings = None
        self.offset = 0  # prefill progress
        self.slot = -1  # current slot (slots move when others leave)
        self.side_row = -1  # side-cache row while prefilling
        self.pos = 0  # tokens in its cache (host copy of the device value)
        self.done = False


@dataclass
class _Step:
    """A launched decode step whose outputs are on their way to host buffers."""

    seqs: list  # the sequence in each row at launch time
    n: int
    buf: tuple  # host codes, emit, done, eos
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
        self._codebook = engine.decoder.config.codebook_size
        compile_regions = self.cfg.compile if self.cfg.compile is not None else self.device.type == "cuda"
        self.fast = FastStep(talker, n, compile=compile_regions, gemv=self.cfg.gemv)
        self.use_graphs = self.cfg.use_graphs if self.cfg.use_graphs is not None else self.device.type == "cuda"
        from engines.codec.build import runtime_codec

        self.codec = CodecStreams(runtime_codec(engine, n, self.cfg.codec_backend, self.cfg.engine_cache), n,
                                  self.cfg.first_chunk_frames, self.cfg.max_chunk_frames, engine.sample_rate,
                                  use_graphs=self.use_graphs)
        self.codec.before_capture = self._drain
        self.sched = Scheduler(n, self.cfg.max_queue, self.cfg.prefill_batch)
        self.slots = self.sched.slots
        self.graphs: dict = {}
        self._pool = None
        self.overlap = self.cfg.overlap
        self._inflight: Optional[_Step] = None
        pin = self.device.type == "cuda"
        self._host = [(torch.empty(n, tc.num_code_groups, dtype=torch.long, pin_memory=pin),
                       *(torch.empty(n, dtype=torch.bool, pin_memory=pin) for _ in range(3))) for _ in range(2)]
        self._cv = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._stop = False
        self.steps = 0
        self.frames = 0

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
            self.sched.push(_Seq(handle, request), priority)
            self._cv.notify()
        return handle

    def synthesize(self, requests: list[SynthesisRequest], priority: int = 1) -> list[SynthesisResult]:
        """Whole-audio results for a batch (batch priority by default). Waits for room when the admission
        queue is full; runs the loop in this thread when no background thread runs. Raises the first
        request's error, if any (after all have ended)."""
        handles = []
        for req in requests:
            while True:
                try:
                    handles.append(self.submit(req, priority))
                    break
                except EngineBusy:  # streams come first: wait for room (or make it, without a thread)
                    if self._thread is None:
                        self.step_once()
                    else:
                        time.sleep(0.02)
        if self._thread is None:
            while not all(h.done for h in handles):
                self.step_once()
        results, error = [], None
        for h in handles:
            try:
                results.append(h.result())
            except Exception as exc:  # noqa: BLE001 - reported after every handle has ended
                error = error or exc
        if error is not None:
            raise error
        return results

    def clone_voice(self, ref_audio, ref_text: Optional[str] = None):
        """A voice cloned once from reference audio, to pass as `SynthesisRequest.voice` (Base checkpoints)."""
        return self.engine.make_voice(ref_audio, ref_text)

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
                "frames": self.frames, "graphs": len(self.graphs), "max_slots": self.cfg.max_slots}

    # ----- loop ------------------------------------------------------------------------------------
    def _loop(self) -> None:
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
        return self.sched.has_work or self._inflight is not None

    @torch.no_grad()
    def step_once(self) -> None:
        """One iteration: cancellations, admission/prefill, one decode step, codec, retirement."""
        for slot, seq in enumerate(list(self.slots.seqs)):
            if seq.handle.cancelled and not seq.done:
                seq.done = True
        self._admit()
        n = self.slots.n_active
        if n:
            self._decode(n)
        elif self._inflight is not None:
            self._collect(self._inflight)
            self._inflight = None
        self._codec_and_retire()

    def _admit(self) -> None:
        """Let the scheduler fill the prefill group, then prefill one chunk of every request in it."""
        group = self.sched.admit(self._cv, self._prepare, TTSError)
        if group:
            self._prefill_chunk(group)

    def _prepare(self, seq: _Seq) -> None:
        eng = self.engine
        spec, ref_codes = eng.resolve(seq.request)
        seq.prompt = eng.prompts.build(spec)
        seq.settings = eng.sampling(seq.request.sampling, seq.request.text)
        need = seq.prompt.prefill.shape[0] + seq.settings.max_new_tokens + 1
        if need > self.cfg.max_context:
            seq.settings = replace(seq.settings, max_new_tokens=self.cfg.max_context - seq.prompt.prefill.shape[0] - 1)
            if seq.settings.max_new_tokens < 2:
                raise TTSError(f"text too long for one request ({seq.prompt.prefill.shape[0]} prompt tokens); "
                               "split it into shorter segments")
        seq.ref_codes = ref_codes

    def _prefill_chunk(self, group: list) -> None:
        """Up to `prefill_chunk` prompt rows of every request in `group`, as one batch over side-cache rows
        [0, b) (shorter rows are padded; their padding lands beyond their own length, which is never
        attended to nor copied). Requests whose prompt is complete move into a slot."""
        b = max(seq.side_row for seq in group) + 1
        t = min(self.cfg.prefill_chunk, max(seq.prompt.prefill.shape[0] - seq.offset for seq in group))
        dev, cap = self.device, self.cfg.max_context - 1
        x = torch.zeros(b, t, self.talker.cfg.hidden_size, device=dev, dtype=self.table.hidden.dtype)
        pos = torch.full((b, t), cap, device=dev, dtype=torch.long)  # idle rows write only the never-used last slot
        last = torch.zeros(b, dtype=torch.long, device=dev)
        for seq in group:
            rows = seq.prompt.prefill[seq.offset:seq.offset + t]
            x[seq.side_row, :rows.shape[0]] = rows
            pos[seq.side_row] = torch.arange(seq.offset, seq.offset + t, device=dev).clamp(max=cap)
            last[seq.side_row] = rows.shape[0] - 1
        side = KVCache([k[:b] for k in self.side.k], [v[:b] for v in self.side.v])
        hidden = self.fast.prefill(x, pos, side, last)  # [b, H]
        for seq in list(group):
            seq.offset = min(seq.offset + t, seq.prompt.prefill.shape[0])
            if seq.offset < seq.prompt.prefill.shape[0]:
                continue
            end, row = seq.offset, seq.side_row
            slot = self.sched.prefilled(seq)
            seq.pos = end
            for k, k_side in zip(self.cache.k + self.cache.v, self.side.k + self.side.v):
                k[slot, :, :end].copy_(k_side[row, :, :end])
                # masked positions still enter attention as 0 * value: clear what a free slot left there
                k[slot, :, end:].zero_()
            self.table.load(slot, seq.prompt, hidden[row], seq.settings)
            self.codec.start(slot, seq.ref_codes)

    def _drain(self) -> None:
        """Finish the step in flight before a graph capture: no copy or event may be pending then."""
        if self._inflight is not None:
            rec, self._inflight = self._inflight, None
            self._collect(rec)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _decode(self, n: int) -> None:
        """Launch one step; read back the previous one meanwhile (overlap) or this one (no overlap)."""
        if self.use_graphs and self._bucket(n) not in self.graphs:
            self._drain()
        rec = self._launch(n)
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
        """Replay the step for slots [0, n) and queue the copies of its outputs to host buffers."""
        seqs = list(self.slots.seqs)
        self._run_step(*self._bucket(n))
        self.steps += 1
        for seq in seqs:
            seq.pos += 1
        t, buf = self.table, self._host[self.steps % 2]
        for src, dst in ((t.codes, buf[0]), (t.emit, buf[1]), (t.done, buf[2]), (t.eos, buf[3])):
            dst[:n].copy_(src[:n], non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        return _Step(seqs, n, buf, event)

    def _collect(self, rec: "_Step") -> None:
        """Hand a finished step's frames to the codec and the handles; mark finished requests."""
        if rec.event is not None:
            rec.event.synchronize()
        n = rec.n
        codes = rec.buf[0][:n].clone()
        out_of_range = rec.buf[1][:n] & ((codes < 0) | (codes >= self._codebook)).any(1)  # one vector op per step
        emit, done, eos = (x[:n].tolist() for x in rec.buf[1:])
        bad = out_of_range.nonzero().flatten().tolist()
        assert not bad, f"internal: out-of-range codes in slots {bad}: {codes[bad].tolist()} (step {self.steps})"
        for i, seq in enumerate(rec.seqs):
            if seq.done:  # finished (or cancelled) earlier: later rows of it are not real
                continue
            if emit[i]:
                self.codec.push_frame(seq.slot, codes[i])
                seq.handle.add_codes(codes[i])
                self.frames += 1
            if done[i]:
                seq.done = True
                seq.handle.finished_by_eos = bool(eos[i])

    def _run_step(self, b: int, length: int) -> None:
        cache = KVCache([k[:b, :, :length] for k in self.cache.k], [v[:b, :, :length] for v in self.cache.v])
        args = (self.table.rows(b), cache, self.pad, self.suppress)
        if not self.use_graphs:
            self.fast(*args)
            return
        graph = self.graphs.get((b, length))
        if graph is None:
            from engines.device.graphs import make_graph

            self.fast(*args)  # this iteration's real step, also the warm-up (and compilation) before capture
            if self._pool is None and self.device.type == "cuda":
                self._pool = torch.cuda.graph_pool_handle()
            graph = make_graph(self.device, self._pool)
            graph.capture(lambda: (self.fast(*args), self.table.codes)[1], warmup=0)
            self.graphs[(b, length)] = graph
            log.info("captured decode graph batch=%d length=%d", b, length)
            return
        graph.replay()

    def _codec_and_retire(self) -> None:
        seqs = self.slots.seqs
        if not seqs:
            return
        finished = [s.done for s in seqs]
        for slot, audio in self.codec.run(len(seqs), finished):
            seqs[slot].handle.add_audio(audio)
        for slot in reversed(range(len(seqs))):
            seq = seqs[slot]
            if seq.done and not self.codec.n_pending(slot):
                self._retire(slot)
                seq.handle.finish()

    def _retire(self, slot: int) -> None:
        move = self.slots.remove(slot)
        self.table.done[slot] = True
        self.table.hidden[slot] = 0  # free slots keep stepping inside the bucket: keep them finite
        if move is None:
            return
        src, dst = move
        self.slots.seqs[dst].slot = dst
        p = min(self.slots.seqs[dst].pos, self.cfg.max_context)
        for k in self.cache.k + self.cache.v:
            k[dst, :, :p].copy_(k[src, :, :p])
        self.table.move(src, dst)
        self.table.done[src] = True
        self.table.hidden[src] = 0
        self.codec.move(src, dst)

    def _fail_all(self, message: str) -> None:
        for seq in self.sched.drop_all():
            seq.handle.fail(TTSError(message))
        self._inflight = None
        self.table.done.fill_(True)
        self.codec.reset_all()
