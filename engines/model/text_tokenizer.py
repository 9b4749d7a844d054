"""Qwen2 byte-level BPE text tokenizer, built with the `tokenizers` library from checkpoint files.

Uses `tokenizer.json` when the checkpoint has one; otherwise builds the same pipeline the Qwen2 fast
tokenizer uses from `vocab.json` + `merges.txt` (NFC, the Qwen2 split pattern, byte-level BPE) and adds
the special tokens listed in `tokenizer_config.json`.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from .errors import CheckpointError

QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def _build_from_vocab(folder: Path) -> Tokenizer:
    vocab, merges = folder / "vocab.json", folder / "merges.txt"
    for f in (vocab, merges):
        if not f.is_file():
            raise CheckpointError(f"missing tokenizer file: {f} (a Qwen3-TTS checkpoint needs vocab.json "
                                  "and merges.txt, or tokenizer.json)")
    try:
        bpe = models.BPE.from_file(str(vocab), str(merges))
    except Exception as exc:  # the tokenizers library raises plain Exceptions on bad files
        raise CheckpointError(f"corrupt tokenizer files in {folder}: {exc}") from exc
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    cfg_path = folder / "tokenizer_config.json"
    added = {}
    if cfg_path.is_file():
        try:
            added = json.loads(cfg_path.read_text(encoding="utf-8")).get("added_tokens_decoder", {})
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"corrupt checkpoint file {cfg_path}: {exc}") from exc
    for tid, spec in sorted(added.items(), key=lambda kv: int(kv[0])):
        token = AddedToken(spec["content"], special=bool(spec.get("special", True)), normalized=False,
                           lstrip=bool(spec.get("lstrip")), rstrip=bool(spec.get("rstrip")),
                           single_word=bool(spec.get("single_word")))
        tok.add_special_tokens([token]) if token.special else tok.add_tokens([token])
        if tok.token_to_id(spec["content"]) != int(tid):
            raise CheckpointError(f"{cfg_path}: token {spec['content']!r} should have id {tid} but the "
                                  f"vocabulary gives {tok.token_to_id(spec['content'])}")
    return tok


class TextTokenizer:
    """Encodes prompt strings to token ids."""

    def __init__(self, tok: Tokenizer):
        self._tok = tok

    @staticmethod
    def from_dir(folder: str | Path) -> "TextTokenizer":
        folder = Path(folder)
        tj = folder / "tokenizer.json"
        if tj.is_file():
            try:
                return TextTokenizer(Tokenizer.from_file(str(tj)))
            except Exception as exc:
                raise CheckpointError(f"corrupt checkpoint file {tj}: {exc}") from exc
        return TextTokenizer(_build_from_vocab(folder))

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)
