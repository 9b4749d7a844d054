"""Speaker encoder of the Qwen3-TTS Base models: ECAPA-TDNN x-vector from a 128-bin log-mel.

`mel_spectrogram` reproduces the official feature (Slaney mel filterbank built here in numpy, the
same numbers as librosa.filters.mel's defaults; reflect-padded, non-centred STFT; natural-log
compression). Module and parameter names equal the `speaker_encoder.*` keys of `model.safetensors`.
"""
from __future__ import annotations

import functools
import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from engines.model.config import SpeakerEncoderConfig
from engines.model.errors import BadInput, CheckpointError

log = logging.getLogger(__name__)

# Feature settings used by the official `extract_speaker_embedding` (independent of the config).
MEL_ARGS = dict(n_fft=1024, num_mels=128, sampling_rate=24000, hop_size=256, win_size=1024, fmin=0, fmax=12000)


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    f_sp, min_log_mel, logstep = 200.0 / 3, 1000.0 / (200.0 / 3), np.log(6.4) / 27.0
    mel = hz / f_sp
    high = hz >= 1000.0
    mel[high] = min_log_mel + np.log(hz[high] / 1000.0) / logstep
    return mel


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    f_sp, min_log_mel, logstep = 200.0 / 3, 1000.0 / (200.0 / 3), np.log(6.4) / 27.0
    hz = f_sp * mel
    high = mel >= min_log_mel
    hz[high] = 1000.0 * np.exp(logstep * (mel[high] - min_log_mel))
    return hz


@functools.lru_cache(maxsize=8)
def mel_filterbank(sr: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None) -> np.ndarray:
    """Slaney-normalised triangular mel filters [n_mels, n_fft // 2 + 1] float32 (librosa defaults)."""
    fmax = sr / 2.0 if fmax is None else fmax
    fft_hz = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)  # [n_fft/2 + 1]
    lo, hi = _hz_to_mel(np.array([fmin, fmax], dtype=np.float64))
    edges = _mel_to_hz(np.linspace(lo, hi, n_mels + 2))  # [n_mels + 2] filter corners in Hz
    widths = np.diff(edges)
    dist = edges[:, None] - fft_hz[None, :]  # [n_mels + 2, n_freq]
    fb = np.zeros((n_mels, fft_hz.size), dtype=np.float32)
    for i in range(n_mels):
        rising, falling = -dist[i] / widths[i], dist[i + 2] / widths[i + 1]
        fb[i] = np.maximum(0, np.minimum(rising, falling))
    fb *= (2.0 / (edges[2:] - edges[:-2]))[:, None]  # equal-area (Slaney) normalisation
    fb.setflags(write=False)
    return fb


def mel_spectrogram(wav: torch.Tensor, n_fft: int = 1024, num_mels: int = 128, sampling_rate: int = 24000,
                    hop_size: int = 256, win_size: int = 1024, fmin: float = 0, fmax: float | None = 12000,
                    center: bool = False) -> torch.Tensor:
    """Log-mel spectrogram [B, num_mels, frames] of waveforms [B, S] (frames = S // hop_size for these settings)."""
    if wav.dim() == 1:
        wav = wav[None]
    lo, hi = float(wav.min()), float(wav.max())
    if lo < -1.0 or hi > 1.0:
        log.warning("waveform outside [-1, 1] (min %.3f, max %.3f)", lo, hi)
    basis = torch.from_numpy(mel_filterbank(sampling_rate, n_fft, num_mels, fmin, fmax).copy()).to(wav.device, wav.dtype)
    window = torch.hann_window(win_size, device=wav.device, dtype=wav.dtype)
    pad = (n_fft - hop_size) // 2
    wav = F.pad(wav[:, None], (pad, pad), mode="reflect")[:, 0]  # [B, S + 2 * pad]
    spec = torch.stft(wav, n_fft, hop_length=hop_size, win_length=win_size, window=window, center=center,
                      normalized=False, onesided=True, return_complex=True)  # [B, n_freq, frames]
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(torch.matmul(basis, mag), min=1e-5))


def _conv(cin: int, cout: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TDNN(nn.Module):
    """Conv1d ('same' length, reflect padding) + ReLU."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int):
        super().__init__()
        self.conv = _conv(cin, cout, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        return F.relu(self.conv(x))


class Res2Net(nn.Module):
    """Split channels into `scale` groups; group i>0 goes through its TDNN after adding group i-1's output."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(TDNN(channels // scale, channels // scale, kernel, dilation)
                                    for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        outs = []
        for i, part in enumerate(torch.chunk(x, self.scale, dim=1)):
            if i >= 1:
                part = self.blocks[i - 1](part if i == 1 else part + outs[-1])
            outs.append(part)
        return torch.cat(outs, dim=1)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, se_channels: int):
        super().__init__()
        self.conv1, self.conv2 = _conv(channels, se_channels), _conv(se_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        gate = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))  # [B, C, 1]
        return x * gate


class SERes2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, se_channels: int, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = TDNN(cin, cout, 1, 1)
        self.res2net_block = Res2Net(cout, scale, kernel, dilation)
        self.tdnn2 = TDNN(cout, cout, 1, 1)
        self.se_block = SqueezeExcite(cout, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


def _stats(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-12) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted mean and std over time; w sums to 1 along dim 2."""
    mean = (w * x).sum(2)  # [B, C]
    std = torch.sqrt((w * (x - mean[:, :, None]).pow(2)).sum(2).clamp(eps))
    return mean, std


class AttentiveStatsPool(nn.Module):
    """Channel-wise attention over time, conditioned on global mean/std; returns [B, 2C, 1]."""

    def __init__(self, channels: int, attention_channels: int):
        super().__init__()
        self.tdnn = TDNN(channels * 3, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        t = x.shape[-1]
        uniform = torch.full((x.shape[0], 1, t), 1.0 / t, dtype=x.dtype, device=x.device)
        mean, std = _stats(x, uniform)
        ctx = torch.cat([x, mean[:, :, None].expand(-1, -1, t), std[:, :, None].expand(-1, -1, t)], dim=1)
        attn = torch.softmax(self.conv(torch.tanh(self.tdnn(ctx))), dim=2)  # [B, C, T]
        mean, std = _stats(x, attn)
        return torch.cat([mean, std], dim=1)[:, :, None]


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN: mels [B, T, mel_dim] -> x-vector [B, enc_dim]."""

    def __init__(self, cfg: SpeakerEncoderConfig):
        super().__init__()
        ch, ks, dil = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        if not len(ch) == len(ks) == len(dil):
            raise CheckpointError("speaker encoder: enc_channels, enc_kernel_sizes, enc_dilations differ in length")
        self.cfg = cfg
        self.blocks = nn.ModuleList([TDNN(cfg.mel_dim, ch[0], ks[0], dil[0])])
        for i in range(1, len(ch) - 1):
            self.blocks.append(SERes2NetBlock(ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], dil[i]))
        self.mfa = TDNN(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatsPool(ch[-1], cfg.enc_attention_channels)
        self.fc = _conv(ch[-1] * 2, cfg.enc_dim)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:  # [B, T, mel_dim] -> [B, enc_dim]
        x = mels.transpose(1, 2)  # [B, mel_dim, T]
        feats = []
        for block in self.blocks:
            x = block(x)
            feats.append(x)
        x = self.mfa(torch.cat(feats[1:], dim=1))  # [B, C_last, T]
        return self.fc(self.asp(x))[:, :, 0]

    @torch.inference_mode()
    def extract_speaker_embedding(self, wav24k: np.ndarray | torch.Tensor) -> torch.Tensor:
        """x-vector [enc_dim] of one mono 24 kHz waveform (float in [-1, 1])."""
        wav = torch.as_tensor(np.asarray(wav24k, dtype=np.float32)).reshape(1, -1)
        if wav.shape[-1] <= MEL_ARGS["n_fft"]:
            raise BadInput(f"reference audio too short for the speaker encoder: {wav.shape[-1]} samples at "
                           f"24 kHz; use at least a second of speech")
        mels = mel_spectrogram(wav, **MEL_ARGS).transpose(1, 2)  # [1, frames, 128]
        p = next(self.parameters())
        return self(mels.to(device=p.device, dtype=p.dtype))[0]


def load_speaker_encoder(path: str | Path, device: str | torch.device = "cpu",
                         dtype: torch.dtype = torch.float32, cfg: SpeakerEncoderConfig | None = None) -> SpeakerEncoder:
    """Build the speaker encoder from a checkpoint folder (config.json + model.safetensors `speaker_encoder.*`)."""
    from safetensors import safe_open

    from engines.model.config import ModelConfig

    path = Path(path)
    cfg = cfg or ModelConfig.from_dir(path).speaker_encoder
    wfiles = sorted(path.glob("model*.safetensors"))
    if not wfiles:
        raise CheckpointError(f"missing checkpoint file: {path / 'model.safetensors'}")
    state = {}
    for wfile in wfiles:  # the speaker encoder may sit in any shard
        try:
            with safe_open(str(wfile), framework="pt", device="cpu") as f:
                for key in f.keys():
                    if key.startswith("speaker_encoder."):
                        state[key[len("speaker_encoder."):]] = f.get_tensor(key)
        except Exception as exc:
            raise CheckpointError(f"corrupt checkpoint file {wfile}: {exc}") from exc
    if not state:
        raise CheckpointError(f"{path}: no speaker_encoder.* weights (only Base checkpoints can clone voices)")
    model = SpeakerEncoder(cfg)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{path}: speaker encoder weights do not match its config: {exc}") from exc
    return model.to(device=device, dtype=dtype).eval()
