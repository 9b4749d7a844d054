"""The codec decoder's upsampling stack (decoder[0] .. the output conv) in channels-last layout, fused.

The four SnakeBeta upsampling blocks do nearly all of the codec's arithmetic, at 400 Hz to 24 kHz.
Run as written in `engines.codec.layers` ([B, C, T] tensors, one op at a time) their convolutions
pay layout transposes around every cuDNN call and their elementwise work (SnakeBeta's exp / mul / sin /
pow / add, residual adds, state concatenations) reads and writes the largest tensors ~25 times per
residual unit: measured on an H100, ~80% of a batch codec call went there (benchmarks/codec_profile.py).

Here the same math runs on [B, T, C] tensors:
- every convolution is a cuDNN conv2d on a channels-last view (no transposes); a dilated one runs
  "polyphase": [B, T, C] viewed as [B, C, T/d, d], a (k, 1) kernel without dilation (cuDNN picks a slow
  kernel for some dilated shapes);
- the transposed (upsampling) convs are two GEMMs over the padded input (kernel 2r, stride r: output
  sample q*r + j = x[q] W_j + x[q-1] W_{j+r});
- each conv's bias, the residual add and the next SnakeBeta run in ONE elementwise pass (`epilogue`, a
  Triton kernel on CUDA, the same math in torch elsewhere), which writes the next conv's input straight
  into its padded buffer, behind the left context taken from the stream state.

Stream state is the decoder's own (`StreamState` buffers [B, C, P] keyed by module name, `n_valid`,
`rate`), so streams move between this path and the reference one freely. Outputs equal the reference
up to rounding (fp32: summation order only; bf16: the epilogue computes in fp32 and rounds once).
"""
from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from engines.codec.layers import DecoderBlock, ResidualUnit, SnakeBeta

if TYPE_CHECKING:
    from engines.codec.state import StreamState

log = logging.getLogger(__name__)

try:  # Triton: the fused epilogue on NVIDIA GPUs
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the torch epilogue
    triton = None

if triton is not None:
    @triton.jit
    def _epilogue_kernel(src, src_bs, bias, res, res_bs, alpha, inv_beta, y, y_bs, s, s_bs, n, C,
                         HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, WRITE_Y: tl.constexpr,
                         WRITE_S: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(1).to(tl.int64)
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        ch = offs % C
        v = tl.load(src + b * src_bs + offs, mask=mask).to(tl.float32)
        if HAS_BIAS:
            v += tl.load(bias + ch, mask=mask).to(tl.float32)
        if HAS_RES:
            v += tl.load(res + b * res_bs + offs, mask=mask).to(tl.float32)
        if WRITE_Y:
            tl.store(y + b * y_bs + offs, v.to(y.dtype.element_ty), mask=mask)
        if WRITE_S:
            a = tl.load(alpha + ch, mask=mask)
            ib = tl.load(inv_beta + ch, mask=mask)
            sn = tl.sin(v * a)
            tl.store(s + b * s_bs + offs, (v + ib * sn * sn).to(s.dtype.element_ty), mask=mask)


def _rows_contiguous(t: Tensor) -> bool:
    """[B, T, C] whose rows are contiguous and packed within each batch entry (any batch stride)."""
    return t.stride(2) == 1 and (t.shape[1] <= 1 or t.stride(1) == t.shape[2])


def epilogue(src: Tensor, bias: Optional[Tensor] = None, res: Optional[Tensor] = None,
             snake: Optional[tuple] = None, y: Optional[Tensor] = None, s: Optional[Tensor] = None) -> None:
    """v = src + bias + res (each optional but src; all [B, T, C] views, bias [C]); write v to `y` and
    SnakeBeta(v) = v + inv_beta * sin(v * alpha)^2 (`snake` = (alpha, inv_beta), fp32 [C]) to `s`.
    Computed in fp32, rounded once to the outputs' dtype."""
    views = [t for t in (src, res, y, s) if t is not None]
    if triton is not None and src.is_cuda and all(_rows_contiguous(t) for t in views):
        b, n, c = src.shape[0], src.shape[1] * src.shape[2], src.shape[2]
        dummy = src
        block = 2048
        alpha, inv_beta = snake if snake is not None else (dummy, dummy)
        _epilogue_kernel[(triton.cdiv(n, block), b)](
            src, src.stride(0), bias if bias is not None else dummy, res if res is not None else dummy,
            res.stride(0) if res is not None else 0, alpha, inv_beta, y if y is not None else dummy,
            y.stride(0) if y is not None else 0, s if s is not None else dummy, s.stride(0) if s is not None else 0,
            n, c, HAS_BIAS=bias is not None, HAS_RES=res is not None, WRITE_Y=y is not None,
            WRITE_S=s is not None, BLOCK=block, num_warps=8)
        return
    v = src.float()
    if bias is not None:
        v = v + bias.float()
    if res is not None:
        v = v + res.float()
    if y is not None:
        y.copy_(v)
    if s is not None:
        alpha, inv_beta = snake
        s.copy_(v + inv_beta * torch.sin(v * alpha).pow(2))


class _Conv:
    """A causal conv (kernel k, dilation d) of the stack, run as a channels-last cuDNN conv2d."""

    def __init__(self, conv: torch.nn.Conv1d, key: str, polyphase: bool = True):
        self.key = key
        self.k, self.d = conv.kernel_size[0], conv.dilation[0]
        self.poly = polyphase and self.d > 1
        self.cin, self.cout = conv.in_channels, conv.out_channels
        self.context = (self.k - 1) * self.d
        w = conv.weight.detach()  # [Cout, Cin, k]
        # polyphase for dilated convs: a (k, 1) kernel over [B, C, T/d, d]; else (1, k) over [B, C, 1, T]
        shape = (self.cout, self.cin, self.k, 1) if self.poly else (self.cout, self.cin, 1, self.k)
        self.w4 = w.reshape(shape).contiguous(memory_format=torch.channels_last)
        self.bias = conv.bias.detach().float() if conv.bias is not None else None

    def padded_len(self, t: int) -> int:
        """Rows of its padded input for t outputs (a multiple of d: the polyphase view needs it)."""
        return self.context + (-(-t // self.d) * self.d if self.poly else t)

    def __call__(self, xp: Tensor) -> Tensor:
        """xp [B, context + T', Cin] contiguous (left context first) -> [B, T', Cout] (a view)."""
        b, tp, cin = xp.shape
        if self.poly:
            x4 = xp.view(b, tp // self.d, self.d, cin).permute(0, 3, 1, 2)  # [B, Cin, T/d, d] channels-last
            y = F.conv2d(x4, self.w4)  # [B, Cout, T'/d, d]
            return y.permute(0, 2, 3, 1).reshape(b, -1, self.cout)
        x4 = xp.permute(0, 2, 1).unsqueeze(2)  # [B, Cin, 1, T] channels-last
        return F.conv2d(x4, self.w4, dilation=(1, self.d)).squeeze(2).permute(0, 2, 1)


def _snake(m) -> tuple[Tensor, Tensor]:
    """(alpha, inv_beta) fp32 [C] of a SnakeBeta module."""
    return m.alpha.detach().float().exp(), 1.0 / (m.beta.detach().float().exp() + 1e-9)


class _Trans:
    """CausalTransConv1d (kernel 2r, stride r) as two GEMMs: out[q*r + j] = x[q] W[:, :, j] + x[q-1] W[:, :, j+r]."""

    def __init__(self, m, key: str):
        conv = m.conv
        self.key, self.r, self.context = key, m.stride, 1  # one input frame of left context
        k = conv.kernel_size[0]
        if k != 2 * self.r or m.context != 1:
            raise ValueError(f"fast codec path: transposed conv kernel {k}, stride {self.r} not supported")
        w = conv.weight.detach()  # [Cin, Cout, 2r]
        self.cin, self.cout = w.shape[0], w.shape[1]
        self.w_cur = w[:, :, :self.r].permute(0, 2, 1).reshape(self.cin, self.r * self.cout).contiguous()
        self.w_prev = w[:, :, self.r:].permute(0, 2, 1).reshape(self.cin, self.r * self.cout).contiguous()
        self.bias = conv.bias.detach().float()

    def padded_len(self, t: int) -> int:
        return self.context + t

    def __call__(self, xp: Tensor) -> Tensor:
        """xp [B, 1 + Q, Cin] contiguous (one frame of left context first) -> [B, Q*r, Cout] (a view, no bias)."""
        b, q1, cin = xp.shape
        flat = xp.reshape(b * q1, cin)
        out = torch.mm(flat[1:], self.w_cur)  # row i = x[i + 1] W_cur (+ x[i] W_prev below): row b*q1 + q
        out.addmm_(flat[:-1], self.w_prev)  # is output frame q of entry b (its last row mixes entries: unused)
        n = self.r * self.cout
        return out.as_strided((b, (q1 - 1) * self.r, self.cout), (q1 * n, self.cout, 1))


class FastStack:
    """decoder[0] .. the output conv of a CodecDecoder (`dec`, engines.codec.decoder), channels-last and
    fused (see the module doc).

    `__call__(x [B, latent, T] at the transformer's output rate, st)` -> wav [B, 1, T * rate] before the
    clamp, as `for m in decoder.decoder: x = m(x, st)` does. Built from the decoder's parameters at
    construction (rebuild after moving or casting the decoder). `polyphase`: dilated convs as undilated
    (k, 1) convs over [B, C, T/d, d] (default; False: cuDNN's dilated conv, for A/B runs)."""

    def __init__(self, dec: torch.nn.Module, polyphase: bool = True):
        mods = list(dec.decoder)
        if not (isinstance(mods[-2], SnakeBeta) and all(isinstance(m, DecoderBlock) for m in mods[1:-2])):
            raise ValueError("fast codec path: unexpected decoder layout")
        p = next(dec.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.conv0 = _Conv(mods[0].conv, mods[0].key)
        self.blocks = []
        for blk in mods[1:-2]:
            snake, trans, *units = blk.block
            assert all(isinstance(u, ResidualUnit) for u in units)
            self.blocks.append((_snake(snake), _Trans(trans, trans.key),
                                [(_Conv(u.conv1.conv, u.conv1.key, polyphase), _snake(u.act1), _snake(u.act2),
                                  u.conv2.conv.weight.detach()[:, :, 0].t().contiguous(),
                                  u.conv2.conv.bias.detach().float()) for u in units]))
        self.final_snake = _snake(mods[-2])
        self.final = _Conv(mods[-1].conv, mods[-1].key)

    # ----- padded inputs with stream state ---------------------------------------------------------------
    def _open(self, layer, b: int, t: int, st) -> Tensor:
        """The padded input of `layer` (a _Conv or _Trans) for t new samples: [B, padded_len(t), Cin], its saved
        left context (zeros without a stream) first, zeros after the t samples the caller writes."""
        c, start = layer.context, layer.context + t
        xp = torch.empty(b, layer.padded_len(t), layer.cin, device=self.device, dtype=self.dtype)
        if st is None:
            xp[:, :c].zero_()
        else:
            xp[:, :c].copy_(st.bufs[layer.key].transpose(1, 2))
        if xp.shape[1] > start:
            xp[:, start:].zero_()
        return xp

    @staticmethod
    def _close(xp: Tensor, layer, t: int, st, rate: int) -> None:
        """Save each row's last valid input samples as `layer`'s new left context (StreamState.tail)."""
        if st is not None:
            c = layer.context
            st.bufs[layer.key].copy_(st.tail(xp[:, :c + t], c, dim=1, rate=rate).transpose(1, 2))

    # ----- the stack -----------------------------------------------------------------------------------
    @torch.no_grad()
    def __call__(self, x: Tensor, st: Optional["StreamState"] = None) -> Tensor:
        if x.device != self.device or x.dtype != self.dtype:
            raise RuntimeError("fast codec path built for another device or dtype: rebuild it")
        b, _, t = x.shape
        rate = st.rate if st is not None else 1
        c0 = self.conv0
        xp = self._open(c0, b, t, st)
        xp[:, c0.context:c0.context + t].copy_(x.transpose(1, 2))
        self._close(xp, c0, t, st, rate)
        h, bias, res = c0(xp)[:, :t], c0.bias, None  # the stack's running value is h + bias + res
        for snake_in, trans, units in self.blocks:
            # block input: SnakeBeta of it into the transposed conv's padded input (one frame of context)
            tp = self._open(trans, b, t, st)
            epilogue(h, bias=bias, res=res, snake=snake_in, s=tp[:, 1:])
            self._close(tp, trans, t, st, rate)
            rate *= trans.r
            t *= trans.r
            x_res = torch.empty(b, t, trans.cout, device=self.device, dtype=self.dtype)
            conv, act1 = units[0][:2]
            xp = self._open(conv, b, t, st)
            epilogue(trans(tp), bias=trans.bias, y=x_res, snake=act1, s=xp[:, conv.context:conv.context + t])
            for j, (conv, act1, act2, w2, b2) in enumerate(units):
                self._close(xp, conv, t, st, rate)
                hc = torch.empty(b, t, trans.cout, device=self.device, dtype=self.dtype)
                epilogue(conv(xp)[:, :t], bias=conv.bias, snake=act2, s=hc)
                g = torch.mm(hc.view(b * t, -1), w2).view(b, t, -1)  # 1x1 conv, bias in the epilogue
                if j + 1 < len(units):  # next unit: its conv's input
                    conv_n, act_n = units[j + 1][:2]
                    xp = self._open(conv_n, b, t, st)
                    y = torch.empty_like(x_res)
                    epilogue(g, bias=b2, res=x_res, y=y, snake=act_n, s=xp[:, conv_n.context:conv_n.context + t])
                    x_res = y
                else:  # the block's output: only the next SnakeBeta of it is needed
                    h, bias, res = g, b2, x_res
        # final SnakeBeta, output conv
        f = self.final
        xp = self._open(f, b, t, st)
        epilogue(h, bias=bias, res=res, snake=self.final_snake, s=xp[:, f.context:f.context + t])
        self._close(xp, f, t, st, rate)
        wav = f(xp)[:, :t].float() + f.bias  # [B, T, 1]
        if st is not None:
            st.rate = rate
        return wav.to(self.dtype).transpose(1, 2)  # [B, 1, T]
