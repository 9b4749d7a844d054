"""The engine process: `python -m engines.process.child FD` (started by `proxy.EngineProcess`).

It reads its `EngineSpec` (and an optional start-up hook, e.g. the daemon's logging set-up) from the
socket FD, loads the runner, captures its graphs and speaks the warm-up request, answers `ready` (or
`start_failed` with a one-line reason and whether a new start could succeed), then serves until told
to stop or until the front goes away
(end of file on the socket: the process never outlives the daemon).

Threads: the runner's loop (the busy one), this main thread reading requests, and one relay thread
writing every outgoing message (audio chunks gathered into one message per wake-up, request ends,
stats every STATS_S), so the loop only appends to a list.
"""
from __future__ import annotations

import gc
import logging
import os
import pickle
import signal
import sys
import threading
import time
from dataclasses import replace
from multiprocessing.connection import Connection

import numpy as np

from engines.process import wire

log = logging.getLogger("tts_appliance.engine")
STATS_S = 0.25  # how often the front gets the loop's figures (its watchdog and routing read them)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:500]


class Relay(threading.Thread):
    """The one writer of the socket: chunks and control messages in the order they were posted."""

    def __init__(self, conn: Connection, stats):
        super().__init__(name="engine-relay", daemon=True)
        self.conn, self.stats = conn, stats
        self._items: list = []  # (rid, audio) chunk records or control tuples
        self._cv = threading.Condition()
        self._halt = False

    def chunk(self, rid: int, audio: np.ndarray) -> None:
        with self._cv:
            self._items.append((rid, audio))
            self._cv.notify()

    def control(self, *msg) -> None:
        with self._cv:
            self._items.append(msg)
            self._cv.notify()

    def stop(self) -> None:
        with self._cv:
            self._halt = True
            self._cv.notify()

    def run(self) -> None:
        last_stats = 0.0
        try:
            while True:
                with self._cv:
                    if not self._items and not self._halt:
                        self._cv.wait(STATS_S)
                    items, self._items, stop = self._items, [], self._halt
                self._send(items)
                now = time.monotonic()
                if now - last_stats >= STATS_S:
                    last_stats = now
                    self.conn.send_bytes(wire.pack("stats", self.stats(), None))
                if stop:
                    return
        except (OSError, EOFError):  # the front went away: the main thread sees it too
            return

    def _send(self, items: list) -> None:
        chunks: list = []
        for item in items:
            if isinstance(item[0], int):  # (rid, audio)
                chunks.append(item)
                continue
            if chunks:
                self.conn.send_bytes(wire.pack_chunks(chunks))
                chunks = []
            self.conn.send_bytes(wire.pack(*item))
        if chunks:
            self.conn.send_bytes(wire.pack_chunks(chunks))


def relay_handle_class():
    from engines.runtime.stream import StreamHandle

    class RelayHandle(StreamHandle):
        """A request's output in the engine process: audio and the end go to the front, not to a queue."""

        def __init__(self, runner, rid: int, relay: Relay, feed=None):
            super().__init__(runner, runner.sample_rate)
            self.rid, self.relay, self.feed = rid, relay, feed

        def _put(self, audio: np.ndarray) -> None:  # (add_audio's hand-over; finish below sends the end)
            self.relay.chunk(self.rid, audio)

        def restart(self) -> None:
            super().restart()
            self.relay.control("restart", self.rid)

        def finish(self) -> None:
            if self.done:
                return
            self.done = True
            codes = None if self.codes is None else np.asarray(self.codes, dtype=np.int16)
            self.relay.control("end", self.rid, {
                "error": None if self.error is None else wire.error_info(self.error),
                "finished_by_eos": self.finished_by_eos, "codes": codes, "lead": self.lead, "marks": dict(self.marks),
                "feed_taken": None if self.feed is None else self.feed.taken})
            if self.on_done is not None:
                self.on_done(self)

    return RelayHandle


def serve(conn: Connection, runner) -> None:
    """Relay requests to the started runner until `stop` or the end of the socket."""
    from engines.model.voice import ClonedVoice  # noqa: F401 - unpickling cloned voices of requests
    from engines.runtime.text_feed import TextFeed

    Handle = relay_handle_class()
    relay = Relay(conn, runner.stats)
    relay.start()
    handles: dict = {}

    def forget(h):
        handles.pop(h.rid, None)

    def clone(rid, ref_audio, ref_text):
        try:
            voice = runner.clone_voice(ref_audio, ref_text)
            relay.control("cloned", rid, voice_to_cpu(voice), None)
        except Exception as exc:  # noqa: BLE001 - the client's error
            relay.control("cloned", rid, None, wire.error_info(exc))

    while True:
        try:
            msg = wire.unpack(conn.recv_bytes())
        except (EOFError, OSError):
            log.info("the daemon went away: stopping the engine")
            break
        kind = msg[0]
        if kind == "submit":
            _, rid, request, priority, feed_state = msg
            feed = None
            if feed_state is not None:
                feed = TextFeed(feed_state[0])
                if feed_state[1]:
                    feed.end()
                request = replace(request, text_feed=feed)
            h = Handle(runner, rid, relay, feed)
            h.on_done = forget
            handles[rid] = h
            try:
                runner.submit(request, priority, handle=h)
            except Exception as exc:  # noqa: BLE001 - EngineBusy: the request's own answer
                h.fail(exc)
        elif kind == "cancel":
            h = handles.get(msg[1])
            if h is not None:
                h.cancel()
        elif kind == "feed":
            _, rid, text, ended = msg
            h = handles.get(rid)
            if h is not None and h.feed is not None:
                try:
                    h.feed.append(text)
                    if ended:
                        h.feed.end()
                except ValueError:  # appended after its end: the front's race, nothing to speak
                    pass
        elif kind == "stats":  # figures asked for now (/health): answered in order with the audio
            relay.control("stats", runner.stats(), msg[1])
        elif kind == "clone":
            threading.Thread(target=clone, args=msg[1:], name="engine-clone", daemon=True).start()
        elif kind == "stop":
            break
    runner.stop(10.0)
    relay.stop()
    relay.join(5.0)


def voice_to_cpu(voice):
    """A cloned voice whose tensors live on the CPU (to cross to the front)."""
    if voice is None:
        return None
    return replace(voice, spk_embedding=voice.spk_embedding.detach().cpu(),
                   ref_codes=None if voice.ref_codes is None else voice.ref_codes.detach().cpu())


def main(argv: list[str]) -> int:
    # The front stops this process (a "stop" message, after its in-flight work drained) and it ends by itself
    # when the front goes away. A Ctrl-C in a terminal, or a SIGTERM sent to the whole service (systemd's
    # default KillMode), reaches every process of the group at once: it is the front's to act on, not ours,
    # else the work the front lets finish on a stop would die with us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = Connection(int(argv[1]))
    spec, init = pickle.loads(conn.recv_bytes())
    if init is not None:
        init()
    from engines.load import load_runner, ready

    try:
        runner = load_runner(spec)
        ready(runner, spec)
    except BaseException as exc:  # noqa: BLE001 - told to the front in one line, which logs it and ends its start
        from engines.model.errors import CheckpointError, DeviceNotFound

        log.debug("engine on %s cannot start", spec.device, exc_info=True)
        # permanent: no new start of this spec can succeed (the front does not try again; the daemon exits 78)
        conn.send_bytes(wire.pack("start_failed", one_line(exc), isinstance(exc, (CheckpointError, DeviceNotFound))))
        return 1
    gc.freeze()  # what start-up made (modules, graphs, weights' wrappers) is never scanned again: no long GC pauses
    conn.send_bytes(wire.pack("ready", {"settings": runner.settings, "sample_rate": runner.sample_rate,
                                        "model_id": runner.model_id, "max_slots": runner.cfg.max_slots,
                                        "max_queue": runner.cfg.max_queue, "pid": os.getpid(),
                                        "stats": runner.stats()}))
    serve(conn, runner)
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    logging.shutdown()
    os._exit(code)  # no interpreter teardown: device contexts and threads go with the process
