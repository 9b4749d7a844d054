"""Work done before a CPU engine's loop starts (loading, packing weights) leaves no torch threads behind: torch's
OpenMP runtime keeps a team of threads for every thread that ran a parallel op while that thread lives, and beside
a second team the loop's fp16 products lost ~30-40% (docs/PERFORMANCE.md, "Issue 46, third round")."""
from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from engines.device.threads import in_passing_thread

LINUX = os.path.isdir("/proc/self/task")
OPENMP = "OpenMP" in torch.__config__.parallel_info()


def _threads() -> set:
    return set(os.listdir("/proc/self/task"))


def _parallel_work() -> set:
    """A product big enough for torch to run on 2 threads; returns this process's threads meanwhile."""
    torch.set_num_threads(2)
    x = torch.randn(1024, 1024)
    for _ in range(3):
        x @ x
    return _threads()


def _gone(threads: set) -> bool:
    deadline = time.monotonic() + 60  # (a failure guard: ending threads are gone within milliseconds)
    while threads & _threads():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_in_passing_thread_returns_raises_and_runs_elsewhere():
    here = threading.get_ident()
    assert in_passing_thread(lambda a, b=0: (a + b, threading.get_ident()), 2, b=3)[0] == 5
    assert in_passing_thread(threading.get_ident) != here

    def fail():
        raise ValueError("told to the caller")

    with pytest.raises(ValueError, match="told to the caller"):
        in_passing_thread(fail)


@pytest.mark.skipif(not (LINUX and OPENMP), reason="counts threads in /proc of an OpenMP build of torch")
def test_the_passing_threads_torch_team_goes_with_it_and_a_living_threads_stays():
    saved = torch.get_num_threads()
    try:
        in_passing_thread(_parallel_work)  # (what torch starts once per process exists from here on)
        before = _threads()
        new = in_passing_thread(_parallel_work) - before
        assert len(new) >= 2, new  # the passing thread and its team's second thread, while it ran
        assert _gone(new), (new, _threads())  # both end with it
        # the condition it avoids: a thread that ran a parallel op and lives on keeps its team's thread
        before, seen, ran, go = _threads(), [], threading.Event(), threading.Event()
        t = threading.Thread(target=lambda: (seen.append(_parallel_work()), ran.set(), go.wait()))
        t.start()
        assert ran.wait(300)  # (a failure guard)
        new = seen[0] - before
        assert len(new) >= 2 and new <= _threads(), (new, _threads())  # its team waits with it
        go.set()
        t.join()
        assert _gone(new)
    finally:
        torch.set_num_threads(saved)


def test_a_cpu_engine_loads_in_a_passing_thread(monkeypatch):
    """engines.load.load_runner runs the CPU load in a thread of its own (`engine-load`) and returns its
    result; other devices load in the caller's thread (their graphs and streams are the caller's)."""
    import engines.load
    from engines.api import EngineSpec

    seen = []
    monkeypatch.setattr(engines.load, "check_device", lambda device: None)
    monkeypatch.setattr(engines.load, "_load", lambda spec: seen.append(threading.current_thread().name) or spec)
    spec = EngineSpec(model="unused", device="cpu")
    assert engines.load.load_runner(spec) is spec and seen == ["engine-load"]
    assert engines.load.load_runner(EngineSpec(model="unused", device="cuda:1")).device == "cuda:1"
    assert seen[-1] == threading.current_thread().name
