"""Qwen3-TTS-Tokenizer-12Hz codec decoder: 16 codebooks of codes at 12.5 Hz -> 24 kHz waveform.

Pipeline (all of it causal): split residual-VQ lookup -> causal conv -> sliding-window transformer
-> 2x (transposed conv + ConvNeXt) -> causal conv -> 4x (SnakeBeta, transposed conv, 3 dilated
residual units) -> SnakeBeta -> causal conv -> clamp to [-1, 1].

Module and parameter names mirror the official state dict under its `decoder.` prefix, so weights
load with a strict `load_state_dict`. Every stateful layer can also run in streaming mode: given a
stream state `st` (engines.codec.state.StreamState; `st.roll(key, x)` prepends the
layer's saved left context and stores the new one) it continues where the previous call stopped, so
feeding frames in pieces reproduces the one-shot output. The convolutional building blocks live in
engines.codec.layers (the fast stack, engines.codec.fast, reads the same modules).
"""
from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engines.codec.layers import CausalConv1d, CausalTransConv1d, ConvNeXtBlock, DecoderBlock, SnakeBeta
from engines.model.config import CodecConfig, CodecDecoderConfig
from engines.model.errors import CheckpointError

if TYPE_CHECKING:  # the runtime owns the state object; layers only call st.roll / st.rate / st.pos
    from engines.codec.state import StreamState

log = logging.getLogger(__name__)
_ACT = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}
CHECK_CODES_ENV = "TTS_APPLIANCE_CHECK_CODES"
# debug guard, read once: every code the codebooks look up is checked to lie in range (on in the tests)
CHECK_CODES = os.environ.get(CHECK_CODES_ENV, "") not in ("", "0")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: Tensor) -> Tensor:  # normalise in fp32, scale in the input dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), 0.01))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    """Causal sliding-window self-attention with RoPE; streams keep the last window-1 keys/values."""

    def __init__(self, c: CodecDecoderConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.window = (c.num_attention_heads, c.num_key_value_heads,
                                                                 c.head_dim, c.sliding_window)
        bias = c.attention_bias
        self.q_proj = nn.Linear(c.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, c.hidden_size, bias=bias)

    def state_shapes(self, batch: int) -> dict:
        shape = (batch, self.kv_heads, self.window - 1, self.head_dim)
        return {".k": shape, ".v": shape}

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, qpos: Tensor, st: StreamState | None) -> Tensor:
        b, t, _ = x.shape  # x [B, T, H]; cos/sin [B, 1, T, D]; qpos [B, T]
        q = _rotate(self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2), cos, sin)  # [B, h, T, D]
        k = _rotate(self.k_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        kpos = qpos
        if st is not None:
            k, v = st.roll(self.key + ".k", k, dim=2), st.roll(self.key + ".v", v, dim=2)
            past = torch.arange(1 - self.window, 0, device=x.device) + qpos[:, :1]  # [B, W-1]
            kpos = torch.cat([past, qpos], dim=1)  # [B, W-1+T]
        d = qpos[:, :, None] - kpos[:, None, :]  # [B, T, S]
        mask = (d >= 0) & (d < self.window) & (kpos[:, None, :] >= 0)
        rep = self.heads // self.kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=self.head_dim ** -0.5)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))


class Mlp(nn.Module):
    def __init__(self, c: CodecDecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.act = _ACT[c.hidden_act]

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    def __init__(self, c: CodecDecoderConfig):
        super().__init__()
        self.self_attn, self.mlp = Attention(c), Mlp(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(c.hidden_size)
        self.mlp_layer_scale = LayerScale(c.hidden_size)

    def forward(self, x: Tensor, cos, sin, qpos, st) -> Tensor:  # [B, T, H]
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, qpos, st))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class PreTransformer(nn.Module):
    def __init__(self, c: CodecDecoderConfig):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.input_proj = nn.Linear(c.latent_dim, c.hidden_size)
        self.output_proj = nn.Linear(c.hidden_size, c.latent_dim)
        self.head_dim, self.theta = c.head_dim, c.rope_theta
        self.register_buffer("inv_freq", self.rope_inv_freq(), persistent=False)

    def rope_inv_freq(self, device=None) -> Tensor:
        """RoPE inverse frequencies, computed in fp32 on the CPU like the reference, then moved."""
        exps = torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim
        return (1.0 / self.theta ** exps).to(device)

    def forward(self, x: Tensor, st: StreamState | None = None) -> Tensor:  # [B, T, latent]
        x = self.input_proj(x)  # [B, T, H]
        start = st.pos if st is not None else torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        qpos = start[:, None] + torch.arange(x.shape[1], device=x.device)  # [B, T]
        ang = qpos[..., None].float() * self.inv_freq.float()  # [B, T, D/2]
        ang = torch.cat((ang, ang), dim=-1)[:, None]  # [B, 1, T, D]
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, qpos, st)
        return self.output_proj(self.norm(x))


class Codebook(nn.Module):
    """EMA codebook: entry = embedding_sum / max(cluster_usage, eps)."""

    def __init__(self, size: int, dim: int, eps: float = 1e-5):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))
        self.eps = eps

    def forward(self, codes: Tensor) -> Tensor:  # [B, T] -> [B, T, D]
        return F.embedding(codes, self.embedding_sum / self.cluster_usage.clamp(min=self.eps)[:, None])


def _holder(**children: nn.Module) -> nn.Module:
    """A bare module that only carries children (keeps the reference parameter names)."""
    m = nn.Module()
    for name, child in children.items():
        m.add_module(name, child)
    return m


class ResidualVQ(nn.Module):
    """Sum of the codebook vectors of `n` quantizers, projected by a 1x1 conv (input_proj unused)."""

    def __init__(self, n: int, size: int, dim: int, io_dim: int):
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = _holder(layers=nn.ModuleList(_holder(_codebook=Codebook(size, dim)) for _ in range(n)))

    def forward(self, codes: Tensor) -> Tensor:  # [B, K, T] -> [B, io_dim, T]
        acc = self.vq.layers[0]._codebook(codes[:, 0])
        for k in range(1, codes.shape[1]):
            acc = acc + self.vq.layers[k]._codebook(codes[:, k])
        return self.output_proj(acc.transpose(1, 2))


def check_codes(codes: Tensor, size: int) -> None:
    """Debug guard ($TTS_APPLIANCE_CHECK_CODES=1; the tests turn it on): raise when a code outside [0, size)
    is about to be looked up, naming the ids, instead of an opaque index error (CPU) or a device assert that
    ends the process (CUDA). It reads the codes back (a host sync), so it is skipped where that cannot
    happen: inside a CUDA graph capture, torch.compile tracing and ONNX export (and on other accelerators)."""
    dev = codes.device.type
    if (torch.compiler.is_compiling() or torch.jit.is_tracing() or dev not in ("cpu", "cuda")
            or (dev == "cuda" and torch.cuda.is_current_stream_capturing())):
        return
    bad = (codes < 0) | (codes >= size)  # [B, K, T]
    if bool(bad.any()):
        rows = sorted(set(bad.nonzero()[:, 0].tolist()))
        raise ValueError(f"codes out of range reached the codec: {sorted(set(codes[bad].tolist()))[:8]} in rows "
                         f"{rows[:8]}, but its codebooks hold {size} codes (0..{size - 1}); control ids such as EOS "
                         "or frames past a row's valid count must never be decoded (a bug: please report it)")


class SplitResidualVQ(nn.Module):
    def __init__(self, c: CodecDecoderConfig):
        super().__init__()
        n_sem, dim = c.num_semantic_quantizers, c.codebook_dim // 2
        self.n_sem, self.size = n_sem, c.codebook_size
        self.rvq_first = ResidualVQ(n_sem, c.codebook_size, dim, c.codebook_dim)
        self.rvq_rest = ResidualVQ(c.num_quantizers - n_sem, c.codebook_size, dim, c.codebook_dim)

    def forward(self, codes: Tensor) -> Tensor:  # [B, K, T] -> [B, codebook_dim, T]
        if CHECK_CODES:
            check_codes(codes, self.size)
        return self.rvq_first(codes[:, :self.n_sem]) + self.rvq_rest(codes[:, self.n_sem:])


class CodecDecoder(nn.Module):
    """Codes [B, num_quantizers, T] (int64) -> waveform [B, 1, T * samples_per_frame] in [-1, 1].

    `forward(codes)` decodes in one shot with full left context. `forward(codes, st)` continues the
    streams held in `st` (see engines.codec.streaming). `chunked_decode` reproduces the
    reference tokenizer's decode (chunks of 300 frames, each re-decoded with 25 frames of context).
    """

    def __init__(self, config: CodecDecoderConfig):
        super().__init__()
        c = self.config = config
        self.samples_per_frame = math.prod(c.upsample_rates) * math.prod(c.upsampling_ratios)
        self.pre_transformer = PreTransformer(c)
        self.quantizer = SplitResidualVQ(c)
        self.pre_conv = CausalConv1d(c.codebook_dim, c.latent_dim, 3)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv1d(c.latent_dim, c.latent_dim, r, r), ConvNeXtBlock(c.latent_dim)])
            for r in c.upsampling_ratios)
        dims = [c.decoder_dim // 2 ** i for i in range(len(c.upsample_rates) + 1)]
        self.decoder = nn.ModuleList([
            CausalConv1d(c.latent_dim, c.decoder_dim, 7),
            *(DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(c.upsample_rates)),
            SnakeBeta(dims[-1]), CausalConv1d(dims[-1], 1, 7)])
        for name, m in self.named_modules():
            m.key = name  # names the stream-state buffers of stateful layers

    def stream_state_shapes(self, batch: int) -> dict:
        """{buffer name: shape} of all left-context buffers a stream of `batch` rows needs."""
        return {m.key + k: s for m in self.modules() if hasattr(m, "state_shapes")
                for k, s in m.state_shapes(batch).items()}

    def forward(self, codes: Tensor, st: StreamState | None = None, fast: bool = False) -> Tensor:
        """`fast`: the upsampling stack runs channels-last and fused (engines.codec.fast, `fast_stack()`);
        the same math up to rounding."""
        if codes.dim() != 3 or codes.shape[1] != self.config.num_quantizers:
            raise ValueError(f"codes must be [B, {self.config.num_quantizers}, T], got {tuple(codes.shape)}")
        if st is not None:
            st.rate = 1
        x = self.pre_conv(self.quantizer(codes), st)  # [B, latent, T]
        x = self.pre_transformer(x.transpose(1, 2), st).transpose(1, 2)  # [B, latent, T]
        for trans, block in self.upsample:
            x = block(trans(x, st), st)  # [B, latent, T * r]
        if fast:
            x = self.fast_stack()(x, st)
        else:
            for m in self.decoder:
                x = m(x, st)
        return x.clamp(min=-1, max=1)  # [B, 1, T * samples_per_frame]

    def fast_stack(self):
        """The channels-last fused upsampling stack for this decoder's device and dtype (built once)."""
        from engines.codec.fast import FastStack

        p = next(self.parameters())
        stack = self.__dict__.get("_fast")
        if stack is None or stack.device != p.device or stack.dtype != p.dtype:
            stack = self.__dict__["_fast"] = FastStack(self)
        return stack

    def chunked_decode(self, codes: Tensor, chunk_size: int = 300, left_context_size: int = 25) -> Tensor:
        """Decode `chunk_size` frames at a time, each with up to `left_context_size` frames of context."""
        out, t = [], codes.shape[-1]
        for start in range(0, t, chunk_size):
            ctx = left_context_size if start > left_context_size else start
            wav = self(codes[..., start - ctx:min(start + chunk_size, t)])
            out.append(wav[..., ctx * self.samples_per_frame:])
        return torch.cat(out, dim=-1)

    def decode(self, codes: Tensor) -> list[Tensor]:
        """Reference tokenizer `decode`: codes [B, T, K] padded with -1 -> per-row 1-D waveforms."""
        lengths = (codes[..., 0] > -1).sum(1) * self.samples_per_frame
        wav = self.chunked_decode(codes.clamp(min=0).transpose(1, 2))[:, 0]  # [B, T * spf]
        return [w[:n] for w, n in zip(wav, lengths.tolist())]


def load_codec_decoder(speech_tokenizer_dir: str | Path, device: str | torch.device = "cpu",
                       dtype: torch.dtype = torch.float32) -> CodecDecoder:
    """Build a CodecDecoder from `speech_tokenizer/{config.json, model.safetensors}` (decoder.* keys).

    Tensors are read straight to `device` and floating ones cast to `dtype`; loading is strict and
    raises CheckpointError naming the file and the missing / unexpected keys.
    """
    from safetensors import safe_open

    folder = Path(speech_tokenizer_dir)
    cfg = CodecConfig.from_dir(folder).decoder
    path = folder / "model.safetensors"
    if not path.is_file():
        raise CheckpointError(f"missing checkpoint file: {path}")
    dev = torch.device(device)
    try:
        with safe_open(str(path), framework="pt", device=str(dev)) as f:
            sd = {k[len("decoder."):]: f.get_tensor(k) for k in f.keys() if k.startswith("decoder.")}
    except Exception as exc:  # safetensors raises its own error types for truncated / bad headers
        raise CheckpointError(f"corrupt checkpoint file {path}: {exc}") from exc
    sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
    with torch.device("meta"):
        model = CodecDecoder(cfg)
    want = set(model.state_dict())
    missing, unexpected = sorted(want - set(sd)), sorted(set(sd) - want)
    if missing or unexpected:
        raise CheckpointError(f"{path}: codec decoder weights do not match the config; "
                              f"missing keys: {['decoder.' + k for k in missing][:20]}, "
                              f"unexpected keys: {['decoder.' + k for k in unexpected][:20]}")
    bad = [k for k, v in model.state_dict().items() if v.shape != sd[k].shape]
    if bad:
        raise CheckpointError(f"{path}: wrong shapes for {', '.join('decoder.' + k for k in bad[:20])}")
    model.load_state_dict(sd, strict=True, assign=True)
    model.pre_transformer.inv_freq = model.pre_transformer.rope_inv_freq(dev)
    log.info("loaded codec decoder from %s (%d tensors, %s, %s)", path, len(sd), dev, dtype)
    return model.eval().requires_grad_(False)
