"""Why the talker's attention launch takes longer inside the decode step than alone: the launch timed on the
engine's own cache tensors, one difference at a time (benchmarks.ab_step --probe runs it on each variant's runner).

The last profile (docs/PERFORMANCE.md, "the book step by part") timed the launch at ~258 us inside a 256-row step
at 450 positions and 176-181 us alone (benchmarks.attention_tune: a fresh contiguous cache, one layer, random
values). Here, on a runner whose rows sit at a book's positions (ab_step.advance), for the attention function
the runner's step uses and the other kernel too:

    alone_layer0     20 calls on layer 0 of the engine's cache (its row stride: max_context positions)
    alone_layers     the 28 layers in turn, as the step reads them (28 x the cache span, one graph)
    compiled_layers  the same through a torch.compile'd function (inductor compiles the user-defined Triton
                     kernel, as in the step's compiled regions)
    opaque_layers    the same compiled function calling the kernel as one torch custom op
                     (engines.runtime.attention_split.opaque: Triton launches it, as outside a region)
    codec_beside     alone_layers while a codec (the runner's kind, rows of its own) decodes a batch-lane call
                     (4 frames x the rows at 256) on a stream of the batch lane's priority, the launches on
                     the loop's stream
    step_eager       the launch's kernel time inside one eager step (the torch profiler, as profile_step)
    step_replay      the same inside one replay of the step's captured graph
    step_ms / step_ms_codec_beside: the captured step's replay, alone and beside the codec call

New keys and values are written at each row's position, as the step writes them.
"""
from __future__ import annotations

import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.graph_timing import per_call_us
from engines.runtime.attention import decode_attention
from engines.runtime.attention_split import opaque, split_attention


def _inputs(runner, b: int):
    """(attention args per layer, the step's bucket length): the engine's own cache views and tables."""
    m = runner.model
    fast, seqs = m.fast, runner.slots.seqs
    _, length = m.bucket(seqs, b)
    cache = m.cache.rows(0, b, length)
    c = runner.engine.talker.cfg
    g = torch.Generator(device=runner.device).manual_seed(0)
    qkv = torch.randn(b, 1, (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim, device=runner.device,
                      generator=g).to(m.table.hidden.dtype)
    pos = m.table.pos[:b].clamp(max=length - 1)[:, None]
    layers = []
    for i, lw in enumerate(fast.tw.layers):
        kc, vc, ks, vs = cache.layer(i)
        layers.append((qkv, lw[3], lw[4], fast.tw.cos, fast.tw.sin, pos, kc, vc, ks, vs))
    return layers, (c.num_attention_heads, c.num_key_value_heads, c.rms_norm_eps), length


def _graph_us(calls, reps: int = 7) -> float:
    """Microseconds per call of the callables `calls` captured in one graph, median of `reps` replays."""
    return per_call_us(lambda i: calls[i](), len(calls), reps, copies=len(calls)) if len(calls) > 1 else \
        per_call_us(lambda i: calls[0](), 20, reps)


class CodecBeside:
    """A codec of the runner's kind for b rows of its own (the lanes keep theirs), decoding `frames` frames a call
    on a stream of the batch lane's priority: `time(fn)` is fn()'s GPU time (ms, median) while such a call runs."""

    def __init__(self, runner, b: int, frames: int):
        from engines.codec.build import runtime_codec

        self.codec = runtime_codec(runner.engine, b, "torch", fast=runner.cfg.codec_fast)
        dev = runner.device
        self.codes = torch.randint(0, 2048, (b, 16, frames), device=dev)
        self.valid = torch.full((b,), frames, device=dev, dtype=torch.long)
        self.stream = torch.cuda.Stream(dev, priority=0)
        self.run_stream = runner.model.run_stream
        self.call()  # warm-up
        self.stream.synchronize()
        self.codec_ms = statistics.median(self._alone() for _ in range(3))

    def call(self) -> None:
        with torch.cuda.stream(self.stream):
            self.codec.push(self.codes, self.valid)

    def _alone(self) -> float:
        a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(self.stream)
        self.call()
        z.record(self.stream)
        z.synchronize()
        return a.elapsed_time(z)

    def time(self, fn, reps: int = 5) -> float:
        times = []
        for _ in range(reps):
            self.call()  # queued first (its kernels outlast their launches), then fn on the loop's stream
            with torch.cuda.stream(self.run_stream):
                times.append(_event_ms(fn))
            self.stream.synchronize()
        return statistics.median(times)


def _kernels(prof) -> list:
    """(name, us) of every GPU kernel a profile saw (each launch, graph replays included)."""
    out = []
    for e in prof.events():
        if e.device_type.name == "CUDA":
            out.append((e.name, e.time_range.elapsed_us()))
    return out


def _talker_attention_us(run, split: bool, launches: int) -> float:
    """The talker's attention per launch inside one profiled run(): the split kernel's launches (and their
    combines) over `launches`, or the one-program kernel's `launches` longest (the code predictor's launches of
    the same kernel read 17 positions: ten times shorter)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    ks = _kernels(prof)
    if split:
        return sum(us for name, us in ks if "_split_attention" in name) / launches
    one = sorted((us for name, us in ks if "_decode_attention_kernel" in name), reverse=True)[:launches]
    return sum(one) / max(1, len(one))


def _attempt(out: dict, key: str, fn) -> None:
    """out[key] = fn(), or the error it raised (one failing measurement keeps the others)."""
    try:
        out[key] = fn()
    except Exception as e:  # noqa: BLE001
        out[key] = float("nan")
        out.setdefault("errors", []).append(f"{key}: {type(e).__name__}: {str(e)[:300]}")


@torch.no_grad()
def probe(runner, b: int) -> dict:
    """The measurements of the module doc for the rows [0, b) of `runner` (filled, at their positions)."""
    from engines.runtime.attention_split import multiprocessors

    multiprocessors(runner.device.index or 0)  # asked outside the compiled function
    layers, (h, kv, eps), length = _inputs(runner, b)
    out = {"rows": b, "length_bucket": length, "kernel_in_step": "split" if runner.model.split else "one"}
    frames = min(4, max(1, runner.cfg.batch_call_frames // b))  # what one batch-lane call decodes at b rows
    beside = CodecBeside(runner, b, frames)
    out["codec_call_ms"], out["codec_frames"] = beside.codec_ms, frames
    for name, fn in (("one", decode_attention), ("split", split_attention)):
        calls = [lambda a=a, fn=fn: fn(*a[:8], h, kv, eps, *a[8:]) for a in layers]
        res: dict = {}
        _attempt(res, "alone_layer0", lambda: _graph_us(calls[:1]))
        _attempt(res, "alone_layers", lambda: _graph_us(calls))
        compiled = torch.compile(lambda *a, fn=fn: fn(*a[:8], h, kv, eps, *a[8:]), fullgraph=True, dynamic=False)
        _attempt(res, "compiled_layers", lambda: _graph_us([lambda a=a: compiled(*a) for a in layers]))
        op = opaque(fn)
        through_op = torch.compile(lambda *a, op=op: op(*a[:8], h, kv, eps, *a[8:]), fullgraph=True, dynamic=False)
        _attempt(res, "opaque_layers", lambda: _graph_us([lambda a=a: through_op(*a) for a in layers]))

        def beside_codec():
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for c in calls:
                    c()
            return beside.time(g.replay) * 1e3 / len(calls)
        _attempt(res, "codec_beside", beside_codec)
        out[name] = res
    m = runner.model
    k_cap = m.k_cap(runner.slots.seqs, b)
    graphs = m.use_graphs
    step = lambda: m.run_step(b, length, k_cap)  # noqa: E731
    try:
        m.use_graphs = False
        _attempt(out, "step_eager", lambda: _talker_attention_us(step, m.split, len(layers)))
        m.use_graphs = True
        step()  # captured if new
        _attempt(out, "step_replay", lambda: _talker_attention_us(step, m.split, len(layers)))
        _attempt(out, "step_ms", lambda: statistics.median(_event_ms(step) for _ in range(7)))
        _attempt(out, "step_ms_codec_beside", lambda: beside.time(step))
    finally:
        m.use_graphs = graphs
    return out


def _event_ms(fn) -> float:
    """fn()'s GPU time (ms) on the current stream."""
    a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    z.record()
    z.synchronize()
    return a.elapsed_time(z)


def table(rows: list) -> str:
    """Markdown lines of probe() results (us per launch; step times in ms)."""
    lines = ["| variant | rows | kernel | alone, layer 0 | alone, 28 layers | compiled, 28 layers | compiled, opaque op | "
             "codec beside | in eager step (profiler) | in replay (profiler) | step ms | step ms, codec beside |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for k in ("one", "split"):
            x = r[k]
            mine = k == r["kernel_in_step"]
            lines.append(f"| {r.get('variant', '')} | {r['rows']} | {k}{' (the step)' if mine else ''} | "
                         f"{x['alone_layer0']:.1f} | {x['alone_layers']:.1f} | {x['compiled_layers']:.1f} | "
                         f"{x.get('opaque_layers', float('nan')):.1f} | {x['codec_beside']:.1f} | "
                         + (f"{r['step_eager']:.1f} | {r['step_replay']:.1f} | {r['step_ms']:.2f} | "
                            f"{r['step_ms_codec_beside']:.2f} |" if mine else " | | | |"))
    return "\n".join(lines)
