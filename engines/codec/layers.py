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


# CPU, eager: a convolution over at most this many output columns (rows x samples) runs as one matmul over its
# taps, a 1x1 convolution always. Few columns make a call bound by reading the weights, which oneDNN's
# convolutions (and torch's own path for one small row) do 1.2-2.5x slower than a matmul; many columns are
# compute-bound, where oneDNN's k=7 convolutions are faster; torch runs 1x1 ones through an unfold copy
# (docs/PERFORMANCE.md, "the codec on the CPU").
MATMUL_COLUMNS = 128
MATMUL_TRANSPOSED_CHANNELS = 512  # transposed convs this wide run as a matmul at any size (3-4x at 1536 -> 768)


def cpu_matmul(x: Tensor) -> bool:
    """Whether a layer may run its convolution as a matmul (`conv_matmul`): CPU inference in float32 or bfloat16,
    not traced."""
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) and eager(x)


def conv_matmul(x: Tensor, conv: nn.Conv1d) -> Tensor:
    """`conv(x)` (stride 1, no padding, one group) as one matmul over the dilated taps: x [B, C, T] -> [B, O, n]
    (a 1x1 conv: the matmul itself, no copy of x)."""
    o, c, k = conv.weight.shape
    d, n = conv.dilation[0], x.shape[-1] - (k - 1) * conv.dilation[0]
    if k == 1:
        y = torch.matmul(conv.weight[:, :, 0], x)  # [B, O, T]
    else:
        cols = torch.stack([x[:, :, i * d:i * d + n] for i in range(k)], dim=2)  # [B, C, K, n]
        y = torch.matmul(conv.weight.reshape(o, c * k), cols.reshape(x.shape[0], c * k, n))  # [B, O, n]
    return y if conv.bias is None else y.add_(conv.bias[:, None])


def transposed_matmul(x: Tensor, conv: nn.ConvTranspose1d, first: int, n: int) -> Tensor:
    """Output blocks [first, first + n) of `conv(x)` (kernel m x stride r, no padding) as one matmul and m shifted
    sums: x [B, C, T] -> [B, O, n * r]. Block u of the output is sum_i x[u - i] @ W[:, :, i*r:(i+1)*r]."""
    c, o, k = conv.weight.shape
    r = conv.stride[0]
    m, b, t = k // r, x.shape[0], x.shape[-1]
    z = torch.mm(x.transpose(1, 2).reshape(b * t, c), conv.weight.reshape(c, o * k)).view(b, t, o, m, r)  # one mm
    z = F.pad(z, (0, 0, 0, 0, 0, 0, m - 1, m))  # [B, m-1 + T + m, O, m, r]: blocks past either end add nothing
    out = z[:, first + m - 1:first + m - 1 + n, :, 0]  # [B, n, O, r]
    for i in range(1, m):
        out = out + z[:, first + m - 1 - i:first + m - 1 - i + n, :, i]
    out = out.permute(0, 2, 1, 3).reshape(b, o, n * r)
    return out if conv.bias is None else out.add_(conv.bias[:, None])


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
        if self.conv.groups == 1 and cpu_matmul(x) and (self.context == 0 or x.shape[0] * (x.shape[-1] - self.context)
                                                         <= MATMUL_COLUMNS):  # (1x1: always a matmul)
            return conv_matmul(x, self.conv)
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
        kernel = self.conv.kernel_size[0]
        if (cpu_matmul(x) and self.conv.in_channels >= MATMUL_TRANSPOSED_CHANNELS and kernel % self.stride == 0
                and self.conv.padding[0] == 0 and self.conv.output_padding[0] == 0):
            return transposed_matmul(x, self.conv, skip // self.stride, n_out // self.stride)
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
