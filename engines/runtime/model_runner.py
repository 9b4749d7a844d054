"""ModelRunner: the device side of the engine loop.

It owns every device tensor of the loop (the slot table, the talker's KV cache and the prefill side
cache, the FrameStore the decode step writes frames to), the decode step and the prefill, and every
captured device graph: a decode graph per (batch bucket, cache-length bucket, top-k cap), a prefill
graph per (rows bucket, length bucket). `prepare()` captures them all at start-up.

    prefill(group) -> (sequences whose prompt is complete, their hidden rows); place(slot, seq, hidden)
    launch(seqs, n) -> Step  (the step for slots [0, n), its flags on their way to a host buffer)
    wait(step) -> flags      (emit, done, eos, bad, hold lists for rows [0, n))
    retire(slot, move)       (free a slot; the last active slot moves into the hole)

It decides nothing about who runs: the scheduler does (engines.runtime.scheduler).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from engines.device.graphs import distinct_streams, make_graph
from engines.model import kv_cache
from engines.model.generate import control_mask
from engines.names import KV_CACHES
from engines.runtime import attention, attention_split
from engines.runtime.config import EngineConfig
from engines.runtime.decode_step import FastStep
from engines.runtime.linears import linear_setting
from engines.runtime.scheduler import length_bucket, pick_bucket
from engines.runtime.slots import SlotTable
from engines.runtime.stream import FrameStore

log = logging.getLogger(__name__)
PREFILL_LENGTHS = (16, 32, 64, 128)  # prompt-chunk length buckets of the captured prefill (then prefill_chunk)
FLAGS = ("emit", "done", "eos", "bad", "hold")  # per-row step outputs read back by the host


@dataclass
class Step:
    """A launched decode step whose flags are on their way to a host buffer."""

    seqs: list  # the sequence in each row at launch time
    n: int
    buf: torch.Tensor  # host flags [5, N]: FLAGS
    event: Optional[object]


def kernel_choice(setting: str, wanted: Optional[bool], device: torch.device) -> bool:
    """Whether a Triton kernel of the step runs: unset (None) where it can (engines.runtime.attention.available);
    asked for where it cannot is a clear error."""
    can = attention.available(device)
    if wanted and not can:
        raise ValueError(f"{setting}: the Triton kernel cannot run on {device} (it needs an NVIDIA GPU of compute "
                         "capability 8.0 or later and the triton package); leave it unset")
    return can if wanted is None else bool(wanted)


AUTO_FP8 = False  # runtime.kv_cache: auto -> fp8 where it can run (flip once measured on a GPU: docs/PERFORMANCE.md)


def kv_cache_choice(setting: str, device: torch.device) -> bool:
    """Whether the talker's key/value cache is fp8 (`runtime.kv_cache`): model keeps the model's dtype, auto too
    until fp8 is measured on a GPU (AUTO_FP8; then fp8 where it can run); fp8 where it cannot run is a clear
    error. The loader's memory plan and `info` take the same answer (engines.load.settings)."""
    if setting not in KV_CACHES:
        raise ValueError(f"runtime.kv_cache: {setting!r} is not one of {', '.join(KV_CACHES)}")
    if setting == "auto":
        return AUTO_FP8 and kv_cache.fp8_available(device)
    if setting != "fp8":
        return False
    if not kv_cache.fp8_available(device):
        raise ValueError(f"runtime.kv_cache: fp8 cannot run on {device} (it needs torch with float8 support and, on "
                         "a GPU, an NVIDIA GPU of compute capability 8.9 or later with the triton package); set it "
                         "to auto or model")
    return True


AUTO_SPLIT = False  # runtime.attn_split unset -> the split kernel where the attention kernel runs (flip once measured)


def attn_split_choice(wanted: Optional[bool], kernel: bool) -> bool:
    """Whether the talker's decode attention runs split over programs per row (engines.runtime.attention_split;
    `runtime.attn_split`): unset (None) is AUTO_SPLIT where the attention kernel runs; true without the kernel is a
    clear error."""
    if wanted and not kernel:
        raise ValueError("runtime.attn_split: the split attention needs the attention kernel (runtime.attn_kernel: "
                         "an NVIDIA GPU of compute capability 8.0 or later with the triton package); leave it unset")
    return kernel and (AUTO_SPLIT if wanted is None else bool(wanted))


class ModelRunner:
    def __init__(self, engine, cfg: EngineConfig, timings: dict):
        self.engine, self.cfg, self.timings = engine, cfg, timings
        self.device = engine.device
        talker = self.talker = engine.talker
        tc = talker.cfg
        dtype = talker.codec_head.weight.dtype
        n = cfg.max_slots
        self.buckets = tuple(b for b in cfg.batch_buckets if b < n) + (n,)
        self.table = SlotTable.allocate(n, tc.hidden_size, tc.vocab_size, tc.num_code_groups, cfg.max_text_rows,
                                        self.device, dtype)
        self.fp8 = kv_cache_choice(cfg.kv_cache, self.device)  # the talker's cache (the predictor's: model dtype)
        # CPU: caches take memory where written, a slot's handed back when its request leaves (engines.runtime.memory)
        self.lazy = self.device.type == "cpu" and not self.fp8
        self.cache = talker.new_cache(n, cfg.max_context, self.device, dtype, self.fp8, self.lazy)
        self.side = talker.new_cache(cfg.prefill_batch, cfg.max_context, self.device, dtype, self.fp8, self.lazy)
        log.info("talker key/value cache: %s", "fp8 (e4m3, a scale per vector)" if self.fp8 else dtype)
        with torch.no_grad():
            ids = torch.tensor([engine.cfg.tts_pad_token_id], device=self.device)
            self.pad = talker.text_embed(ids)[0]  # [H]
        self.suppress = control_mask(talker, self.device)
        compile_regions = cfg.compile if cfg.compile is not None else self.device.type == "cuda"
        if compile_regions and getattr(engine, "root", None) is not None and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
            # compiled step regions persist next to the built codec engines: later starts load them
            from engines.codec.manifest import INDUCTOR_DIR, default_cache_dir

            cache = Path(cfg.engine_cache or default_cache_dir(engine.root)) / INDUCTOR_DIR
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
            os.environ.setdefault("TRITON_CACHE_DIR", str(cache / "triton"))
        kernel = kernel_choice("runtime.attn_kernel", cfg.attn_kernel, self.device)
        sample_kernel = kernel_choice("runtime.sample_kernel", cfg.sample_kernel, self.device)
        row_kernel = kernel_choice("row_kernel", cfg.row_kernel, self.device)
        layer_kernel = kernel_choice("runtime.layer_kernel", cfg.layer_kernel, self.device)
        self.linear, why = linear_setting(cfg.linear, self.device, dtype)
        if self.linear != "model":
            log.info("decoder layers: %s weights (%s)", self.linear, why)
        self.split = attn_split_choice(cfg.attn_split, kernel)
        if self.split and self.device.type == "cuda":
            attention_split.multiprocessors(self.device.index or 0)  # asked now, outside the compiled step
        self.fast = FastStep(talker, n, compile=compile_regions, gemv=cfg.gemv, fuse=cfg.fuse, kernel=kernel,
                             sample_kernel=sample_kernel, row_kernel=row_kernel, layer_kernel=layer_kernel,
                             linear=self.linear, attn_split=self.split)
        # device graphs on accelerators only (on the CPU a "graph" would just run the work twice at capture)
        self.use_graphs = self.device.type != "cpu" and (cfg.use_graphs if cfg.use_graphs is not None
                                                         else self.device.type == "cuda")
        # steps that are neither captured nor compiled run the exact rows and cache length, not their buckets
        self.exact = not self.use_graphs and not compile_regions
        self.store = FrameStore(2 * n, cfg.max_context, tc.num_code_groups, self.device)
        self.table.frame_row.fill_(self.store.trash)  # free slots write their frames to the scratch row
        # one memory pool for the decode graphs (they replay on one stream, one at a time); each codec lane
        # has its own stream and pool, so its calls overlap the decode steps
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs and self.device.type == "cuda" else None
        cuda = self.device.type == "cuda"
        # decode graphs are captured on one stream, each lane works on its own: never one cuBLAS workspace twice.
        # The loop's own work (decode steps, prefill) runs on `run_stream`, above the batch codec lane's: a
        # book's long codec calls yield the GPU to the step every stream waits for; the stream lane is highest.
        streams = distinct_streams(self.device, (0, -1, -2, 0)) if cuda else (None,) * 4
        self.capture_stream, self.run_stream, *self.lane_streams = streams
        self.graphs: dict = {}
        # prefill graphs per (rows bucket, length bucket): a prompt chunk costs one replay, not ~30 launches/layer
        self.prefill_graphs: dict = {}
        pb, chunk = cfg.prefill_batch, cfg.prefill_chunk
        self.prefill_rows = tuple(b for b in cfg.batch_buckets if b < pb) + (pb,)
        self.prefill_lengths = tuple(t for t in PREFILL_LENGTHS if t < chunk) + (chunk,)
        pin = self.device.type == "cuda"
        self._host = [torch.empty(len(FLAGS), n, dtype=torch.bool, pin_memory=pin) for _ in range(2)]
        self.steps = 0

    # ----- prefill ---------------------------------------------------------------------------------
    def prefill(self, group: list) -> tuple[list, Optional[torch.Tensor]]:
        """Up to `prefill_chunk` prompt rows of every sequence in `group`, as one batch over side-cache rows
        [0, b) (shorter rows are padded; their padding lands beyond their own length, which is never
        attended to nor copied; where nothing is captured, the side cache is cut to the positions the chunk
        reaches). Returns the sequences whose prompt is now complete and the hidden rows
        `[b, H]` (row = side row) to `place` them with (a view: place them before the next prefill)."""
        b = max(seq.side_row for seq in group) + 1
        t = min(self.cfg.prefill_chunk, max(seq.prompt.prefill.shape[0] - seq.offset for seq in group))
        dev, cap = self.device, self.cfg.max_context - 1
        length = None  # the side cache's whole length
        if self.exact:  # nothing captured: attend over the positions this chunk reaches, not the whole context
            length = min(cap + 1, max(seq.offset for seq in group) + t)
            cap = length - 1
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
            hidden = self.fast.prefill(x, pos, self.side.rows(0, b, length), last)  # [b, H]
        t = min(t, max(seq.prompt.prefill.shape[0] - seq.offset for seq in group))  # rows taken per request
        complete = []
        for seq in group:
            seq.offset = min(seq.offset + t, seq.prompt.prefill.shape[0])
            if seq.offset >= seq.prompt.prefill.shape[0]:
                complete.append(seq)
        return complete, hidden

    def place(self, slot: int, seq, hidden: torch.Tensor) -> None:
        """Move a sequence whose prompt is prefilled from its side-cache row into `slot` (`hidden` [H]: its
        talker state)."""
        end = seq.pos = seq.offset
        # masked positions still enter attention as 0 * value: clear what a free slot left there
        self.cache.copy_row(slot, self.side, seq.side_row, end, clear_rest=True)
        if self.lazy:  # the side row's memory goes back until the next prompt writes it
            self.side.clear(seq.side_row)
        self.table.load(slot, seq.prompt, hidden, seq.settings, seq.frame_row, seq.member.n_ref, seq.text_open)

    def _prefill_graph(self, b: int, t: int) -> tuple:
        """(graph, x, pos, last, hidden) of the prefill over side-cache rows [0, b) for chunks of t rows,
        captured on first use (prepare() captures every bucket at start-up)."""
        if (b, t) not in self.prefill_graphs:
            self.drain()
            dev, cap = self.device, self.cfg.max_context - 1
            x = torch.zeros(b, t, self.talker.cfg.hidden_size, device=dev, dtype=self.table.hidden.dtype)
            pos = torch.full((b, t), cap, device=dev, dtype=torch.long)
            last = torch.zeros(b, dtype=torch.long, device=dev)
            side = self.side.rows(0, b)
            self.fast.prefill(x, pos, side, last)  # warm-up (and compilation): writes only the unused last slot
            graph = make_graph(self.device, self._pool, self.capture_stream)
            hidden = graph.capture(lambda: self.fast.prefill(x, pos, side, last), warmup=0)
            self.prefill_graphs[(b, t)] = (graph, x, pos, last, hidden)
            log.info("captured prefill graph rows=%d length=%d", b, t)
        return self.prefill_graphs[(b, t)]

    def warm_prefill(self) -> None:
        """Run the prefill once per kind of shape it meets (one row or many, one token or many) on scratch
        side-cache rows, so its compiled regions exist before the first request (they are not captured:
        prompt lengths vary)."""
        pb, chunk = self.cfg.prefill_batch, self.cfg.prefill_chunk
        for b, t in {(1, 1), (min(2, pb), 1), (1, 5), (1, 9), (min(2, pb), 7), (min(3, pb), 11), (pb, chunk)}:
            x = torch.zeros(b, t, self.talker.cfg.hidden_size, device=self.device, dtype=self.table.hidden.dtype)
            pos = torch.arange(t, device=self.device)[None].expand(b, t).contiguous()
            side = self.side.rows(0, b)
            self.fast.prefill(x, pos, side, torch.full((b,), t - 1, dtype=torch.long, device=self.device))

    # ----- decode ------------------------------------------------------------------------------------
    def bucket(self, seqs: list, n: int) -> tuple[int, int]:
        """(batch bucket, cache-length bucket) of a step over slots [0, n), from host-side lengths."""
        need = max(seq.pos for seq in seqs[:n]) + 2
        if self.exact:  # nothing captured or compiled: the exact rows and cache length (padding is work on a CPU)
            return n, min(need, self.cfg.max_context)
        return pick_bucket(n, self.buckets), length_bucket(need, self.cfg.length_step, self.cfg.max_context)

    def k_cap(self, seqs: list, b: int) -> int:
        """The top-k cap a step over `seqs` in batch bucket b sorts with: cfg.topk_cap when b >= topk_min_batch
        and every sampling row keeps at most that many ids (true for the official defaults, top-k 50), else 0
        (the whole vocabulary is sorted)."""
        cap = self.default_cap(b)
        for seq in seqs if cap else ():
            s = seq.settings
            if (s.do_sample and not 0 < s.top_k <= cap) or (s.subtalker_dosample and not 0 < s.subtalker_top_k <= cap):
                return 0
        return cap

    def default_cap(self, b: int) -> int:
        """The top-k cap of batch bucket b for the official defaults (top-k 50): 0 with the sampling kernel
        (it sorts nothing) and, on a GPU, below cfg.topk_min_batch (the whole sort is faster there), else
        cfg.topk_cap. On the CPU the capped draw is faster at every batch (1 row: 0.26 against 0.39 ms a draw,
        37 rows: 1.3 against 6.8 ms; docs/PERFORMANCE.md)."""
        small = b < self.cfg.topk_min_batch and self.device.type != "cpu"
        return 0 if self.fast.sample_kernel or small else self.cfg.topk_cap

    def will_capture(self, seqs: list, n: int) -> bool:
        """Whether a step over slots [0, n) needs a graph not captured yet (the caller drains first)."""
        b, length = self.bucket(seqs, n)
        return self.use_graphs and (b, length, self.k_cap(seqs, b)) not in self.graphs

    def launch(self, seqs: list, n: int) -> Step:
        """Replay the step for slots [0, n) (`seqs`: the sequences in them) and queue the copy of its flags
        to a host buffer."""
        t0 = time.perf_counter()
        b, length = self.bucket(seqs, n)
        self.run_step(b, length, self.k_cap(seqs, b))
        self.steps += 1
        for seq in seqs:
            seq.pos += 1
        t, buf = self.table, self._host[self.steps % 2]
        for i, name in enumerate(FLAGS):
            buf[i, :n].copy_(getattr(t, name)[:n], non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        self.timings["decode_launch"] += time.perf_counter() - t0
        return Step(list(seqs), n, buf, event)

    def wait(self, step: Step) -> list:
        """The step's flags once it has finished: [emit, done, eos, bad, hold], each a list over its rows."""
        t0 = time.perf_counter()
        if step.event is not None:
            step.event.synchronize()
        self.timings["step_wait"] += time.perf_counter() - t0
        return step.buf[:, :step.n].tolist()

    def run_step(self, b: int, length: int, k_cap: int = 0) -> None:
        """One decode step over slots [0, b) attending over `length` cache positions (captured on first use)."""
        cache = self.cache.rows(0, b, length)
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
        graph = make_graph(self.device, self._pool, self.capture_stream)
        graph.capture(lambda: (self.fast(*args), self.table.codes)[1], warmup=0)
        self.graphs[(b, length, args[-1])] = graph
        log.info("captured decode graph batch=%d length=%d top-k cap=%d", b, length, args[-1])

    # ----- slots -------------------------------------------------------------------------------------
    def retire(self, slot: int, move: Optional[tuple], pos: int = 0) -> None:
        """Free `slot`; `move` (src, dst): the sequence in slot src (`pos` tokens in its cache) moves to dst."""
        trash = self.store.trash
        self.table.free(slot, trash)  # free slots keep stepping inside the bucket: finite, writing to scratch
        if move is None:
            if self.lazy:  # its memory goes back
                self.cache.clear(slot)
            return
        src, dst = move
        self.cache.copy_row(dst, self.cache, src, min(pos, self.cfg.max_context), clear_rest=self.lazy)
        self.table.move(src, dst)
        self.table.free(src, trash)
        if self.lazy:
            self.cache.clear(src)

    def free_all(self) -> None:
        for slot in range(self.cfg.max_slots):
            self.table.free(slot, self.store.trash)

    def drain(self) -> None:
        """Let the device finish what is queued (before a graph capture nothing may be pending)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ----- start-up ------------------------------------------------------------------------------------
    @torch.no_grad()
    def prepare(self) -> dict:
        """Capture every decode and prefill graph the loop can replay (call while idle). Returns the seconds
        spent and the counts."""
        t0 = time.perf_counter()
        self.warm_prefill()
        for b in self.prefill_rows if self.use_graphs and self.cfg.prefill_graphs else ():
            for t in self.prefill_lengths:
                self._prefill_graph(b, t)
        step, cap = self.cfg.length_step, self.cfg.max_context
        lengths = sorted({length_bucket(x, step, cap) for x in range(step, cap + step, step)})
        for b in self.buckets:
            for length in lengths:
                k_cap = self.default_cap(b)  # the official defaults' variant
                if (b, length, k_cap) not in self.graphs:
                    self.run_step(b, length, k_cap)  # warm-up, compilation and capture on free rows (scratch only)
        self.drain()
        return {"decode_graphs": len(self.graphs), "prefill_graphs": len(self.prefill_graphs),
                "decode_capture_s": time.perf_counter() - t0}
