"""Reference (eager) generation loop: prompts -> frames of 16 codes.

The slow, obvious path every fast path is checked against. Batched: each row has its own prompt
length, positions, sampling settings and seed; rows prefill one at a time into a shared static cache
and then step together.

Frame semantics follow the official package: with max_new_tokens = N, at most N-1 frames come out
(the N-th codebook-0 token never gets its residual codes), and a frame whose codebook 0 is EOS ends
the row without being emitted.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engines.model.prompt import Prompt
from engines.model.sampling import SamplingParams, SamplingTensors, apply_repetition_penalty, draw, draw_topk
from engines.model.talker import Talker


@dataclass
class Generated:
    codes: torch.Tensor  # [F, 16] int64 (cpu)
    finished_by_eos: bool


def control_mask(talker: Talker, device) -> torch.Tensor:
    """`[V]` bool: control ids suppressed while sampling (the top 1024 ids except EOS)."""
    v = talker.cfg.vocab_size
    mask = torch.zeros(v, dtype=torch.bool, device=device)
    mask[v - 1024:] = True
    mask[talker.cfg.codec_eos_token_id] = False
    return mask


def code0_scores(logits, seen, penalty, suppress, eos_id: int, gen_step, min_new) -> torch.Tensor:
    """The codebook-0 logits as they are drawn from `[B, V]` float32: repetition penalty, suppressed control
    ids, EOS masked while gen_step < min_new (per row). Shared by the reference loop and the device step."""
    x = apply_repetition_penalty(logits.float(), seen, penalty).masked_fill(suppress, float("-inf"))
    x[:, eos_id] = torch.where(gen_step < min_new, torch.full_like(x[:, eos_id], float("-inf")), x[:, eos_id])
    return x


def sample_code0(logits, seen, penalty, suppress, eos_id: int, gen_step, min_new, st: SamplingTensors, seed,
                 counter, k_cap: int = 0) -> torch.Tensor:
    """Codebook 0 of the next frame `[B]`: `code0_scores`, then the draw (`draw_topk` over the k_cap best when
    k_cap is set)."""
    x = code0_scores(logits, seen, penalty, suppress, eos_id, gen_step, min_new)
    return draw_topk(x, st, seed, counter, k_cap) if k_cap else draw(x, st, seed, counter)


def predict_residuals(talker: Talker, hidden, code0, sub: SamplingTensors, seed, counter) -> torch.Tensor:
    """Run the code predictor for one frame: hidden `[B, H]`, code0 `[B]` -> codes `[B, 16]`."""
    cp = talker.code_predictor
    cache = cp.new_cache(hidden.shape[0], hidden.device, hidden.dtype)
    codes = [code0]
    logits = cp.prefill(hidden, talker.codec_embed(code0), cache)
    for j in range(cp.num_steps):
        code = draw(logits, sub, seed, counter + 1 + j)
        codes.append(code)
        if j + 1 < cp.num_steps:
            logits = cp.step(j + 1, cp.embed(j, code), cache)
    return torch.stack(codes, dim=1)


@torch.no_grad()
def generate(talker: Talker, prompts: list[Prompt], rows: list[SamplingParams], fp8: bool = False) -> list[Generated]:
    """Generate codes for a batch of prompts with per-row settings (resolved: every field set); `fp8`: the
    talker's key/value cache as float8 with scales (engines.model.kv_cache), as the runtime's fp8 cache."""
    dev = talker.codec_head.weight.device
    b = len(prompts)
    cfg = talker.cfg
    lens = torch.tensor([p.prefill.shape[0] for p in prompts], device=dev)
    max_new = max(r.max_new_tokens for r in rows)
    cache = talker.new_cache(b, int(lens.max()) + max_new + 1, dev, prompts[0].prefill.dtype, fp8)

    hidden = torch.empty(b, cfg.hidden_size, device=dev, dtype=prompts[0].prefill.dtype)
    logits = torch.empty(b, cfg.vocab_size, device=dev, dtype=prompts[0].prefill.dtype)
    for i, p in enumerate(prompts):  # prefill one row at a time into its slice of the cache
        view = cache.rows(i, i + 1)
        pos = torch.arange(p.prefill.shape[0], device=dev)[None]
        hidden[i:i + 1], logits[i:i + 1] = talker(p.prefill[None], pos, view)

    main = SamplingTensors.build([(r.do_sample, r.temperature, r.top_k, r.top_p) for r in rows], dev)
    sub = SamplingTensors.build([(r.subtalker_dosample, r.subtalker_temperature, r.subtalker_top_k, r.subtalker_top_p) for r in rows], dev)
    seed = torch.tensor([r.seed & 0xFFFFFFFF for r in rows], device=dev)
    penalty = torch.tensor([r.repetition_penalty for r in rows], device=dev)
    min_new = torch.tensor([r.min_new_tokens for r in rows], device=dev)
    limit = torch.tensor([r.max_new_tokens for r in rows], device=dev)
    suppress = control_mask(talker, dev)
    eos = cfg.codec_eos_token_id
    seen = torch.zeros(b, cfg.vocab_size, dtype=torch.bool, device=dev)
    frames: list[list[torch.Tensor]] = [[] for _ in range(b)]
    done = torch.zeros(b, dtype=torch.bool, device=dev)
    by_eos = torch.zeros(b, dtype=torch.bool, device=dev)

    for step in range(max_new):
        counter = torch.full((b,), step * 16, device=dev, dtype=torch.long)
        code0 = sample_code0(logits, seen, penalty, suppress, eos, counter // 16, min_new, main, seed, counter)
        hit_eos = (code0 == eos) & ~done
        by_eos |= hit_eos
        done |= hit_eos | (step + 1 >= limit)  # the N-th token gets no residual codes
        if bool(done.all()):
            break
        codes = predict_residuals(talker, hidden, code0, sub, seed, counter)  # [B, 16]
        seen[torch.arange(b, device=dev), code0] = True
        for i in torch.nonzero(~done).flatten().tolist():
            frames[i].append(codes[i])
        g = step  # index of the text row fed with this frame
        text_rows = torch.stack([p.trailing[g] if g < p.trailing.shape[0] else p.pad for p in prompts])
        x_in = (talker.frame_embed(codes) + text_rows)[:, None]  # [B, 1, H]
        pos = (lens + step)[:, None]
        hidden, logits = talker(x_in, pos, cache)

    return [Generated(torch.stack(f).cpu() if f else torch.zeros(0, 16, dtype=torch.long), bool(e))
            for f, e in zip(frames, by_eos.tolist())]
