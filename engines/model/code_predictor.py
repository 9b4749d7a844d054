"""Code predictor (multi-token predictor): codebooks 1..15 of a frame from the talker's hidden state.

Per frame its input sequence is [talker hidden state, embedding of code 0], then one position per
produced code. The embedding tables live in talker space; `small_to_mtp_projection` maps them to the
predictor's width when the two differ (1.7B). Weight names follow `talker.code_predictor.*`.
"""
from __future__ import annotations

import torch
from torch import nn

from engines.model.config import CodePredictorConfig
from engines.model.kv_cache import KVCache
from engines.model.layers import DecoderStack


class _PredictorBody(DecoderStack):
    def __init__(self, cfg: CodePredictorConfig, talker_hidden: int):
        super().__init__(cfg)
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.vocab_size, talker_hidden) for _ in range(cfg.num_code_groups - 1))


class CodePredictor(nn.Module):
    def __init__(self, cfg: CodePredictorConfig, talker_hidden: int):
        super().__init__()
        self.cfg = cfg
        self.model = _PredictorBody(cfg, talker_hidden)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(cfg.num_code_groups - 1))
        self.small_to_mtp_projection = (nn.Linear(talker_hidden, cfg.hidden_size, bias=True)
                                        if cfg.hidden_size != talker_hidden else nn.Identity())

    @property
    def num_steps(self) -> int:
        """Codes produced per frame (15)."""
        return self.cfg.num_code_groups - 1

    def new_cache(self, batch: int, device, dtype) -> KVCache:
        return KVCache.allocate(self.cfg, batch, self.cfg.num_code_groups + 1, device, dtype)

    def embed(self, step: int, codes: torch.Tensor) -> torch.Tensor:
        """Talker-space embedding of codebook `step+1` codes `[B]` -> `[B, H_talker]`."""
        return self.model.codec_embedding[step](codes)

    def prefill(self, talker_hidden: torch.Tensor, code0_embed: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Positions 0, 1: `[B, H_talker]` x2 -> logits of codebook 1 `[B, V]`."""
        x = self.small_to_mtp_projection(torch.stack([talker_hidden, code0_embed], dim=1))  # [B, 2, Hp]
        pos = torch.arange(2, device=x.device)[None].expand(x.shape[0], 2)
        h = self.model(x, pos, cache)
        return self.lm_head[0](h[:, -1])

    def step(self, step: int, code_embed: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Feed the embedding `[B, H_talker]` of codebook `step` at position step+1 -> logits of codebook step+1."""
        x = self.small_to_mtp_projection(code_embed[:, None])  # [B, 1, Hp]
        pos = torch.full((x.shape[0], 1), step + 1, device=x.device, dtype=torch.long)
        h = self.model(x, pos, cache)
        return self.lm_head[step](h[:, -1])
