"""Qwen3-style decoder building blocks shared by the talker and the code predictor.

The attention layers work against a static KV cache `[B, kv_heads, S, D]` with per-row write
positions (engines.model.kv_cache: in the model's dtype or fp8 with scales), so the same code serves the
eager reference path and the batched runtime. RMSNorm and RoPE run in fp32 whatever the weight dtype (as
the reference does).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from engines.model import kv_cache
from engines.model.config import DecoderStackConfig
from engines.model.kv_cache import KVCache


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin tables for integer positions `[B, T]` -> two `[B, T, D]` tensors (computed in fp32)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device)
                                .float() / head_dim))  # [D/2]
    freqs = positions.float()[..., None] * inv_freq  # [B, T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [B, T, D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x `[B, H, T, D]`, cos/sin `[B, T, D]`."""
    cos, sin = cos[:, None], sin[:, None]
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: DecoderStackConfig):
        super().__init__()
        d, h, kv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim, self.n_heads, self.n_kv = d, h, kv
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def project(self, x, cos, sin):
        """x `[B, T, H]` -> q `[B, h, T, D]`, k, v `[B, kv, T, D]` (normed, rotated). Fusable block."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.n_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.n_kv, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)  # [B, kv, T, D]
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x, cos, sin, k_cache, v_cache, write_pos, mask, k_scale=None, v_scale=None):
        """x `[B, T, H]`; write_pos `[B, T]` cache slots for the new keys; mask `[B, 1, T, S]` bool;
        k_scale, v_scale `[B, kv, S]`: the scales of an fp8 cache (None: the cache is in the model's dtype)."""
        b, t, _ = x.shape
        q, k, v = self.project(x, cos, sin)
        rows = torch.arange(b, device=x.device)[:, None].expand(b, t)  # [B, T]
        kv_cache.write(k_cache, k_scale, rows, write_pos, k.transpose(1, 2))  # cache[b, :, pos] <- [B, T, kv, D]
        kv_cache.write(v_cache, v_scale, rows, write_pos, v.transpose(1, 2))
        keys, values = kv_cache.read(k_cache, k_scale, q.dtype), kv_cache.read(v_cache, v_scale, q.dtype)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                             enable_gqa=self.n_heads != self.n_kv)  # [B, h, T, D]
        return out.transpose(1, 2).reshape(b, t, -1)  # o_proj is applied by DecoderLayer.post


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderStackConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def post(self, x, attn):
        """Output projection, residual, MLP, residual. Fusable block."""
        x = x + self.self_attn.o_proj(attn)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward(self, x, cos, sin, k_cache, v_cache, write_pos, mask, k_scale=None, v_scale=None):
        attn = self.self_attn(self.input_layernorm(x), cos, sin, k_cache, v_cache, write_pos, mask, k_scale, v_scale)
        return self.post(x, attn)


def causal_mask(positions: torch.Tensor, valid_len: torch.Tensor, max_len: int) -> torch.Tensor:
    """Mask `[B, 1, T, S]`: query at position p sees cache slots 0..p that hold valid entries.

    positions `[B, T]` absolute positions of the queries (= their cache slots);
    valid_len `[B]` number of valid slots after this step's writes.
    """
    slots = torch.arange(max_len, device=positions.device)  # [S]
    m = (slots[None, None, :] <= positions[:, :, None]) & (slots[None, None, :] < valid_len[:, None, None])
    return m[:, None]


class DecoderStack(nn.Module):
    """Layers + final norm. Weight names follow the official `*.model.layers.N.*` / `*.model.norm`."""

    def __init__(self, cfg: DecoderStackConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self._rope: dict = {}

    def rope(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos/sin `[B, T, D]` for `positions`, gathered from a table computed once per device in fp32
        (the same values `rope_cos_sin` gives; one gather instead of a handful of kernels per step)."""
        key = positions.device
        if key not in self._rope:
            every = torch.arange(self.cfg.max_position_embeddings, device=positions.device)[None]
            self._rope[key] = rope_cos_sin(every, self.cfg.head_dim, self.cfg.rope_theta, torch.float32)
        cos, sin = self._rope[key]
        return cos[0][positions].to(dtype), sin[0][positions].to(dtype)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x `[B, T, H]` at absolute `positions` `[B, T]` (also their cache slots) -> normed `[B, T, H]`."""
        cos, sin = self.rope(positions, x.dtype)
        if mask is None:
            mask = causal_mask(positions, positions[:, -1] + 1, cache.max_len)
        for i, layer in enumerate(self.layers):
            k, v, ks, vs = cache.layer(i)
            x = layer(x, cos, sin, k, v, positions, mask, ks, vs)
        return self.norm(x)
