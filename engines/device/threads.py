"""A thread's own count of torch intra-op threads."""
from __future__ import annotations

import torch


def own_torch_threads(n: int = 1) -> None:
    """Give the calling thread `n` torch intra-op threads, for good. torch gives a thread the process-wide count
    (the last one any thread set) at the thread's first parallel op unless the thread has asked for its count
    before: asking first makes `n` stay, whatever another thread sets later (the CPU engine's loop changes its
    count between steps: engines.runtime.runner.EngineRunner._pick_threads)."""
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
