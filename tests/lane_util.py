"""Driving a codec lane the way the runner does, for the codec tests."""
from __future__ import annotations

import numpy as np
import torch

from engines.runtime.codec_lane import CodecLane
from engines.runtime.stream import FrameStore


def drive_lane(codec, frames: torch.Tensor, plan, first: int = 1, max_chunk: int = 4, use_graphs: bool = False,
               device="cpu", wait: bool = True, fill: int = 0,
               worker_threads: int = 0, frames_per_call: int = 4096,
               window_frames: int = 0) -> tuple[list[np.ndarray], CodecLane]:
    """Feed frames [S, T, K] through a codec lane following `plan` (frames per request per round): frames
    written to each request's FrameStore row, the lane told how many there are, one lane call per round
    (then one per round until every request's audio is complete). Returns each request's audio and the lane.
    `fill`: what the FrameStore holds where no frame was written yet (the scratch row included);
    `worker_threads` > 0: the lane's codec runs on a thread of its own (CPU); `frames_per_call` and
    `window_frames`: the lane's (CodecLane)."""
    s, t_max = frames.shape[0], frames.shape[1]
    store = FrameStore(s, t_max, frames.shape[2], device)
    store.codes.fill_(fill)
    lane = CodecLane("test", codec, store, first, max_chunk, frames_per_call, use_graphs=use_graphs, wait=wait,
                     worker_threads=worker_threads, window_frames=window_frames)
    members = [lane.add(i, store.take(), 0) for i in range(s)]
    audio, pos = [[] for _ in range(s)], [0] * s

    def collect(drain=False, block=False):
        out, _ = lane.drain() if drain else lane.run(block=block)
        for m, a in out:
            audio[m.seq].append(a)

    for rnd in plan:
        for i, k in enumerate(rnd):
            store.codes[members[i].frame_row, pos[i]:pos[i] + k] = frames[i, pos[i]:pos[i] + k].to(device, torch.int32)
            pos[i] += k
            members[i].emitted = pos[i]
            members[i].finished = pos[i] == t_max
        collect()
    for _ in range(t_max):  # (waiting for calls in flight: a lane on a worker thread may not have run them)
        collect(block=True)
    collect(drain=True)  # calls still in flight (a lane that does not wait)
    assert not lane.members and not lane.busy, "every request's audio should be complete"
    return [np.concatenate(a) for a in audio], lane
