"""Batched sampling with every per-request setting held as a tensor.

Matches the official (Hugging Face generate) processing order: repetition penalty, suppressed ids,
minimum length (EOS masked), then temperature, top-k, top-p and a draw; greedy rows take the argmax.

Random draws come from a counter-based hash of (seed, frame, codebook, vocabulary index): no
generator state, so the same seed gives the same codes whatever the batch size or the order in
which requests join, on any device, and the whole thing can be captured in a device graph.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Optional

import torch

_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class SamplingParams:
    """How one request is sampled (the official package's names). A field left None takes the
    checkpoint's default: `generation_config.json`, read by `from_generation_config`, falling back to
    the official package's values for keys the file lacks. `over(defaults)` fills the gaps; the
    engine resolves every request that way (plus a seed and the runaway frame limit) before decoding.
    """

    do_sample: Optional[bool] = None
    temperature: Optional[float] = None
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    repetition_penalty: Optional[float] = None  # talker only, as in the official package
    subtalker_dosample: Optional[bool] = None
    subtalker_temperature: Optional[float] = None
    subtalker_top_k: Optional[int] = None
    subtalker_top_p: Optional[float] = None
    seed: Optional[int] = None  # None: a random seed per request
    min_new_tokens: Optional[int] = None
    max_new_tokens: Optional[int] = None  # None: the checkpoint's, capped by the runaway limit for the text

    @staticmethod
    def greedy(**kw) -> "SamplingParams":
        """Argmax for both the talker and the code predictor."""
        return SamplingParams(do_sample=False, subtalker_dosample=False, **kw)

    def over(self, defaults: "SamplingParams") -> "SamplingParams":
        """These settings where given, `defaults` elsewhere."""
        return replace(defaults, **{f.name: getattr(self, f.name) for f in fields(self)
                                    if getattr(self, f.name) is not None})

    @staticmethod
    def from_generation_config(folder: str | Path) -> "SamplingParams":
        """A checkpoint's defaults: its `generation_config.json` over the official package's values."""
        path = Path(folder) / "generation_config.json"
        raw = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        names = {f.name for f in fields(SamplingParams)} - {"seed"}
        given = {k: v for k, v in raw.items() if k in names and v is not None}
        return SamplingParams(**given).over(OFFICIAL_DEFAULTS)

    def to_dict(self) -> dict:
        """The settings that are set (JSON-able), e.g. to write a generation_config.json."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


# the official package's sampling defaults (used where generation_config.json is silent)
OFFICIAL_DEFAULTS = SamplingParams(do_sample=True, temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05,
                                   subtalker_dosample=True, subtalker_temperature=0.9, subtalker_top_k=50,
                                   subtalker_top_p=1.0, min_new_tokens=2, max_new_tokens=8192)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche mix on int64 tensors holding values in [0, 2^32)."""
    x = x & _MASK32
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & _MASK32
    x = ((x ^ (x >> 15)) * 0x6A09E667) & _MASK32
    x = ((x ^ (x >> 16)) * 0x2C1B3C6D) & _MASK32
    return x ^ (x >> 15)


def uniform_at(seed: torch.Tensor, counter: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Deterministic uniforms in (0, 1) for vocabulary ids `idx` (`[n]` or `[B, n]` int64): seed, counter
    `[B]` -> `[B, n]` float32. The value for an id does not depend on which other ids are asked for."""
    key = _mix32(_mix32(seed) ^ _mix32(counter + 0x5BD1E995))  # [B]
    idx = idx if idx.dim() == 2 else idx[None, :]
    bits = _mix32(key[:, None] * 0x9E37 + idx * 0x3C6EF372 + 0x1B873593)  # [B, n]
    # 23 bits + 0.5 is exact in float32, so u stays strictly inside (0, 1): u == 1 would make the
    # exponential race divide 0 by 0 for a zero-probability (suppressed) id and let argmax pick it
    return ((bits >> 9).float() + 0.5) * (1.0 / (1 << 23))


def uniform(seed: torch.Tensor, counter: torch.Tensor, n: int) -> torch.Tensor:
    """Deterministic uniforms in (0, 1) for every id of a vocabulary of n: `[B, n]` float32."""
    return uniform_at(seed, counter, torch.arange(n, device=seed.device, dtype=torch.int64))


@dataclass
class SamplingTensors:
    """Per-row sampling settings `[B]` for one of the two samplers (talker or sub-talker)."""

    do_sample: torch.Tensor  # bool
    temperature: torch.Tensor  # float
    top_k: torch.Tensor  # int64, 0 = off
    top_p: torch.Tensor  # float, 1.0 = off

    @staticmethod
    def build(rows, device) -> "SamplingTensors":
        """rows: iterable of (do_sample, temperature, top_k, top_p)."""
        ds, t, k, p = zip(*rows)
        return SamplingTensors(torch.tensor(ds, dtype=torch.bool, device=device),
                               torch.tensor([max(x, 1e-5) for x in t], dtype=torch.float32, device=device),
                               torch.tensor(k, dtype=torch.int64, device=device),
                               torch.tensor(p, dtype=torch.float32, device=device))


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """seen `[B, V]` bool marks ids generated so far; penalty `[B]` (1.0 = off)."""
    pen = penalty[:, None].to(logits.dtype)
    penalised = torch.where(logits < 0, logits * pen, logits / pen)
    return torch.where(seen, penalised, logits)


def draw(logits: torch.Tensor, st: SamplingTensors, seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """Pick one id per row from processed logits `[B, V]` (float32) -> `[B]` int64."""
    logits = logits.float()
    greedy = logits.argmax(-1)
    v = logits.shape[-1]
    scores = logits / st.temperature[:, None]
    sorted_scores, order = scores.sort(dim=-1, descending=True)  # [B, V]
    k = torch.where(st.top_k > 0, st.top_k.clamp(max=v), torch.full_like(st.top_k, v))
    kth = sorted_scores.gather(1, (k - 1)[:, None])  # [B, 1]
    keep_sorted = sorted_scores >= kth  # top-k (ties kept, as the reference does)
    probs = torch.softmax(sorted_scores.masked_fill(~keep_sorted, float("-inf")), dim=-1)
    cum_before = probs.cumsum(-1) - probs
    keep_sorted &= (cum_before < st.top_p[:, None]) | (torch.arange(v, device=logits.device) == 0)
    probs = torch.softmax(sorted_scores.masked_fill(~keep_sorted, float("-inf")), dim=-1)
    probs = torch.zeros_like(probs).scatter(1, order, probs)  # back to vocabulary order
    # exponential race == multinomial draw: argmax p_i / E_i with E_i ~ Exp(1)
    sampled = (probs / -torch.log(uniform(seed, counter, v))).argmax(-1)
    return torch.where(st.do_sample, sampled, greedy)


def draw_topk(logits: torch.Tensor, st: SamplingTensors, seed: torch.Tensor, counter: torch.Tensor,
              k_cap: int) -> torch.Tensor:
    """`draw` for rows whose top-k is set and at most `k_cap`: only the k_cap best ids are sorted,
    softmaxed and raced, instead of the whole vocabulary. The same draw as `draw` (the race uses each
    id's own uniform, the kept set is the same) except that ties with the k-th score beyond position
    k_cap are dropped. Greedy rows take the best id. `logits` `[B, V]` -> `[B]` int64."""
    scores = logits.float() / st.temperature[:, None]
    vals, ids = scores.topk(k_cap, dim=-1)  # [B, K] best first
    k = st.top_k.clamp(1, k_cap)
    keep = vals >= vals.gather(1, (k - 1)[:, None])  # top-k (ties kept, as the reference does)
    probs = torch.softmax(vals.masked_fill(~keep, float("-inf")), dim=-1)
    cum_before = probs.cumsum(-1) - probs
    keep &= (cum_before < st.top_p[:, None]) | (torch.arange(k_cap, device=logits.device) == 0)
    probs = torch.softmax(vals.masked_fill(~keep, float("-inf")), dim=-1)
    race = probs / -torch.log(uniform_at(seed, counter, ids))  # exponential race over the kept ids
    sampled = ids.gather(1, race.argmax(-1, keepdim=True))[:, 0]
    return torch.where(st.do_sample, sampled, ids[:, 0])
