"""`EngineProcess`: an engine in a process of its own, used like an in-process `EngineRunner`.

    eng = EngineProcess(spec); eng.start(); eng.wait_ready()     # one-line EngineStartError on failure
    h = eng.submit(request, priority=0)                         # a StreamHandle, as the runner's
    for chunk in h: ...
    eng.stop()

A reader thread takes the engine's messages: audio chunks go to their handles, `end` finishes them,
`stats` is kept for `stats()` (routing, /health, the watchdog). When the process dies, every request in
flight fails with `EngineUnavailable` (a kind of EngineBusy: HTTP answers 503, the jobs worker puts the
segment back in the queue without counting an attempt) and the process is started again, waiting
longer after each failure (RESTART_DELAYS_S); meanwhile submit raises EngineUnavailable.
"""
from __future__ import annotations

import itertools
import logging
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Callable, Optional

from engines.api import EngineSpec
from engines.model.errors import EngineUnavailable, TTSError
from engines.names import own_gpu
from engines.process import wire
from engines.runtime.stream import StreamHandle, collect, submit_waiting

log = logging.getLogger(__name__)
RESTART_DELAYS_S = (1.0, 2.0, 5.0, 10.0, 30.0)
FRESH_STATS_S = 1.0  # longest wait for figures asked for now
STALE_STATS_S = 30.0  # no figures from a live engine for this long: its loop (or the process) is stuck


class EngineStartError(TTSError):
    """An engine process could not start (out of memory, a bad device, a broken checkpoint); `permanent`: no new
    start can succeed (a checkpoint that does not load, a device that is not there)."""

    def __init__(self, message: str, permanent: bool = False):
        super().__init__(message)
        self.permanent = permanent


class RemoteHandle(StreamHandle):
    """A request's output in the front: filled by the reader thread; cancel() tells the engine."""

    def __init__(self, owner: "EngineProcess", rid: int):
        super().__init__(owner, owner.sample_rate)
        self.rid = rid
        self.feed = None
        self._sent = 0  # characters of the feed's text already sent

    def cancel(self) -> None:
        if not self.cancelled and not self.done:
            self.cancelled = True
            self._runner._send("cancel", self.rid)


class EngineProcess:
    """One engine process for `spec` (see the module docstring). `init`: a function (importable by name)
    the process runs first, e.g. the daemon's logging set-up."""

    def __init__(self, spec: EngineSpec, init: Optional[Callable[[], None]] = None, restart: bool = True):
        self.spec, self.init, self.restart = spec, init, restart
        self.device = spec.device
        self.sample_rate = 0
        self.model_id = ""
        self.settings: dict = {"device": spec.device}
        self.max_slots = 0
        self.max_queue = spec.max_queue
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0  # processes started (1 + restarts)
        self._conn: Optional[Connection] = None
        self._send_lock = threading.Lock()
        self._handles: dict[int, RemoteHandle] = {}
        self._clones: dict[int, Future] = {}
        self._asked: dict[int, threading.Event] = {}  # stats asked for, by request id
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._stats: dict = {}
        self._stats_at = 0.0
        self._up = threading.Event()  # serving (ready and not dead)
        self._stopping = False
        self._starting = False
        self._reader: Optional[threading.Thread] = None
        self._seen_as: Optional[str] = None  # the device as the process sees it, where that differs (own_gpu)
        self.last_exit: Optional[str] = None  # why the last process ended

    # -- life cycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the process (returns at once; `wait_ready` waits for its start-up)."""
        parent, child = socket.socketpair()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        root = _project_root()  # the same code as this process, whatever the working folder
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        spec, self._seen_as = self.spec, None
        own = own_gpu(spec.device, env)
        if own is not None:  # the process sees its GPU alone: compiled regions cached for one GPU serve every GPU
            spec, self._seen_as = replace(spec, device=own[0]), own[0]
            env["CUDA_VISIBLE_DEVICES"] = own[1]
            log.info("engine for %s starts with CUDA_VISIBLE_DEVICES=%s (its %s)", self.device, own[1], own[0])
        self.proc = subprocess.Popen([sys.executable, "-m", "engines.process.child", str(child.fileno())],
                                     pass_fds=(child.fileno(),), env=env)
        child.close()
        self._conn = Connection(parent.detach())
        self._conn.send_bytes(pickle.dumps((spec, self.init)))
        self.starts += 1

    def wait_ready(self, timeout: Optional[float] = None) -> None:
        """Wait for the engine's start-up (load, graph capture, warm-up); EngineStartError (one line) when
        it fails or the process dies."""
        conn = self._conn
        try:
            if timeout is not None and not conn.poll(timeout):
                raise EngineStartError(f"engine on {self.device} did not start within {timeout:.0f} s")
            msg = wire.unpack(conn.recv_bytes())
        except (EOFError, OSError):
            code = self.proc.wait()
            raise EngineStartError(f"engine process on {self.device} exited during start-up "
                                   f"({_exit_reason(code)}); see the log above") from None
        if msg[0] == "start_failed":
            self.proc.wait()
            why = msg[1].replace(self._seen_as, self.device) if self._seen_as else msg[1]  # (its only GPU is ours)
            raise EngineStartError(f"engine on {self.device} cannot start: {why}", permanent=msg[2])
        info = msg[1]
        self.sample_rate, self.model_id = info["sample_rate"], info["model_id"]
        self.settings = dict(info["settings"], device=self.device)  # (the device as the daemon names it)
        self.max_slots, self.max_queue = info["max_slots"], info["max_queue"]
        self._stats_at = time.monotonic()
        self._reader = threading.Thread(target=self._read, args=(conn, self.proc), name=f"engine-reader-{self.device}",
                                        daemon=True)
        self._reader.start()
        self._up.set()
        log.info("engine process %d on %s ready: %d slots", info["pid"], self.device, self.max_slots)

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._up.clear()
        try:
            self._send("stop")
        except (OSError, EngineUnavailable):
            pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("engine process on %s did not stop in %.0f s: killing it", self.device, timeout)
                self.proc.kill()
                self.proc.wait()
        if self._reader is not None:
            self._reader.join(timeout)

    @property
    def running(self) -> bool:
        """Serving requests now (false while (re)starting or after it stopped)."""
        return self._up.is_set()

    @property
    def starting(self) -> bool:
        """A start asked for by `restart_async` is under way (loading, warming up)."""
        return self._starting

    @property
    def alive(self) -> bool:
        """Serving, and its loop reported figures recently (a stuck engine is not alive)."""
        return self.running and time.monotonic() - self._stats_at < STALE_STATS_S

    # -- requests --------------------------------------------------------------------------------
    def submit(self, request, priority: int = 0) -> StreamHandle:
        """Queue `request` in the engine; its audio arrives on the returned handle."""
        if not self._up.is_set():
            raise EngineUnavailable(f"the engine on {self.device} is {self.status}; retry shortly")
        rid = next(self._ids)
        h = RemoteHandle(self, rid)
        feed = request.text_feed
        feed_state = None
        if feed is not None:
            h.feed = feed
            text, h._sent = feed.text, len(feed.text)
            feed_state = (text, feed.ended)
            request = replace(request, text_feed=None)
        with self._lock:
            self._handles[rid] = h
        try:
            self._send("submit", rid, request, priority, feed_state)
        except OSError:
            self._lose(rid)
            raise EngineUnavailable(f"the engine on {self.device} stopped; retry shortly") from None
        if feed is not None:
            feed.on_change = lambda: self._feed_changed(h)
            self._feed_changed(h)  # text appended between the snapshot and on_change
        return h

    def synthesize(self, requests: list, priority: int = 1) -> list:
        """Whole-audio results for a batch (waits for room); raises the first request's error."""
        return collect(submit_waiting(self.submit, requests, priority))

    def clone_voice(self, ref_audio, ref_text: Optional[str] = None):
        """A voice cloned by the engine from reference audio (a file path both processes can read)."""
        rid = next(self._ids)
        fut: Future = Future()
        with self._lock:
            self._clones[rid] = fut
        self._send("clone", rid, str(ref_audio), ref_text)
        return fut.result()

    def stats(self, fresh: bool = False) -> dict:
        """The engine loop's figures (what EngineRunner.stats gives), `alive` included: the latest it sent
        (every STATS_S), or with `fresh` asked for now (waits up to FRESH_STATS_S)."""
        if fresh and self._up.is_set():
            rid = next(self._ids)
            asked = threading.Event()
            with self._lock:
                self._asked[rid] = asked
            try:
                self._send("stats", rid)
                asked.wait(FRESH_STATS_S)
            except (OSError, EngineUnavailable):
                pass
            finally:
                with self._lock:
                    self._asked.pop(rid, None)
        with self._lock:
            s = dict(self._stats)
        s.update(alive=self.alive, max_slots=self.max_slots, restarts=max(self.starts - 1, 0),
                 pid=self.proc.pid if self.proc is not None else None)
        s.setdefault("active_slots", 0)
        s.setdefault("queued", 0)
        return s

    @property
    def status(self) -> str:
        if self._up.is_set():
            return "ok" if self.alive else "stuck"
        return "stopped" if self._stopping else "starting"

    # -- plumbing ---------------------------------------------------------------------------------
    def _send(self, *msg) -> None:
        conn = self._conn
        if conn is None:
            raise EngineUnavailable(f"the engine on {self.device} is not started")
        data = wire.pack(*msg)
        with self._send_lock:
            conn.send_bytes(data)

    def _feed_changed(self, h: RemoteHandle) -> None:
        """Send the text appended to a request's feed since the last call (and its end)."""
        feed = h.feed
        with self._send_lock:
            text = feed.text
            new, h._sent = text[h._sent:], len(text)
            ended = feed.ended
            if (new or ended) and not h.done:
                try:
                    self._conn.send_bytes(wire.pack("feed", h.rid, new, ended))
                except OSError:
                    pass  # the engine died: the request fails through the reader

    def _lose(self, rid: int) -> Optional[RemoteHandle]:
        with self._lock:
            return self._handles.pop(rid, None)

    def _read(self, conn: Connection, proc: subprocess.Popen) -> None:
        try:
            while True:
                msg = wire.unpack(conn.recv_bytes())
                kind = msg[0]
                if kind == "chunks":
                    with self._lock:
                        got = [(self._handles.get(rid), audio) for rid, audio in msg[1]]
                    for h, audio in got:
                        if h is not None:
                            h.add_audio(audio)
                elif kind == "end":
                    self._end(msg[1], msg[2])
                elif kind == "restart":  # preempted by a stream: it starts over in the engine
                    with self._lock:
                        h = self._handles.get(msg[1])
                    if h is not None:
                        h.restart()
                elif kind == "stats":
                    with self._lock:
                        self._stats, self._stats_at = msg[1], time.monotonic()
                        asked = self._asked.pop(msg[2], None) if msg[2] is not None else None
                    if asked is not None:
                        asked.set()
                elif kind == "cloned":
                    with self._lock:
                        fut = self._clones.pop(msg[1], None)
                    if fut is not None:
                        if msg[3] is None:
                            fut.set_result(msg[2])
                        else:
                            fut.set_exception(wire.rebuild_error(msg[3]))
        except (EOFError, OSError):
            pass
        self._died(conn, proc)

    def _end(self, rid: int, info: dict) -> None:
        h = self._lose(rid)
        if h is None:
            return
        h.marks.update({f"engine_{k}": v for k, v in info["marks"].items()})
        h.finished_by_eos = info["finished_by_eos"]
        if info["codes"] is not None:
            h.codes = info["codes"].astype("int64")
        h.lead = info["lead"]
        if h.feed is not None and info["feed_taken"] is not None:
            h.feed.taken = info["feed_taken"]
        if info["error"] is not None:
            h.fail(wire.rebuild_error(info["error"]))
        else:
            h.finish()

    def _died(self, conn: Connection, proc: subprocess.Popen) -> None:
        """The process ended: fail what was in flight, then start it again (unless stopping)."""
        self._up.clear()
        code = proc.wait()
        conn.close()
        self.last_exit = _exit_reason(code)
        with self._lock:
            lost, self._handles = list(self._handles.values()), {}
            clones, self._clones = list(self._clones.values()), {}
        if self._stopping:
            for h in lost:
                h.fail(EngineUnavailable(f"the engine on {self.device} stopped"))
            return
        log.error("engine process on %s ended (%s); %d requests in flight failed%s", self.device, self.last_exit,
                  len(lost), "; starting it again" if self.restart else "")
        err = EngineUnavailable(f"the engine on {self.device} stopped ({self.last_exit}); retry shortly")
        for h in lost:
            h.fail(err)
        for fut in clones:
            fut.set_exception(err)
        if self.restart:
            threading.Thread(target=self._restart, name=f"engine-restart-{self.device}", daemon=True).start()

    def restart_async(self) -> None:
        """Start the process again in a thread of its own (no-op while a start is under way or it runs):
        for a supervisor that must not wait minutes for a start-up."""
        with self._lock:
            if self._up.is_set() or self._starting or self._stopping:
                return
            self._starting = True

        def run():
            try:
                self.start()
                self.wait_ready()
                log.info("engine on %s is back (start %d)", self.device, self.starts)
            except EngineStartError as exc:
                self.last_exit = str(exc)
                log.error("%s", exc)
            finally:
                self._starting = False

        threading.Thread(target=run, name=f"engine-start-{self.device}", daemon=True).start()

    def _restart(self) -> None:
        for attempt in itertools.count():
            if self._stopping:
                return
            time.sleep(RESTART_DELAYS_S[min(attempt, len(RESTART_DELAYS_S) - 1)])
            try:
                self.start()
                self.wait_ready()
                log.info("engine on %s is back (start %d)", self.device, self.starts)
                return
            except EngineStartError as exc:
                log.error("%s; trying again", exc)


def _exit_reason(code: Optional[int]) -> str:
    if code is None:
        return "still running"
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _project_root() -> str:
    """The folder `engines` is imported from, so `python -m engines.process.child` finds the same code."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
