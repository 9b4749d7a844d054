"""The codec's stream state: the left context of every stateful decoder layer, one row per stream.

The layers (engines.codec.layers, engines.codec.decoder) and the fast stack (engines.codec.fast) read and
write it by the layer's name; engines.codec.streaming decodes streams with it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class StreamState:
    """Left-context buffers of every stateful layer, one row per stream (batch row).

    `bufs` maps a module's qualified name to its buffer (or `name.k` / `name.v` for attention);
    `pos` [B] counts frames already decoded per row. `n_valid` [B] (optional, set per step) says how
    many of the step's frames are real for each row; `rate` is the running upsampling factor
    (samples per code frame at the current layer) and is managed by the decoder.
    """

    bufs: dict
    pos: Tensor
    n_valid: Tensor | None = None
    rate: int = 1

    def roll(self, key: str, x: Tensor, dim: int = -1) -> Tensor:
        """Return cat(saved, x) along `dim`; save its last P valid entries back in place."""
        buf = self.bufs[key]
        xc = torch.cat([buf, x], dim)
        buf.copy_(self.tail(xc, buf.shape[dim], dim))
        return xc

    def tail(self, xc: Tensor, p: int, dim: int = -1, rate: int | None = None) -> Tensor:
        """The last `p` valid entries of each row of `xc` (= saved context + new input) along `dim`: with
        `n_valid`, row r's input ends after n_valid[r] * rate of them (`rate`: the current one by default)."""
        if self.n_valid is None:
            return xc.narrow(dim, xc.shape[dim] - p, p)
        xm = xc.movedim(dim, -1)  # per-row end: n_valid * rate frames of x are real
        idx = (self.n_valid * (self.rate if rate is None else rate))[:, None] + torch.arange(p, device=xc.device)
        idx = idx.view(idx.shape[0], *([1] * (xm.dim() - 2)), p).expand(*xm.shape[:-1], p)  # [B, ..., P]
        return xm.gather(-1, idx).movedim(-1, dim)

    def reset(self, rows: Tensor | None = None) -> None:
        """Zero the state of all rows, or of the rows where bool mask `rows` [B] is True (a mask on the host:
        one multi-tensor launch over just those rows; on the device: a masked fill of every buffer)."""
        if rows is None:
            for b in self.bufs.values():
                b.zero_()
            self.pos.zero_()
            return
        if rows.device.type == "cpu":
            idx = rows.nonzero().flatten().tolist()
            torch._foreach_zero_([b[i] for b in (*self.bufs.values(), self.pos) for i in idx])
            return
        for b in self.bufs.values():
            b.masked_fill_(rows.view(-1, *([1] * (b.dim() - 1))), 0)
        self.pos.masked_fill_(rows, 0)
