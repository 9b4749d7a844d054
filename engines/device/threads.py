"""A thread's own count of torch intra-op threads; work run in a thread of its own that ends with it."""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

import torch

T = TypeVar("T")


def own_torch_threads(n: int = 1) -> None:
    """Give the calling thread `n` torch intra-op threads, for good. torch gives a thread the process-wide count
    (the last one any thread set) at the thread's first parallel op unless the thread has asked for its count
    before: asking first makes `n` stay, whatever another thread sets later (the CPU engine's loop changes its
    count between steps: engines.runtime.runner.EngineRunner._pick_threads)."""
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def in_passing_thread(fn: Callable[..., T], *args, name: str = "passing", **kwargs) -> T:
    """`fn(*args, **kwargs)` run in a new thread that ends when it returns (its result returned, its exception
    raised here). torch's OpenMP runtime keeps a team of threads for every thread that has run a parallel op, for
    as long as that thread lives, and once the process holds more of them than it has cores, every team's
    threads stop spinning between ops and sleep instead: the decode loop's many small products then wait for
    their threads to wake (one stream's step took ~30% longer beside an idle second team,
    docs/PERFORMANCE.md). Work done once before the loop starts (loading and packing a checkpoint on many
    threads) runs here, so its team goes with its thread."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            out["error"] = exc

    t = threading.Thread(target=run, name=name, daemon=True)  # (a Ctrl-C in the waiting caller ends the process)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]
