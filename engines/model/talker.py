"""Talker: the Qwen3 decoder that produces codebook 0 of each frame, plus its embeddings and heads.

Weight names follow the official `talker.*` keys: `talker.model.{layers,norm,codec_embedding,
text_embedding}`, `talker.codec_head`, `talker.text_projection.linear_fc{1,2}`, `talker.code_predictor.*`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engines.model.code_predictor import CodePredictor
from engines.model.config import TalkerConfig
from engines.model.kv_cache import KVCache
from engines.model.layers import DecoderStack


class _TalkerBody(DecoderStack):
    def __init__(self, cfg: TalkerConfig):
        super().__init__(cfg)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)


class TextProjection(nn.Module):
    """Text embedding (text_hidden) -> talker hidden: Linear+bias, SiLU, Linear+bias."""

    def __init__(self, text_hidden: int, hidden: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x):
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class Talker(nn.Module):
    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        self.cfg = cfg
        self.model = _TalkerBody(cfg)
        self.text_projection = TextProjection(cfg.text_hidden_size, cfg.hidden_size)
        self.codec_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg.code_predictor, cfg.hidden_size)

    def new_cache(self, batch: int, max_len: int, device, dtype, fp8: bool = False, lazy: bool = False) -> KVCache:
        """The talker's key/value cache; `fp8`: float8 values with scales; `lazy`: CPU memory taken where
        written (engines.model.kv_cache)."""
        return KVCache.allocate(self.cfg, batch, max_len, device, dtype, fp8, lazy)

    def text_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Text token ids `[..., T]` -> projected talker-space rows `[..., T, H]`."""
        return self.text_projection(self.model.text_embedding(ids))

    def codec_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Talker codec ids (codebook 0 and control ids) -> `[..., H]`."""
        return self.model.codec_embedding(ids)

    def frame_embed(self, codes: torch.Tensor) -> torch.Tensor:
        """Sum of the 16 code embeddings of a frame: codes `[B, 16]` -> `[B, H]`."""
        parts = [self.codec_embed(codes[:, 0])]
        parts += [self.code_predictor.embed(i - 1, codes[:, i]) for i in range(1, codes.shape[1])]
        return torch.stack(parts, dim=1).sum(1)  # summed like the reference: [B, 16, H] -> [B, H]

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, mask=None):
        """x `[B, T, H]` -> (last normed hidden `[B, H]`, codebook-0 logits `[B, V]`)."""
        h = self.model(x, positions, cache, mask)[:, -1]
        return h, self.codec_head(h)
