"""Device-resident decode state: every per-request value of the slots as device tensors.

One decode step (engines.runtime.decode_step.FastStep) = sample codebook 0 from the talker state + 15
code-predictor steps + next input embedding + one talker step, for rows [0, B) of this table. No host
synchronisation happens inside, so the step can be captured as one device graph per (batch bucket B,
cache-length bucket L) and replayed.

Per-row semantics equal `engines.model.generate.generate` (the reference): a row whose sampled
codebook 0 is EOS, or that reaches its frame limit, is done and emits nothing from then on.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from engines.model.sampling import SamplingParams
from engines.model.prompt import Prompt


@dataclass
class SlotTable:
    """Every per-request value of N slots, as device tensors (row i = slot i)."""

    hidden: torch.Tensor  # [N, H] talker state after the last step
    pos: torch.Tensor  # [N] next cache position (= tokens in the cache)
    gen_step: torch.Tensor  # [N] frames sampled so far
    seed: torch.Tensor  # [N]
    penalty: torch.Tensor  # [N] repetition penalty
    min_new: torch.Tensor  # [N]
    limit: torch.Tensor  # [N] max_new_tokens (runaway guard: enforced whatever EOS does)
    seen: torch.Tensor  # [N, V] bool: codebook-0 ids generated so far
    done: torch.Tensor  # [N] bool
    eos: torch.Tensor  # [N] bool
    trailing: torch.Tensor  # [N, Tmax, H] text rows still to feed
    trailing_len: torch.Tensor  # [N]
    text_open: torch.Tensor  # [N] bool: more text may come (engines.runtime.text_feed)
    hold: torch.Tensor  # [N] bool out: the row waited for text this step (made no frame, state unchanged)
    codes: torch.Tensor  # [N, 16] out: this step's frame
    emit: torch.Tensor  # [N] bool out: the frame is real
    bad: torch.Tensor  # [N] bool out: an emitted code is out of the codebook's range (internal check)
    frame_row: torch.Tensor  # [N] FrameStore row the step writes the frame to (the scratch row when free)
    n_frames: torch.Tensor  # [N] frames in that row (reference codes included): where the next one goes
    m_do: torch.Tensor
    m_temp: torch.Tensor
    m_topk: torch.Tensor
    m_topp: torch.Tensor
    s_do: torch.Tensor
    s_temp: torch.Tensor
    s_topk: torch.Tensor
    s_topp: torch.Tensor

    @staticmethod
    def allocate(n: int, hidden: int, vocab: int, groups: int, max_text: int, device, dtype) -> "SlotTable":
        z = dict(device=device)
        i64 = lambda: torch.zeros(n, dtype=torch.long, **z)  # noqa: E731
        f32 = lambda: torch.ones(n, dtype=torch.float32, **z)  # noqa: E731
        b = lambda: torch.zeros(n, dtype=torch.bool, **z)  # noqa: E731
        return SlotTable(hidden=torch.zeros(n, hidden, dtype=dtype, **z), pos=i64(), gen_step=i64(), seed=i64(),
                         penalty=f32(), min_new=i64(), limit=i64(), seen=torch.zeros(n, vocab, dtype=torch.bool, **z),
                         done=torch.ones(n, dtype=torch.bool, **z), eos=b(),
                         trailing=torch.zeros(n, max_text, hidden, dtype=dtype, **z), trailing_len=i64(),
                         text_open=b(), hold=b(),
                         codes=torch.zeros(n, groups, dtype=torch.long, **z), emit=b(), bad=b(),
                         frame_row=i64(), n_frames=i64(),
                         m_do=b(), m_temp=f32(), m_topk=i64(), m_topp=f32(),
                         s_do=b(), s_temp=f32(), s_topk=i64(), s_topp=f32())

    def rows(self, b: int) -> "SlotTable":
        """Views of slots [0, b)."""
        return SlotTable(**{f.name: getattr(self, f.name)[:b] for f in fields(self)})

    def move(self, src: int, dst: int) -> None:
        """Copy slot `src` into slot `dst` (compaction when a request leaves; one multi-tensor launch)."""
        ts = [getattr(self, f.name) for f in fields(self)]
        torch._foreach_copy_([t[dst] for t in ts], [t[src] for t in ts])

    # per-slot writes use fill_ with a Python scalar: `t[slot] = scalar` copies a host scalar to the device with
    # a stream sync, which would make the loop wait for the decode step in flight at every admission and exit

    def free(self, slot: int, trash_row: int) -> None:
        """Slot `slot` holds no request: done, a finite state, its frame writes go to the scratch row."""
        torch._foreach_zero_([t[slot] for t in (self.emit, self.text_open, self.hold, self.hidden, self.n_frames)])
        self.done[slot].fill_(True)
        self.frame_row[slot].fill_(trash_row)

    def load(self, slot: int, prompt: Prompt, hidden: torch.Tensor, r: SamplingParams, frame_row: int,
             n_ref: int, text_open: bool = False) -> None:
        """Set slot `slot` for a request whose prompt has just been prefilled; its frames go to FrameStore
        row `frame_row` after its `n_ref` reference frames. `text_open`: its text is still arriving
        (`append_text` adds rows; the row is held while it has used them all)."""
        n = prompt.trailing.shape[0]
        if n > self.trailing.shape[1]:
            raise ValueError(f"text too long for one request: {n} rows > {self.trailing.shape[1]}")
        self.hidden[slot] = hidden
        self.pos[slot].fill_(prompt.prefill.shape[0])
        self.trailing[slot, :n] = prompt.trailing
        self.trailing_len[slot].fill_(n)
        self.text_open[slot].fill_(text_open)
        self.hold[slot].fill_(False)
        self.gen_step[slot].fill_(0)
        self.seen[slot].fill_(False)
        self.done[slot].fill_(False)
        self.eos[slot].fill_(False)
        self.emit[slot].fill_(False)
        self.frame_row[slot].fill_(frame_row)
        self.n_frames[slot].fill_(n_ref)
        for name, value in (("seed", r.seed & 0xFFFFFFFF), ("penalty", r.repetition_penalty),
                            ("min_new", r.min_new_tokens), ("limit", r.max_new_tokens),
                            ("m_do", r.do_sample), ("m_temp", max(r.temperature, 1e-5)), ("m_topk", r.top_k),
                            ("m_topp", r.top_p), ("s_do", r.subtalker_dosample),
                            ("s_temp", max(r.subtalker_temperature, 1e-5)), ("s_topk", r.subtalker_top_k),
                            ("s_topp", r.subtalker_top_p)):
            getattr(self, name)[slot].fill_(value)

    def append_text(self, slot: int, start: int, rows: torch.Tensor, end: bool) -> None:
        """Text rows `[k, H]` for slot `slot` from trailing row `start` on; `end`: no more will come."""
        k = rows.shape[0]
        if start + k > self.trailing.shape[1]:
            raise ValueError(f"text too long for one request: {start + k} rows > {self.trailing.shape[1]}")
        if k:
            self.trailing[slot, start:start + k] = rows
            self.trailing_len[slot].fill_(start + k)
        if end:
            self.text_open[slot].fill_(False)
