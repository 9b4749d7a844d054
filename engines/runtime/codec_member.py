"""What a codec lane (engines.runtime.codec_lane.CodecLane) keeps: a request's place in it (`Member`) and a
call it launched (`Call`), whose audio is on its way to host memory."""
from __future__ import annotations

from typing import Optional

import numpy as np


class Member:
    """A request's place in a codec lane; its row in the lane moves when others leave."""

    __slots__ = ("frame_row", "n_ref", "emitted", "decoded", "target", "discard", "finished", "dropped", "seq",
                 "codes", "stalled", "heard", "ref_tail", "lead")

    def __init__(self, seq, frame_row: int, n_ref: int, first: int, spf: int):
        self.seq, self.frame_row, self.n_ref = seq, frame_row, n_ref
        self.emitted = n_ref  # frames in the FrameStore row (reference codes first)
        self.decoded = 0
        self.target = first + n_ref
        self.discard = n_ref * spf  # samples of reference audio its chunks drop (its whole result: `_lead`)
        self.finished = False  # no more frames will come
        self.dropped = False  # cancelled: decode nothing more
        self.stalled = False  # its request waits for text: what it has is decoded now, not at the next chunk
        self.heard = False  # a call has made audio of it (reference frames aside)
        self.codes: Optional[np.ndarray] = None  # [frames, K] int64, set when its audio is complete
        self.ref_tail: Optional[np.ndarray] = None  # [1] the last sample of its reference audio (see `_lead`)
        self.lead: Optional[np.ndarray] = None  # audio its whole result starts with, set when it is complete

    @property
    def pending(self) -> int:
        return self.emitted - self.decoded


class Call:
    """A launched lane call: its audio on the way to host memory, and the members it completes."""

    __slots__ = ("event", "wav", "parts", "complete", "codes", "first", "urgent", "tails")

    def __init__(self):
        self.event = None  # CUDA event after the host copies (None: already done)
        self.wav = None  # [b, n * spf] float32, host (pinned on CUDA)
        self.parts: list = []  # (member, row, samples from, samples to)
        self.complete: list = []  # members whose audio ends with this call
        self.codes: list = []  # (member, host int32 codes [frames, K])
        self.tails: list = []  # (member, row, sample): the member's reference audio ends at that sample of wav
        self.first = False  # it holds a member's first audio
        self.urgent = False  # it holds audio a member's listener is about to run out of

    def ready(self) -> bool:
        return self.event is None or self.event.query()
