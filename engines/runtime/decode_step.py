"""The fast decode step: fused projection weights, attention as two matmuls, compiled regions.

The reference layers (engines/model/layers.py) run ~30 small kernels per decoder layer; a frame
passes 28 talker layers and 75 code-predictor layers, so one step was launch-bound. Here:

- Q/K/V and gate/up projections run as one matmul each: the module weights are re-pointed at views
  of one fused tensor (no extra memory; `state_dict` and the reference path see the same values).
- Attention is written for a static cache with per-row positions: scores and the weighted sum are
  two batched matmuls over the cache slice (grouped query heads, no K/V copies), the causal mask is
  built from the positions inside the same region, the RoPE tables are gathered there too.
- Each decoder layer, each sampler and the small glue between them is one `torch.compile` region
  (on CUDA), compiled once per stack and reused by every layer and every predictor step; inside a
  device graph the regions replay as fused kernels with no Python in between.

On CPU the same functions run eagerly; tests check the codes against the reference loop.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch._dynamo
import torch.nn.functional as F

from engines.model.generate import code0_scores
from engines.model.layers import DecoderStack, rope_cos_sin
from engines.model.sampling import SamplingTensors, draw, draw_topk
from engines.model.talker import Talker
from engines.runtime.attention import decode_attention, reference_attention, rms as _rms
from engines.runtime import attention_split
from engines.runtime.attention_split import split_attention
from engines.runtime import linears
from engines.runtime.linears import head_format, linear, pack
from engines.runtime.layer_kernel import decoder_layer, new_counter
from engines.runtime.rowproj import project
from engines.runtime.sampler import device_draw

log = logging.getLogger(__name__)

POLL_LAYERS = 4  # FastStep.poll: once per this many talker layers


def fuse_linears(*mods) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One `[sum(out), in]` weight (and bias) for linears sharing an input; each module's parameters
    become views of it, so the fused and the separate forms can never disagree."""
    w = torch.cat([m.weight.detach() for m in mods])
    has_bias = [m.bias is not None for m in mods]
    b = torch.cat([m.bias.detach() for m in mods]) if all(has_bias) else None
    if any(has_bias) and b is None:
        raise ValueError("cannot fuse linears where only some have a bias")
    off = 0
    for m in mods:
        n = m.weight.shape[0]
        m.weight.data = w[off:off + n]
        if b is not None:
            m.bias.data = b[off:off + n]
        off += n
    return w, b


def _fused(lin_group: tuple, attr: str):
    """The fused weight for a group of linears, built once (cached on the first module)."""
    first = lin_group[0]
    cached = getattr(first, attr, None)
    if cached is None or cached[0].data_ptr() != first.weight.data_ptr():
        cached = fuse_linears(*lin_group)
        setattr(first, attr, cached)
    return cached


@dataclass
class StackWeights:
    """Per-layer weight tuples of one decoder stack, in the order `make_layer` unpacks them."""

    layers: list
    norm: torch.Tensor
    cos: torch.Tensor  # [P, D] float32 RoPE tables
    sin: torch.Tensor

    @staticmethod
    def of(stack: DecoderStack, max_pos: int, fmt: str = "model") -> "StackWeights":
        """`fmt`: the projections' format (engines.runtime.linears: model, or packed on the CPU, eager; `linear`
        multiplies them)."""
        layers = []
        for layer in stack.layers:
            a, m = layer.self_attn, layer.mlp
            wqkv, bqkv = _fused((a.q_proj, a.k_proj, a.v_proj), "_fused_qkv")
            wgu, _ = _fused((m.gate_proj, m.up_proj), "_fused_gate_up")
            layers.append((layer.input_layernorm.weight, pack(wqkv, fmt), bqkv, a.q_norm.weight,
                           a.k_norm.weight, pack(a.o_proj.weight, fmt), a.o_proj.bias,
                           layer.post_attention_layernorm.weight, pack(wgu, fmt), pack(m.down_proj.weight, fmt)))
        dev = stack.norm.weight.device
        cos, sin = rope_cos_sin(torch.arange(max_pos, device=dev)[None], stack.cfg.head_dim, stack.cfg.rope_theta,
                                torch.float32)
        return StackWeights(layers, stack.norm.weight, cos[0], sin[0])


def _gemv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` for a single row written as a reduction (fp32 accumulation): under torch.compile it
    becomes one kernel that also takes in its neighbours' elementwise work (norm scale, SiLU, residual)."""
    y = (x[..., None, :].float() * w.float()).sum(-1)
    return (y if b is None else y + b.float()).to(x.dtype)


def _one_row(x: torch.Tensor) -> bool:
    """Whether a layer call `[B, T, H]` is a single row (one stream's decode step)."""
    return x.shape[0] * x.shape[1] == 1


def _gemv_or_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    return _gemv(x, w, b) if x.shape[0] == 1 else F.linear(x, w, b)


def make_layer(n_heads: int, n_kv: int, head_dim: int, eps: float, gemv: bool = False, kernel: bool = False,
               row_kernel: bool = False, split: bool = False):
    """A decoder layer over a static cache: x `[B, T, H]` at positions `pos` `[B, T]` (also the cache
    slots written) attends to cache slots <= its position (an fp8 cache: its scales ks, vs given). Returns the
    layer's output (residual form).
    `gemv`: one-row calls (B*T == 1) use `_gemv` instead of matmul kernels (device path only).
    `kernel`: decode calls (T <= 2) run their attention as one Triton kernel (engines.runtime.attention).
    `row_kernel`: one-row calls run their projections as Triton kernels with the norms, the SiLU product and
    the residuals fused in (engines.runtime.rowproj).
    `split`: with `kernel`, the attention split over programs per row (engines.runtime.attention_split)."""
    attend = (split_attention if split else decode_attention) if kernel else reference_attention
    if kernel and attention_split.OPAQUE:  # A/B: the kernel as one opaque call inside the compiled regions
        attend = attention_split.opaque(attend)

    def layer(x, w, kc, vc, pos, cos_tab, sin_tab, ks=None, vs=None):
        ln1, wqkv, bqkv, qn, kn, wo, bo, ln2, wgu, wdown = w
        one_row = _one_row(x)
        if row_kernel and one_row:
            qkv = project(x, wqkv, bqkv, norm=(ln1, eps))
        else:
            qkv = (_gemv if gemv and one_row else linear)(_rms(x, ln1, eps), wqkv, bqkv)
        # decode calls (one or two new tokens per row) may take the kernel; prompt chunks the torch form
        o = (attend if x.shape[1] <= 2 else reference_attention)(qkv, qn, kn, cos_tab, sin_tab, pos, kc, vc,
                                                                 n_heads, n_kv, eps, ks, vs)
        return _post(x, o, wo, bo, ln2, wgu, wdown)

    def _post(x, o, wo, bo, ln2, wgu, wdown):
        """Output projection, residual, MLP, residual."""
        one_row = _one_row(x)
        if row_kernel and one_row:
            x = project(o, wo, bo, residual=x)
            return project(project(x, wgu, norm=(ln2, eps), glu=True), wdown, residual=x)
        one = gemv and one_row
        lin = _gemv if one else linear
        x = x + lin(o, wo, bo)
        h = _rms(x, ln2, eps)
        if one:  # gate and up as two reductions over the same rows: one kernel with the SiLU product
            half = wgu.shape[0] // 2
            act = F.silu(_gemv(h, wgu[:half])) * _gemv(h, wgu[half:])
        else:
            gate, up = linear(h, wgu).chunk(2, dim=-1)
            act = F.silu(gate) * up
        return x + lin(act, wdown)

    return layer


def _attention_fits(stack: DecoderStack) -> bool:
    """Whether the stack's heads suit the attention kernel (a power-of-two head width and query group)."""
    c = stack.cfg
    return c.num_attention_heads % c.num_key_value_heads == 0 and _pow2(c.head_dim) \
        and _pow2(c.num_attention_heads // c.num_key_value_heads)


def _stack_layer(stack: DecoderStack, gemv: bool, kernel: bool, row_kernel: bool, split: bool = False):
    c = stack.cfg
    return make_layer(c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps, gemv,
                      kernel and _attention_fits(stack), row_kernel, split)


LAYER_KERNEL_MAX_HIDDEN = 1024  # wider stacks keep the compiled layer (the 1.7B talker: 94.7 vs 67.3 us a layer, H100)


def _one_row_kernel(stack: DecoderStack, other, counter):
    """The stack's layer: one-row calls as one persistent kernel each (engines.runtime.layer_kernel), the
    rest through `other` (the compiled layer). Stacks up to LAYER_KERNEL_MAX_HIDDEN wide (both predictors, the
    0.6B talker): where it measured faster (docs/PERFORMANCE.md)."""
    if counter is None or not _attention_fits(stack) or stack.cfg.hidden_size > LAYER_KERNEL_MAX_HIDDEN:
        return other
    c = stack.cfg

    def layer(x, w, kc, vc, pos, cos_tab, sin_tab, ks=None, vs=None):
        if _one_row(x):
            return decoder_layer(x, w, kc, vc, pos, cos_tab, sin_tab, c.num_attention_heads, c.num_key_value_heads,
                                 c.rms_norm_eps, counter, ks=ks, vs=vs)
        return other(x, w, kc, vc, pos, cos_tab, sin_tab, ks, vs)
    return layer


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class FastStep:
    """The whole decode step (see engines.runtime.slots.decode_step for its semantics) over fused regions."""

    def __init__(self, talker: Talker, n_slots: int, compile: bool, gemv: bool = True, fuse: str = "layer",
                 kernel: bool = False, sample_kernel: bool = False, row_kernel: bool = False,
                 layer_kernel: bool = False, linear: str = "model", attn_split: bool = False):
        """`linear`: the decoder layers' projections' format (engines.runtime.linears; packed ones: CPU, eager).
        `attn_split`: the talker's decode attention split over programs per row (the predictor's 17 positions
        keep the one-program kernel's small launch)."""
        if linear != "model" and (compile or kernel or row_kernel or layer_kernel):
            raise ValueError(f"{linear} linears run eagerly on the CPU: not with compiled regions or Triton kernels")
        self.talker = talker
        self.sample_kernel = sample_kernel  # draws by engines.runtime.sampler (one launch, no sort)
        cp = talker.code_predictor
        dev, dtype = talker.codec_head.weight.device, talker.codec_head.weight.dtype
        self.linear = linear
        self.tw = StackWeights.of(talker.model, talker.cfg.max_position_embeddings, linear)
        self.pw = StackWeights.of(cp.model, cp.cfg.num_code_groups + 1, linear)
        self.eps_t, self.eps_p = talker.cfg.rms_norm_eps, cp.cfg.rms_norm_eps
        self.n_sub = cp.num_steps
        self.codebook = cp.cfg.vocab_size  # codes of codebooks 1..15 (and valid codebook-0 codes) are below this
        self.pcache = cp.new_cache(n_slots, dev, dtype)
        # predictor positions: [0, 1] for the first call of a frame, then j+1; one allocation each (aligned inputs)
        self.ppos = [torch.tensor([[0, 1]], device=dev).expand(n_slots, 2).contiguous()]
        self.ppos += [torch.full((n_slots, 1), j + 1, device=dev, dtype=torch.long) for j in range(1, self.n_sub)]
        proj = cp.small_to_mtp_projection
        self.proj = (proj.weight, proj.bias) if isinstance(proj, torch.nn.Linear) else None
        self.sub_tables = [e.weight for e in cp.model.codec_embedding]
        hf = head_format(linear)  # the heads' format: fp16 with fp16 layers (a packed weight: `linear` multiplies)
        self.lm = [pack(h.weight, hf) for h in cp.lm_head]
        self.head0 = pack(talker.codec_head.weight, hf)
        wrap = (lambda f: torch.compile(f, dynamic=None, fullgraph=True)) if compile else (lambda f: f)
        if compile:
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        gemv = gemv and compile
        self.lin = _gemv_or_linear if gemv else F.linear if hf == "model" else linears.linear
        self.fuse = fuse
        self._t_layer = _stack_layer(talker.model, gemv, kernel, row_kernel, attn_split)
        self._p_layer = _stack_layer(cp.model, gemv, kernel, row_kernel)
        # layer_kernel: a one-row layer call (one stream's step) is one persistent kernel, not compiled
        counter = new_counter(dev) if layer_kernel else None
        self.t_layer = _one_row_kernel(talker.model, wrap(self._t_layer), counter)
        self.p_layer = _one_row_kernel(cp.model, wrap(self._p_layer), counter)
        # fuse="pass": one region per predictor step (5 layers + sampling + next embedding) and one for
        # the talker's step (next input + 28 layers + norm): fusion across layer boundaries, fewer kernels
        self.r_pred = wrap(self._pred_step)
        self.r_tail = wrap(self._tail)
        self.r_code0 = wrap(self._code0)
        self.r_first = wrap(self._first_input)
        self.r_sub = wrap(self._sub_code)
        self.r_embed = wrap(self._sub_embed)
        self.r_next = wrap(self._next_input)
        self.r_final = wrap(self._final)
        self.r_norm = wrap(_rms)
        # called between the talker's layers (every POLL_LAYERS) and before each predictor pass, in the thread
        # that runs the step: the CPU runner re-picks its torch threads there (a codec call may end mid-step)
        self.poll: Optional[Callable[[], None]] = None

    # ----- regions (pure tensor functions; compiled on the device path) ------------------------------------
    def _code0(self, hidden, head_w, seen, penalty, suppress, gen_step, min_new, do, temp, topk, topp, seed,
               done, eos, limit, text_open, trailing_len, hold, k_cap: int = 0):
        eos_id = self.talker.cfg.codec_eos_token_id
        scores = code0_scores(self.lin(hidden, head_w), seen, penalty, suppress, eos_id, gen_step, min_new)
        code0 = self._draw(scores, SamplingTensors(do, temp, topk, topp), seed, gen_step, 0, k_cap)
        # a row whose next input needs a text row that has not arrived waits: this step changes nothing of it
        hold.copy_(text_open & (gen_step >= trailing_len) & ~done)
        hit = (code0 == eos_id) & ~done & ~hold
        eos.logical_or_(hit)
        done.logical_or_(hit | ((gen_step + 1 >= limit) & ~hold))
        seen.scatter_(1, code0[:, None], seen.gather(1, code0[:, None]) | ~hold[:, None])
        return code0

    def _first_input(self, hidden, code0, table, proj):
        x = torch.stack([hidden, F.embedding(code0, table)], dim=1)  # [B, 2, H_talker]
        return x if proj is None else F.linear(x, *proj)

    def _sub_code(self, x, norm_w, lm_w, do, temp, topk, topp, seed, gen_step, j: int, k_cap: int = 0):
        logits = self.lin(_rms(x[:, -1], norm_w, self.eps_p), lm_w)
        return self._draw(logits, SamplingTensors(do, temp, topk, topp), seed, gen_step, 1 + j, k_cap)

    def _draw(self, logits, st, seed, gen_step, offset: int, k_cap: int):
        """Draw j = `offset` of the frame (counter gen_step * 16 + offset): the kernel, or the torch form."""
        if self.sample_kernel:
            return device_draw(logits, st, seed, gen_step, offset)
        counter = gen_step * 16 + offset
        return draw_topk(logits, st, seed, counter, k_cap) if k_cap else draw(logits, st, seed, counter)

    def _pred_step(self, x, layers, pk, pv, pos, cos, sin, norm_w, lm_w, do, temp, topk, topp, seed, gen_step,
                   j: int, table, proj, k_cap: int):
        """One code-predictor step as one region: its layers, the code, the next step's input."""
        for i in range(len(layers)):
            x = self._p_layer(x, layers[i], pk[i], pv[i], pos, cos, sin)
        code = self._sub_code(x, norm_w, lm_w, do, temp, topk, topp, seed, gen_step, j, k_cap)
        return code, self._sub_embed(code, table, proj)

    def _tail(self, codes, out_codes, emit, done, hold, tables, trailing, trailing_len, gen_step, pad, pos,
              max_len: int, frames, frame_row, n_frames, bad, codebook: int, layers, kc, vc, ks, vs, cos, sin, norm_w,
              hidden):
        """The frame's next input, the talker's layers over it and the new state, as one region (ks, vs: the
        scales of an fp8 cache, per layer, or None)."""
        x, p = self._next_input(codes, out_codes, emit, done, hold, tables, trailing, trailing_len, gen_step, pad,
                                pos, max_len, frames, frame_row, n_frames, bad, codebook)
        for i in range(len(layers)):
            scales = (ks[i], vs[i]) if ks is not None else (None, None)
            x = self._t_layer(x, layers[i], kc[i], vc[i], p, cos, sin, *scales)
        self._final(x, norm_w, hidden, pos, gen_step, hold)

    def _sub_embed(self, code, table, proj):
        x = F.embedding(code, table)[:, None]
        return x if proj is None else F.linear(x, *proj)

    def _next_input(self, codes, out_codes, emit, done, hold, tables, trailing, trailing_len, gen_step, pad, pos,
                    max_len: int, frames, frame_row, n_frames, bad, codebook: int):
        codes = torch.stack(codes, dim=1)  # [B, 16]
        out_codes.copy_(codes)
        emit.copy_(~done & ~hold)  # a held row's frame is written past its end and made again later
        bad.copy_(emit & ((codes < 0) | (codes >= codebook)).any(1))
        frames[frame_row, n_frames.clamp(max=frames.shape[1] - 1)] = codes.to(frames.dtype)  # free rows: scratch
        n_frames.add_(emit.long())
        emb = torch.stack([F.embedding(codes[:, i], tab) for i, tab in enumerate(tables)], dim=1).sum(1)
        rows = torch.arange(codes.shape[0], device=codes.device)
        text = trailing[rows, gen_step.clamp(max=trailing.shape[1] - 1)]  # [B, H]
        text = torch.where((gen_step < trailing_len)[:, None], text, pad[None])
        return (emb + text)[:, None], pos.clamp(max=max_len - 1)[:, None]  # done rows may pass their bucket

    def _final(self, x, norm_w, hidden, pos, gen_step, hold):
        # a held row keeps its state; the cache entry it wrote at `pos` is written again when it moves on
        hidden.copy_(torch.where(hold[:, None], hidden, _rms(x[:, -1], norm_w, self.eps_t)))
        pos.add_((~hold).long())
        gen_step.add_((~hold).long())

    # ----- entry points ----------------------------------------------------------------------------------------
    def talker_pass(self, x, pos, cache):
        """Run the talker layers on x `[B, T, H]` at `pos` `[B, T]` -> un-normed output `[B, T, H]`."""
        w, poll = self.tw, self.poll
        for i, lw in enumerate(w.layers):
            if poll is not None and i % POLL_LAYERS == 0:
                poll()
            kc, vc, ks, vs = cache.layer(i)
            x = self.t_layer(x, lw, kc, vc, pos, w.cos, w.sin, ks, vs)
        return x

    def prefill(self, x, pos, cache, last):
        """Prompt rows `[B, T, H]` -> normed hidden at index `last` `[B]` of each row `[B, H]` (fills the cache)."""
        out = self.talker_pass(x, pos, cache)
        return self.r_norm(out[torch.arange(out.shape[0], device=out.device), last], self.tw.norm, self.eps_t)

    def __call__(self, t, cache, pad, suppress, frames, k_cap: int = 0) -> None:
        """One frame for every row of the slot table view `t` over the talker cache view `cache`; each
        emitted frame is also written to its row of `frames` (FrameStore.codes). In place. `k_cap` > 0:
        every row's top-k is at most k_cap, so only that many ids are sorted per draw (draw_topk)."""
        b = t.hidden.shape[0]
        talker = self.talker
        code0 = self.r_code0(t.hidden, self.head0, t.seen, t.penalty, suppress, t.gen_step, t.min_new,
                             t.m_do, t.m_temp, t.m_topk, t.m_topp, t.seed, t.done, t.eos, t.limit, t.text_open,
                            t.trailing_len, t.hold, k_cap)
        x = self.r_first(t.hidden, code0, talker.model.codec_embedding.weight, self.proj)
        pk, pv, pw = [k[:b] for k in self.pcache.k], [v[:b] for v in self.pcache.v], self.pw
        codes = [code0]
        tables = [talker.model.codec_embedding.weight] + self.sub_tables
        for j in range(self.n_sub):
            if self.poll is not None:
                self.poll()
            pos = self.ppos[j][:b]
            if self.fuse == "pass":
                code, x = self.r_pred(x, pw.layers, pk, pv, pos, pw.cos, pw.sin, pw.norm, self.lm[j], t.s_do,
                                      t.s_temp, t.s_topk, t.s_topp, t.seed, t.gen_step, j,
                                      self.sub_tables[min(j, self.n_sub - 2)], self.proj, k_cap)
                codes.append(code)
                continue
            for i, lw in enumerate(pw.layers):
                x = self.p_layer(x, lw, pk[i], pv[i], pos, pw.cos, pw.sin)
            code = self.r_sub(x, pw.norm, self.lm[j], t.s_do, t.s_temp, t.s_topk, t.s_topp, t.seed, t.gen_step, j,
                              k_cap)
            codes.append(code)
            if j + 1 < self.n_sub:
                x = self.r_embed(code, self.sub_tables[j], self.proj)
        common = (codes, t.codes, t.emit, t.done, t.hold, tables, t.trailing, t.trailing_len, t.gen_step, pad, t.pos,
                  cache.max_len, frames, t.frame_row, t.n_frames, t.bad, self.codebook)
        if self.fuse == "pass":
            w = self.tw
            self.r_tail(*common, w.layers, cache.k, cache.v, cache.k_scale, cache.v_scale, w.cos, w.sin, w.norm,
                        t.hidden)
            return
        x_in, pos = self.r_next(*common)
        x = self.talker_pass(x_in, pos, cache)
        self.r_final(x, self.tw.norm, t.hidden, t.pos, t.gen_step, t.hold)
