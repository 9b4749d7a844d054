"""Frozen configs read from a Qwen3-TTS checkpoint's `config.json` files.

`ModelConfig.from_dir(path)` reads the root `config.json` (model_type `qwen3_tts`);
`CodecConfig.from_dir(path / "speech_tokenizer")` reads the codec's. Unknown keys are ignored,
missing keys take the official package's defaults, so configs of real checkpoints and tiny test
checkpoints load through the same code.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from engines.model.errors import CheckpointError


def _pick(cls, raw: Mapping[str, Any], **overrides):
    """Build dataclass `cls` from the keys of `raw` it knows about."""
    names = {f.name for f in fields(cls)}
    kw = {k: v for k, v in raw.items() if k in names}
    kw.update(overrides)
    return cls(**kw)


def read_json(path: Path) -> dict:
    """Read a JSON file, raising CheckpointError naming the file when it is missing or broken."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"missing checkpoint file: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"corrupt checkpoint file {path}: {exc}") from exc


@dataclass(frozen=True)
class DecoderStackConfig:
    """A Qwen3-style decoder stack (used by the talker and by the code predictor)."""

    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 5
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768


@dataclass(frozen=True)
class CodePredictorConfig(DecoderStackConfig):
    vocab_size: int = 2048
    num_code_groups: int = 16


@dataclass(frozen=True)
class TalkerConfig(DecoderStackConfig):
    vocab_size: int = 3072
    num_code_groups: int = 16
    text_hidden_size: int = 2048
    text_vocab_size: int = 151936
    codec_eos_token_id: int = 2150
    codec_think_id: int = 2154
    codec_nothink_id: int = 2155
    codec_think_bos_id: int = 2156
    codec_think_eos_id: int = 2157
    codec_pad_id: int = 2148
    codec_bos_id: int = 2149
    spk_id: Mapping[str, int] = field(default_factory=dict)
    spk_is_dialect: Mapping[str, Any] = field(default_factory=dict)
    codec_language_id: Mapping[str, int] = field(default_factory=dict)
    code_predictor: CodePredictorConfig = field(default_factory=CodePredictorConfig)

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> "TalkerConfig":
        raw = dict(raw)
        if "head_dim" not in raw and raw.get("num_attention_heads"):
            raw["head_dim"] = raw.get("hidden_size", 1024) // raw["num_attention_heads"]
        cp = _pick(CodePredictorConfig, raw.get("code_predictor_config") or {})
        return _pick(TalkerConfig, raw, code_predictor=cp,
                     spk_id=dict(raw.get("spk_id") or {}),
                     spk_is_dialect=dict(raw.get("spk_is_dialect") or {}),
                     codec_language_id=dict(raw.get("codec_language_id") or {}))

    @property
    def languages(self) -> list[str]:
        """Languages a user may ask for: 'auto' plus every non-dialect entry of codec_language_id."""
        return ["auto"] + [k for k in self.codec_language_id if "dialect" not in k]


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple = (5, 3, 3, 3, 1)
    enc_dilations: tuple = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> "SpeakerEncoderConfig":
        raw = {k: tuple(v) if isinstance(v, list) else v for k, v in (raw or {}).items()}
        return _pick(SpeakerEncoderConfig, raw)


MODEL_TYPES = ("base", "custom_voice", "voice_design")
# config.json key of a checkpoint made for tests (tests/data/tiny): says what it is, e.g. "random weights: noise"
TEST_MODEL_KEY = "tts_appliance_test_model"


@dataclass(frozen=True)
class ModelConfig:
    """Root config of a Qwen3-TTS checkpoint."""

    talker: TalkerConfig
    speaker_encoder: SpeakerEncoderConfig
    tts_model_type: str = "custom_voice"
    tts_model_size: str = ""
    tokenizer_type: str = "qwen3_tts_tokenizer_12hz"
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673
    test_model: str = ""  # non-empty for a test checkpoint (TEST_MODEL_KEY): why its audio is no speech

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> "ModelConfig":
        talker = TalkerConfig.from_dict(raw.get("talker_config") or {})
        spk = SpeakerEncoderConfig.from_dict(raw.get("speaker_encoder_config") or {})
        return _pick(ModelConfig, raw, talker=talker, speaker_encoder=spk,
                     test_model=str(raw.get(TEST_MODEL_KEY) or ""))

    @staticmethod
    def from_dir(path: str | Path) -> "ModelConfig":
        path = Path(path) / "config.json"
        raw = read_json(path)
        if raw.get("model_type") not in (None, "qwen3_tts"):
            raise CheckpointError(f"{path}: model_type is {raw.get('model_type')!r}, expected 'qwen3_tts'")
        cfg = ModelConfig.from_dict(raw)
        if cfg.tts_model_type not in MODEL_TYPES:
            raise CheckpointError(f"{path}: unknown tts_model_type {cfg.tts_model_type!r}; "
                                  f"expected one of {', '.join(MODEL_TYPES)}")
        return cfg


@dataclass(frozen=True)
class CodecDecoderConfig:
    codebook_size: int = 2048
    codebook_dim: int = 512
    hidden_size: int = 1024
    latent_dim: int = 1024
    max_position_embeddings: int = 8000
    rope_theta: float = 10000.0
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    attention_bias: bool = False
    sliding_window: int = 72
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    layer_scale_initial_scale: float = 0.01
    rms_norm_eps: float = 1e-5
    num_hidden_layers: int = 8
    num_quantizers: int = 16
    num_semantic_quantizers: int = 1
    upsample_rates: tuple = (8, 5, 4, 3)
    upsampling_ratios: tuple = (2, 2)
    decoder_dim: int = 1536

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> "CodecDecoderConfig":
        raw = {k: tuple(v) if isinstance(v, list) else v for k, v in (raw or {}).items()}
        if "head_dim" not in raw and raw.get("num_attention_heads"):
            raw["head_dim"] = raw.get("hidden_size", 1024) // raw["num_attention_heads"]
        return _pick(CodecDecoderConfig, raw)


@dataclass(frozen=True)
class CodecConfig:
    """Config of the `speech_tokenizer/` folder (Qwen3-TTS-Tokenizer-12Hz)."""

    decoder: CodecDecoderConfig
    encoder: Mapping[str, Any]  # Mimi encoder settings, read by engines.codec.encoder
    encoder_valid_num_quantizers: int = 16
    input_sample_rate: int = 24000
    output_sample_rate: int = 24000
    decode_upsample_rate: int = 1920
    encode_downsample_rate: int = 1920

    @staticmethod
    def from_dir(path: str | Path) -> "CodecConfig":
        path = Path(path) / "config.json"
        raw = read_json(path)
        return _pick(CodecConfig, raw, decoder=CodecDecoderConfig.from_dict(raw.get("decoder_config") or {}),
                     encoder=dict(raw.get("encoder_config") or {}))
