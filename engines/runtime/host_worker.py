"""The CPU's counterpart of a codec lane's CUDA stream: one thread that runs the lane's codec work in order.

On a GPU a lane's calls run on a stream of their own, overlapping the decode steps; on the CPU nothing overlaps
unless a thread does the work. `HostWorker` is that thread (engines.runtime.codec_lane uses one per CPU lane
when runtime cpu_codec_threads > 0; the codec splits a call's rows over threads of its own); `HostCall` is a
call submitted to it, collected like a CUDA call's event.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

import torch

from engines.device.threads import own_torch_threads


class HostCall:
    """A call running on a CPU lane's worker thread: the counterpart of a CUDA call's event (`query`: has it
    finished; `synchronize`: wait for it, raising what it raised)."""

    __slots__ = ("future",)

    def __init__(self, future: Future):
        self.future = future

    def query(self) -> bool:
        return self.future.done()

    def synchronize(self) -> None:
        self.future.result()


class HostWorker:
    """One thread that runs a CPU lane's codec work in order (its calls, row resets and moves): the CPU's
    counterpart of a lane's CUDA stream, so a book's codec calls run on one core while the loop's decode
    steps run on another (docs/PERFORMANCE.md, "Books on the CPU"). `threads`: torch's intra-op threads in
    that thread. Work whose result nobody waits for (`later`) keeps its error for `check`."""

    def __init__(self, name: str, threads: int):
        self.name, self.threads = name, max(1, threads)
        self._pool: Optional[ThreadPoolExecutor] = None  # started at the first submit (again after close)
        self.error: Optional[BaseException] = None

    @staticmethod
    def _no_grad(fn, *args):
        with torch.inference_mode():  # grad mode is per thread: the loop's no_grad does not reach this one
            return fn(*args)

    def submit(self, fn, *args) -> Future:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"codec-{self.name}",
                                            initializer=own_torch_threads, initargs=(self.threads,))
        return self._pool.submit(self._no_grad, fn, *args)

    def later(self, fn, *args) -> None:
        self.submit(fn, *args).add_done_callback(self._keep_error)

    def _keep_error(self, f: Future) -> None:
        if f.exception() is not None and self.error is None:
            self.error = f.exception()

    def check(self) -> None:
        """Raise the first error of work nobody waited for (once)."""
        err, self.error = self.error, None
        if err is not None:
            raise err

    def join(self) -> None:
        """Wait until everything submitted so far has run."""
        if self._pool is not None:
            self._pool.submit(lambda: None).result()

    def close(self) -> None:
        """Let the thread go once its work is done (a later submit starts a new one)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
