"""One request's host-side state while the engine works on it (the scheduler moves it, the runner fills it)."""
from __future__ import annotations

from engines.api import SynthesisRequest


class Sequence:
    """A request from admission to its last audio: where it is (queue, prefill group, slot), its prompt and
    settings once prepared, and its progress as the host knows it."""

    def __init__(self, handle, request: SynthesisRequest, priority: int = 0):
        self.handle, self.request, self.priority = handle, request, priority
        self.prompt = self.settings = None
        self.offset = 0  # prefill progress
        self.slot = -1  # current slot (slots move when others leave)
        self.side_row = -1  # side-cache row while prefilling
        self.pos = 0  # tokens in its cache (host copy of the device value)
        self.done = False  # no more frames will be made (finished, cancelled)
        self.ref_codes = None
        self.frame_row = -1  # FrameStore row (from admission until its audio is decoded)
        self.member = None  # its place in a codec lane
        self.feed = request.text_feed  # text still arriving (engines.runtime.text_feed), or None
        self.text_open = False  # more text may come: its row is held when it has used every text row
        self.fed_ids: list = []  # text token ids given to the model so far (the first one in the prompt)
        self.text_rows = 0  # trailing rows in its slot
        self.feed_version = -1
        self.held = False  # the last collected step held its row (waiting for text)
        self.requeued = False  # preempted: its request went back to the queue as a new Sequence
        self.reserve = 0  # cache positions it may come to hold (prompt + frame limit), once prepared

    @property
    def is_stream(self) -> bool:
        return self.priority <= 0
