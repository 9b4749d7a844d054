"""Prompt construction for all three voice modes, as the official package builds it.

A prompt is a prefill sequence of talker-space rows (text stream + codec stream summed position by
position) plus the text rows still to feed, one per generated frame, in streaming-text mode.

Layout (C = codec prefix incl. speaker slot and [pad, bos]):
  [instruction rows] [role: "<|im_start|>assistant\\n"] [tts_pad x (C-2), tts_bos] + codec[:-1]
  then either the first text token + codec bos (streaming text; the rest trails),
  or the whole text + tts_eos over codec pad, then tts_pad + codec bos (non-streaming),
  or, for voice cloning with reference text (ICL), reference text + text + tts_eos against
  codec bos + reference codes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from engines.model.config import ModelConfig
from engines.model.talker import Talker
from engines.model.tokenizer import TextTokenizer


def assistant_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def ref_text_prompt(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def instruct_text(instruct: str) -> str:
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


@dataclass
class PromptSpec:
    """A fully resolved request: what goes into the prompt."""

    text: str
    language_id: Optional[int] = None  # codec language id, None = auto
    speaker_id: Optional[int] = None  # CustomVoice speaker codec id
    speaker_embedding: Optional[torch.Tensor] = None  # Base: x-vector [H]
    instruct: Optional[str] = None
    ref_text: Optional[str] = None  # ICL
    ref_codes: Optional[torch.Tensor] = None  # ICL reference codes [T, 16]
    non_streaming: bool = True


@dataclass
class Prompt:
    prefill: torch.Tensor  # [T, H]
    trailing: torch.Tensor  # [N, H] text rows fed one per frame
    pad: torch.Tensor  # [H] tts_pad row, fed once the trailing rows are used up


def ids_on(ids: list, device) -> torch.Tensor:
    """Token ids `[1, n]` (int64) on `device` without waiting for the device: a plain `torch.tensor(...,
    device=cuda)` synchronises the stream after its copy, so every prompt built while a decode step runs
    would stall the loop until that step ends."""
    return torch.tensor([ids], dtype=torch.long).to(device, non_blocking=True)


class PromptBuilder:
    def __init__(self, cfg: ModelConfig, tokenizer: TextTokenizer, talker: Talker):
        self.cfg, self.tok, self.talker = cfg, tokenizer, talker

    def _ids(self, text: str, device) -> torch.Tensor:
        return ids_on(self.tok.encode(text), device)  # [1, L]

    def text_ids(self, text: str) -> list[int]:
        """The text's token ids as the prompt holds them (inside the assistant turn)."""
        return self.tok.encode(assistant_text(text))[3:-5]

    @torch.no_grad()
    def text_rows(self, ids: list[int], end: bool) -> torch.Tensor:
        """Talker-space rows `[n (+1), H]` for text tokens fed in streaming-text mode (+ tts_eos when `end`)."""
        dev = self.talker.codec_head.weight.device
        ids = list(ids) + ([self.cfg.tts_eos_token_id] if end else [])
        if not ids:
            return torch.empty(0, self.cfg.talker.hidden_size, device=dev, dtype=self.talker.codec_head.weight.dtype)
        return self.talker.text_embed(ids_on(ids, dev))[0]

    def _codec(self, ids: list[int], device) -> torch.Tensor:
        return self.talker.codec_embed(ids_on(ids, device))  # [1, n, H]

    @torch.no_grad()
    def build(self, spec: PromptSpec, text_open: bool = False) -> Prompt:
        """`text_open`: streaming-text mode with more text to come (engines.runtime.text_feed): the trailing
        rows stop at the text given, without tts_eos."""
        tc, dev, talker = self.cfg.talker, self.talker.codec_head.weight.device, self.talker
        ids = self._ids(assistant_text(spec.text), dev)
        special = ids_on([self.cfg.tts_bos_token_id, self.cfg.tts_eos_token_id, self.cfg.tts_pad_token_id], dev)
        tts_bos, tts_eos, tts_pad = talker.text_embed(special).chunk(3, dim=1)  # 3 x [1, 1, H]

        if spec.language_id is None:
            prefix = [tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id]
        else:
            prefix = [tc.codec_think_id, tc.codec_think_bos_id, spec.language_id, tc.codec_think_eos_id]
        parts = [self._codec(prefix, dev)]
        if spec.speaker_id is not None:
            parts.append(self._codec([spec.speaker_id], dev))
        elif spec.speaker_embedding is not None:
            parts.append(spec.speaker_embedding.to(dev, tts_pad.dtype, non_blocking=True).view(1, 1, -1))
        parts.append(self._codec([tc.codec_pad_id, tc.codec_bos_id], dev))
        codec = torch.cat(parts, dim=1)  # [1, C, H]

        role = talker.text_embed(ids[:, :3])
        body = torch.cat((tts_pad.expand(-1, codec.shape[1] - 2, -1), tts_bos), dim=1) + codec[:, :-1]
        x = torch.cat((role, body), dim=1)

        if spec.ref_codes is not None:
            icl, trailing = self._icl(ids[:, 3:-5], self._ids(ref_text_prompt(spec.ref_text), dev)[:, 3:-2],
                                      spec.ref_codes.to(dev, non_blocking=True), tts_pad, tts_eos, spec.non_streaming)
            x = torch.cat((x, icl), dim=1)
        elif spec.non_streaming:
            n = ids[:, 3:-5].shape[1]
            text_rows = torch.cat((talker.text_embed(ids[:, 3:-5]), tts_eos), dim=1)
            x = torch.cat((x, text_rows + self._codec([tc.codec_pad_id] * (n + 1), dev),
                           tts_pad + self._codec([tc.codec_bos_id], dev)), dim=1)
            trailing = tts_pad
        else:
            x = torch.cat((x, talker.text_embed(ids[:, 3:4]) + codec[:, -1:]), dim=1)
            trailing = torch.cat((talker.text_embed(ids[:, 4:-5]), tts_eos[:, :0 if text_open else 1]), dim=1)

        if spec.instruct:
            x = torch.cat((talker.text_embed(self._ids(instruct_text(spec.instruct), dev)), x), dim=1)
        return Prompt(prefill=x[0], trailing=trailing[0], pad=tts_pad[0, 0])

    def _icl(self, text_ids, ref_ids, ref_codes, tts_pad, tts_eos, non_streaming):
        """Reference text + text against codec bos + reference codes; returns (rows, trailing)."""
        tc, talker = self.cfg.talker, self.talker
        dev = text_ids.device
        text = torch.cat((talker.text_embed(torch.cat([ref_ids, text_ids], dim=-1)), tts_eos), dim=1)
        codec = torch.cat((self._codec([tc.codec_bos_id], dev), talker.frame_embed(ref_codes)[None]), dim=1)
        nt, nc = text.shape[1], codec.shape[1]
        if non_streaming:
            rows = torch.cat((text + self._codec([tc.codec_pad_id] * nt, dev), codec + tts_pad), dim=1)
            return rows, tts_pad
        if nt > nc:
            return text[:, :nc] + codec, text[:, nc:]
        return torch.cat([text] + [tts_pad] * (nc - nt), dim=1) + codec, tts_pad
