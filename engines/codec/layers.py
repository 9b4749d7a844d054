"""The codec decoder's convolutional building blocks: causal convs, the upsampling transposed conv,
SnakeBeta, ConvNeXt blocks, residual units and the upsampling blocks made of them.

`engines.codec.decoder` assembles them into the CodecDecoder; `engines.codec.fast` runs the same upsampling
stack channels-last and fused, from these modules' parameters. Every stateful layer can also run in
streaming mode: given a stream state `st` (engines.codec.state.StreamState; `st.roll(key, x)` prepends the
layer's saved left context and stores the new one) it continues where the previous call stopped. `key` is
the layer's qualified name in the decoder (set by CodecDecoder), naming its state buffer.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:  # the runtime owns the state object; layers only call st.roll / st.rate
    from engines.codec.state import StreamState


def eager(x: Tensor) -> bool:
    """Whether the layers may write their own temporaries in place: inference outside any trace (ONNX export,
    torch.compile) and without autograd; elsewhere they keep the out-of-place form those handle best."""
    return not (x.requires_grad or torch.jit.is_tracing() or torch.compiler.is_compiling())


class CausalConv1d(nn.Module):
    """Stride-1 conv padded on the left by (kernel-1)*dilation zeros (or by streamed context)."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.context = (kernel - 1) * dilation

    def state_shapes(self, batch: int) -> dict:
        return {"": (batch, self.conv.in_channels, self.context)} if self.context else {}

    def forward(self, x: Tensor, st: StreamState | None = None) -> Tensor:  # [B, C, T] -> [B, C', T]
        if self.context:
            x = F.pad(x, (self.context, 0)) if st is None else st.roll(self.key, x)
        return self.conv(x)


class CausalTransConv1d(nn.Module):
    """Transposed conv keeping exactly T*stride outputs; streams keep ceil(k/s)-1 input frames."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.stride, self.context = stride, math.ceil(kernel / stride) - 1

    def state_shapes(self, batch: int) -> dict:
        return {"": (batch, self.conv.in_channels, self.context)} if self.context else {}

    def forward(self, x: Tensor, st: StreamState | None = None) -> Tensor:  # [B, C, T] -> [B, C', T*s]
        n_out = x.shape[-1] * self.stride
        skip = 0
        if self.context and st is not None:
            x, skip = st.roll(self.key, x), self.context * self.stride
        if st is not None:
            st.rate *= self.stride
        return self.conv(x)[..., skip:skip + n_out]


class SnakeBeta(nn.Module):
    """x + sin^2(x * e^alpha) / (e^beta + 1e-9), per channel."""

    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor, st: StreamState | None = None) -> Tensor:  # [B, C, T]
        alpha, beta = self.alpha[None, :, None].exp(), self.beta[None, :, None].exp()
        inv_beta = 1.0 / (beta + 1e-9)
        if not eager(x):
            return x + inv_beta * torch.sin(x * alpha).pow(2)
        t = torch.mul(x, alpha)  # the same math in one temporary written in place, not a new tensor per op
        t.sin_()  # (the codec's largest tensors; on the CPU x1.03 for a call of 8 rows x 8 frames)
        t.mul_(t)
        return torch.addcmul(x, t, inv_beta, out=t)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1, self.pwconv2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: Tensor, st: StreamState | None = None) -> Tensor:  # [B, C, T]
        h = self.dwconv(x, st).transpose(1, 2)  # [B, T, C]
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1, self.act2 = SnakeBeta(dim), SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: Tensor, st: StreamState | None = None) -> Tensor:
        h = self.conv2(self.act2(self.conv1(self.act1(x), st)))
        return h.add_(x) if eager(x) else x + h


class DecoderBlock(nn.Module):
    """SnakeBeta, upsampling transposed conv (kernel 2r, stride r), residual units of dilation 1/3/9."""

    def __init__(self, cin: int, cout: int, rate: int):
        super().__init__()
        self.block = nn.ModuleList([SnakeBeta(cin), CausalTransConv1d(cin, cout, 2 * rate, rate),
                                    *(ResidualUnit(cout, d) for d in (1, 3, 9))])

    def forward(self, x: Tensor, st: StreamState | None = None) -> Tensor:
        for m in self.block:
            x = m(x, st)
        return x
