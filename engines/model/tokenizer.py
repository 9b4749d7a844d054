"""Qwen2 byte-level BPE text tokenizer, built with the `tokenizers` library from checkpoint files.

Uses `tokenizer.json` when the checkpoint has one; otherwise builds the same pipeline the Qwen2 fast
tokenizer uses from `vocab.json` + `merges.txt` (NFC, the Qwen2 split pattern, byte-level BPE) and adds
the special tokens listed in `tokenizer_config.json`.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from engines.model.errors import CheckpointError

QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
# The official package loads its processor with `fix_mistral_regex=True`; transformers 4.57.x then swaps
# the split pattern for this one on large vocabularies (> 100k) whose config.json was saved by a
# transformers version above 4.57.2 and below 5.0, or names none. We reproduce that rule so real
# checkpoints tokenize exactly as the official package tokenizes them.
PATCHED_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                 r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                 r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _version(v: str) -> tuple:
    parts = []
    for p in str(v).split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (3 - len(parts)))


def official_uses_patched_split(folder: Path, vocab_size: int) -> bool:
    """Whether the official processor would replace the split pattern for this checkpoint."""
    if vocab_size <= 100_000:
        return False
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    ver, model_type = cfg.get("transformers_version"), cfg.get("model_type")
    if ver and _version(ver) <= (4, 57, 2) and model_type not in (None, "mistral", "mistral3", "voxtral",
                                                                   "ministral", "pixtral"):
        return False
    return not (ver and _version(ver) >= (5, 0, 0))


def _use_patched_split(tok: Tokenizer) -> None:
    pre = tok.pre_tokenizer
    split = pre_tokenizers.Split(Regex(PATCHED_SPLIT), behavior="isolated", invert=False)
    if isinstance(pre, pre_tokenizers.Sequence):
        pre[0] = split
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([split, pre])


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
                tok = Tokenizer.from_file(str(tj))
            except Exception as exc:
                raise CheckpointError(f"corrupt checkpoint file {tj}: {exc}") from exc
        else:
            tok = _build_from_vocab(folder)
        if official_uses_patched_split(folder, tok.get_vocab_size(with_added_tokens=False)):
            _use_patched_split(tok)
        return TextTokenizer(tok)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)
