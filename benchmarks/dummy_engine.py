"""Random-weight models of the real Qwen3-TTS shapes, for benchmarks (no checkpoint download needed).

Shapes follow the published checkpoints: talker 1024 (0.6B) or 2048 (1.7B) hidden, 28 layers, 16/8
heads of 128; a 5-layer 1024-wide code predictor; the 12 Hz codec decoder as the published
speech_tokenizer/config.json has it (`RELEASED_CODEC`: pre-transformer hidden 512, intermediate 1024, 16
heads of 64; `CodecDecoderConfig`'s defaults, 1024 / 3072, are heavier). Text ids come from a small bundled
tokenizer (the tiny test checkpoint's), which only changes which embedding rows are read.
"""
from __future__ import annotations

from pathlib import Path

import torch

from engines.model.checkpoint import Qwen3TTSWeights, resolve_dtype
from engines.model.config import CodecConfig, CodecDecoderConfig, ModelConfig, TalkerConfig
from engines.model.sampling import OFFICIAL_DEFAULTS
from engines.model.tokenizer import TextTokenizer

SHAPES = {
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, size="0b6"),
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, size="1b7"),
}
TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "tiny" / "cv_small"
SPEAKERS = {"vivian": 3065, "serena": 3066, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861}
# the decoder of the published Qwen3-TTS-Tokenizer-12Hz (its speech_tokenizer/config.json "decoder_config"); the
# fields not named are CodecDecoderConfig's defaults, which equal the published ones
RELEASED_CODEC = CodecDecoderConfig(hidden_size=512, intermediate_size=1024, num_attention_heads=16,
                                    num_key_value_heads=16, head_dim=64, latent_dim=1024, decoder_dim=1536,
                                    codebook_dim=512, codebook_size=2048, num_hidden_layers=8, sliding_window=72)
LANGS = {"english": 2050, "german": 2053, "spanish": 2054, "chinese": 2055, "japanese": 2058, "french": 2061,
         "korean": 2064, "russian": 2069, "italian": 2070, "portuguese": 2071}


def dummy_config(shape: str, tokenizer: TextTokenizer) -> ModelConfig:
    s = SHAPES[shape]
    cp = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=5, num_attention_heads=16,
              num_key_value_heads=8, head_dim=128, vocab_size=2048, num_code_groups=16, rope_theta=1e6)
    talker = TalkerConfig.from_dict(dict(
        hidden_size=s["hidden_size"], intermediate_size=s["intermediate_size"], num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1e6, vocab_size=3072,
        text_hidden_size=2048, text_vocab_size=151936, spk_id=SPEAKERS, spk_is_dialect={k: False for k in SPEAKERS},
        codec_language_id=LANGS, code_predictor_config=cp))
    ids = {name: tokenizer.token_id(tok) for name, tok in (
        ("im_start_token_id", "<|im_start|>"), ("im_end_token_id", "<|im_end|>"), ("tts_pad_token_id", "<|tts_pad|>"),
        ("tts_bos_token_id", "<|tts_text_bos|>"), ("tts_eos_token_id", "<|tts_text_eod|>"))}
    return ModelConfig(talker=talker, speaker_encoder=ModelConfig.from_dict({}).speaker_encoder,
                       tts_model_type="custom_voice", tts_model_size=s["size"], **ids)


@torch.no_grad()
def _random_module(build, device, dtype, seed: int) -> torch.nn.Module:
    """Build on the meta device, allocate on `device`, fill with seeded random values there."""
    with torch.device("meta"):
        module = build()
    module = module.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    for name, p in module.named_parameters():
        p.normal_(0.0, 0.02, generator=g)
        if (name.endswith("weight") and "norm" in name) or name.endswith("cluster_usage"):
            p.add_(1.0)
    module = module.to(dtype).eval().requires_grad_(False)
    for m in module.modules():  # non-persistent fp32 buffers (codec RoPE frequencies)
        if hasattr(m, "rope_inv_freq"):
            m.inv_freq = m.rope_inv_freq(device)
    return module


def dummy_engine(shape: str, device="cuda", dtype="bfloat16", seed: int = 0):
    """A TTSEngine of the real `shape` ('0.6b' or '1.7b') with random weights (CustomVoice type)."""
    from engines.engine import TTSEngine
    from engines.codec.decoder import CodecDecoder

    dt, dev = resolve_dtype(dtype), torch.device(device)
    tok = TextTokenizer.from_dir(TOKENIZER_DIR)
    cfg = dummy_config(shape, tok)
    weights = _random_module(lambda: Qwen3TTSWeights(cfg), dev, dt, seed)
    codec_cfg = CodecConfig(decoder=RELEASED_CODEC, encoder={})
    decoder = _random_module(lambda: CodecDecoder(codec_cfg.decoder), dev, dt, seed + 1)
    return TTSEngine(None, cfg, weights, tok, codec_cfg, decoder, OFFICIAL_DEFAULTS, dev, dt,
                     model_id=f"dummy-{shape}:{seed}:{str(dt).split('.')[-1]}")
