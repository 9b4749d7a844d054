"""Codec ENCODER of Qwen3-TTS-Tokenizer-12Hz: 24 kHz audio -> 16 codebooks of codes at 12.5 Hz.

The official tokenizer wraps a Mimi encoder: a causal SEANet conv stack (24 kHz -> 25 Hz), a small
causal transformer, a stride-2 conv (25 -> 12.5 Hz) and a split residual vector quantizer (1 semantic
+ N acoustic codebooks, nearest code by euclidean distance). Only the first
`encoder_valid_num_quantizers` (16) codebooks are kept; because RVQ is sequential, the unused later
codebooks never influence the kept ones, so their weights are dropped at load time.

Parameter names equal the `encoder.*` keys of `speech_tokenizer/model.safetensors` (prefix removed).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from engines.model.config import CodecConfig
from engines.model.errors import CheckpointError
from engines.model.layers import apply_rope, rope_cos_sin

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MimiEncoderConfig:
    """Mimi settings used by the encoder half (defaults = transformers' MimiConfig defaults)."""

    sampling_rate: int = 24000
    frame_rate: float | None = None
    audio_channels: int = 1
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple = (8, 6, 5, 4)
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    use_causal_conv: bool = True
    pad_mode: str = "constant"
    compress: int = 2
    codebook_size: int = 2048
    codebook_dim: int | None = 256
    num_quantizers: int = 32
    use_conv_shortcut: bool = False
    vector_quantization_hidden_dimension: int = 256
    num_semantic_quantizers: int = 1
    num_hidden_layers: int = 8
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int | None = None
    hidden_act: str = "gelu"
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    layer_scale_initial_scale: float = 0.01
    attention_bias: bool = False

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> "MimiEncoderConfig":
        names = {f.name for f in dataclasses.fields(MimiEncoderConfig)}
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in (raw or {}).items() if k in names}
        cfg = MimiEncoderConfig(**kw)
        if cfg.upsampling_ratios is None or len(cfg.upsampling_ratios) == 0:
            cfg = dataclasses.replace(cfg, upsampling_ratios=MimiEncoderConfig.upsampling_ratios)
        rope = (raw or {}).get("rope_scaling")
        if rope and rope.get("rope_type", rope.get("type", "default")) != "default":
            raise CheckpointError(f"codec encoder: unsupported rope_scaling {rope!r}")
        return cfg

    @property
    def hop_length(self) -> int:
        """Samples per frame of the conv encoder output (before the 2x downsample)."""
        return math.prod(self.upsampling_ratios)

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def downsample_kernel(self) -> int:
        """Kernel of the stride-2 conv from the conv rate (25 Hz) to the code rate (12.5 Hz); 0 = none."""
        conv_rate = math.ceil(self.sampling_rate / self.hop_length)
        rate = self.frame_rate if self.frame_rate is not None else self.sampling_rate / (2 * self.hop_length)
        return 0 if rate == conv_rate else 2 * int(conv_rate / rate)


_ACTS = {"gelu": F.gelu, "silu": F.silu, "relu": F.relu,
         "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
         "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


class CausalConv1d(nn.Module):
    """Conv1d that pads itself (causal: all on the left) so length becomes ceil(T / stride)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1,
                 bias: bool = True, causal: bool = True, pad_mode: str = "constant"):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride, dilation=dilation, bias=bias)
        self.stride, self.causal, self.pad_mode = stride, causal, pad_mode
        self.pad_total = (kernel - 1) * dilation + 1 - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, Cin, T] -> [B, Cout, ceil(T/stride)]
        length = x.shape[-1]
        extra = -(-length // self.stride) * self.stride - length  # right pad to a whole number of strides
        if self.causal:
            left, right = self.pad_total, extra
        else:
            right0 = self.pad_total // 2
            left, right = self.pad_total - right0, right0 + extra
        x = _pad(x, left, right, self.pad_mode)
        return self.conv(x)


def _pad(x: torch.Tensor, left: int, right: int, mode: str) -> torch.Tensor:
    """F.pad, with reflect padding allowed on inputs shorter than the pad (zero-extended first)."""
    if mode != "reflect":
        return F.pad(x, (left, right), mode=mode)
    grow = max(0, max(left, right) - x.shape[-1] + 1)
    out = F.pad(F.pad(x, (0, grow)), (left, right), mode="reflect")
    return out[..., : out.shape[-1] - grow]


class ResBlock(nn.Module):
    """SEANet residual unit: ELU, conv k (dilated), ELU, conv 1, plus the (optionally conv) shortcut."""

    def __init__(self, cfg: MimiEncoderConfig, dim: int, dilation: int):
        super().__init__()
        hidden = dim // cfg.compress
        conv = dict(causal=cfg.use_causal_conv, pad_mode=cfg.pad_mode)
        self.block = nn.ModuleList([nn.ELU(), CausalConv1d(dim, hidden, cfg.residual_kernel_size, dilation=dilation, **conv),
                                    nn.ELU(), CausalConv1d(hidden, dim, 1, **conv)])
        self.shortcut = CausalConv1d(dim, dim, 1, **conv) if cfg.use_conv_shortcut else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        y = x
        for layer in self.block:
            y = layer(y)
        return self.shortcut(x) + y


class ConvEncoder(nn.Module):
    """SEANet encoder: waveform [B, 1, S] -> latents [B, hidden, ceil(S / hop)]."""

    def __init__(self, cfg: MimiEncoderConfig):
        super().__init__()
        conv = dict(causal=cfg.use_causal_conv, pad_mode=cfg.pad_mode)
        layers: list[nn.Module] = [CausalConv1d(cfg.audio_channels, cfg.num_filters, cfg.kernel_size, **conv)]
        ch = cfg.num_filters
        for ratio in reversed(cfg.upsampling_ratios):
            for j in range(cfg.num_residual_layers):
                layers.append(ResBlock(cfg, ch, cfg.dilation_growth_rate ** j))
            layers += [nn.ELU(), CausalConv1d(ch, ch * 2, ratio * 2, stride=ratio, **conv)]
            ch *= 2
        layers += [nn.ELU(), CausalConv1d(ch, cfg.hidden_size, cfg.last_kernel_size, **conv)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class Attention(nn.Module):
    """Causal multi-head self-attention with rotary positions (rotate-half convention)."""

    def __init__(self, cfg: MimiEncoderConfig):
        super().__init__()
        self.heads, self.kv_heads, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_size
        b = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.hd, bias=b)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.hd, bias=b)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.hd, bias=b)
        self.o_proj = nn.Linear(self.heads * self.hd, cfg.hidden_size, bias=b)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # [B, T, H]
        bsz, t, _ = x.shape
        q = self.q_proj(x).view(bsz, t, self.heads, self.hd).transpose(1, 2)  # [B, nh, T, hd]
        k = self.k_proj(x).view(bsz, t, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(bsz, t, self.kv_heads, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)  # [B, nh, T, hd]
        return self.o_proj(out.transpose(1, 2).reshape(bsz, t, -1))


class TransformerLayer(nn.Module):
    """Pre-norm block: x + ls(attn(ln(x))), then x + ls(mlp(ln(x)))."""

    def __init__(self, cfg: MimiEncoderConfig):
        super().__init__()
        h = cfg.hidden_size
        self.self_attn = Attention(cfg)
        self.mlp = nn.Module()
        self.mlp.fc1 = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.fc2 = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.act = _ACTS[cfg.hidden_act]
        self.input_layernorm = nn.LayerNorm(h, eps=cfg.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(h, eps=cfg.norm_eps)
        self.self_attn_layer_scale = LayerScale(h, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(h, cfg.layer_scale_initial_scale)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # [B, T, H]
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin))
        y = self.mlp.fc2(self.act(self.mlp.fc1(self.post_attention_layernorm(x))))
        return x + self.mlp_layer_scale(y)


class Transformer(nn.Module):
    """Causal transformer over conv-encoder frames (full causal attention, as in transformers 4.57)."""

    def __init__(self, cfg: MimiEncoderConfig):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.head_dim, self.theta = cfg.head_size, cfg.rope_theta

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, H]
        pos = torch.arange(x.shape[1], device=x.device)[None]  # [1, T]
        cos, sin = rope_cos_sin(pos, self.head_dim, self.theta, x.dtype)  # [1, T, hd], made in fp32
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


class Codebook(nn.Module):
    """Euclidean codebook stored as running sums (embed = embed_sum / cluster_usage)."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))

    def embed(self) -> torch.Tensor:  # [K, D]
        return self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class RVQ(nn.Module):
    """Residual VQ: project to the codebook space, then peel off the nearest code layer by layer."""

    def __init__(self, cfg: MimiEncoderConfig, n_layers: int):
        super().__init__()
        dim = cfg.vector_quantization_hidden_dimension
        cb_dim = cfg.codebook_dim or cfg.hidden_size
        self.layers = nn.ModuleList(nn.Module() for _ in range(n_layers))
        for layer in self.layers:
            layer.codebook = Codebook(cfg.codebook_size, cb_dim)
        self.input_proj = nn.Conv1d(cfg.hidden_size, dim, 1, bias=False) if dim != cfg.hidden_size else None

    def encode(self, x: torch.Tensor) -> torch.Tensor:  # [B, H, T] -> [n_layers, B, T]
        if self.input_proj is not None:
            x = self.input_proj(x)
        res = x.transpose(1, 2)  # [B, T, D]
        codes = []
        for layer in self.layers:
            table = layer.codebook.embed()
            flat = res.reshape(-1, res.shape[-1])
            idx = torch.cdist(flat[None].float(), table[None].float(), p=2)[0].argmin(dim=-1)
            idx = idx.view(res.shape[:-1])  # [B, T]
            res = res - F.embedding(idx, table)
            codes.append(idx)
        return torch.stack(codes)


class CodecEncoder(nn.Module):
    """Mimi encoder keeping the first `n_valid` codebooks: wav [B, S] at 24 kHz -> codes [B, n_valid, F]."""

    def __init__(self, cfg: MimiEncoderConfig, n_valid: int = 16, downsample_rate: int = 1920):
        super().__init__()
        if not cfg.num_semantic_quantizers <= n_valid <= cfg.num_quantizers:
            raise CheckpointError(f"codec encoder: {n_valid} valid codebooks, but the quantizer has "
                                  f"{cfg.num_semantic_quantizers} semantic of {cfg.num_quantizers} in all")
        self.cfg, self.n_valid, self.downsample_rate = cfg, n_valid, downsample_rate
        self.encoder = ConvEncoder(cfg)
        self.encoder_transformer = Transformer(cfg)
        self.downsample = (CausalConv1d(cfg.hidden_size, cfg.hidden_size, cfg.downsample_kernel, stride=2, bias=False,
                                        causal=cfg.use_causal_conv, pad_mode="replicate")
                           if cfg.downsample_kernel else None)
        self.quantizer = nn.Module()
        self.quantizer.semantic_residual_vector_quantizer = RVQ(cfg, cfg.num_semantic_quantizers)
        self.quantizer.acoustic_residual_vector_quantizer = RVQ(cfg, n_valid - cfg.num_semantic_quantizers)

    @torch.inference_mode()
    def forward(self, wav: torch.Tensor) -> torch.Tensor:  # [B, S] -> [B, n_valid, ceil(S / 1920)]
        p = next(self.parameters())
        x = wav.to(device=p.device, dtype=p.dtype)[:, None, :]  # [B, 1, S]
        x = self.encoder(x)  # [B, H, T25]
        x = self.encoder_transformer(x.transpose(1, 2)).transpose(1, 2)
        if self.downsample is not None:
            x = self.downsample(x)  # [B, H, T12]
        q = self.quantizer
        codes = torch.cat([q.semantic_residual_vector_quantizer.encode(x),
                           q.acoustic_residual_vector_quantizer.encode(x)], dim=0)  # [n_valid, B, F]
        return codes.transpose(0, 1)

    def encode(self, wav: torch.Tensor, lengths: torch.Tensor | list[int] | None = None) -> torch.Tensor:
        """Codes [B, 16, frames] int64 for a (zero right-padded) batch of 24 kHz waveforms [B, S].

        With `lengths`, frames = ceil(max(lengths) / 1920) and frames past each clip's own
        ceil(length / 1920) are set to -1 (the official trims each clip to that many frames).
        """
        if wav.dim() == 1:
            wav = wav[None]
        codes = self.forward(wav)
        if lengths is None:
            return codes[..., : -(-wav.shape[-1] // self.downsample_rate)]
        n = torch.as_tensor(lengths, device=codes.device)
        n = -(-n // self.downsample_rate)  # [B]
        codes = codes[..., : int(n.max())]
        past_end = torch.arange(codes.shape[-1], device=codes.device)[None, :] >= n[:, None]  # [B, F]
        return codes.masked_fill(past_end[:, None, :], -1)

    def encode_one(self, wav: torch.Tensor) -> torch.Tensor:
        """Codes [frames, 16] of one 24 kHz clip [S] (the layout of the official `ref_code`)."""
        return self.encode(torch.as_tensor(wav).reshape(1, -1))[0].transpose(0, 1).contiguous()


_DROP = re.compile(r"^(quantizer\.\w+\.output_proj\.weight|"
                   r"quantizer\.acoustic_residual_vector_quantizer\.layers\.(\d+)\..*|"
                   r"(upsample|decoder|decoder_transformer)\..*)$")


def load_codec_encoder(path: str | Path, device: str | torch.device = "cpu",
                       dtype: torch.dtype = torch.float32) -> CodecEncoder:
    """Build the encoder from a `speech_tokenizer/` folder (its config.json and model.safetensors)."""
    from safetensors import safe_open

    path = Path(path)
    cc = CodecConfig.from_dir(path)
    cfg = MimiEncoderConfig.from_dict(cc.encoder)
    model = CodecEncoder(cfg, cc.encoder_valid_num_quantizers, cc.encode_downsample_rate)
    wfile = path / "model.safetensors"
    if not wfile.is_file():
        raise CheckpointError(f"missing checkpoint file: {wfile}")
    n_acoustic = model.n_valid - cfg.num_semantic_quantizers
    state = {}
    try:  # read only the encoder tensors (the file also holds the much larger decoder)
        with safe_open(str(wfile), framework="pt", device="cpu") as f:
            for key in f.keys():
                if not key.startswith("encoder."):
                    continue
                name = key[len("encoder."):]
                m = _DROP.match(name)
                if m and (m.group(2) is None or int(m.group(2)) >= n_acoustic):
                    continue  # codebooks past the valid ones (and decode-only weights) never affect encode
                state[name] = f.get_tensor(key)
    except Exception as exc:  # safetensors raises several types for broken files
        raise CheckpointError(f"corrupt checkpoint file {wfile}: {exc}") from exc
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{wfile}: codec encoder weights do not match its config: {exc}") from exc
    log.info("codec encoder loaded from %s (%d tensors, %d codebooks)", path, len(state), model.n_valid)
    return model.to(device=device, dtype=dtype).eval()
