"""The daemon's watched parts (appliance.supervise): a thread that dies is logged, shown down and
restarted after a pause that grows while it keeps dying; a part that cannot be restarted is handed back
so the daemon stops; nothing is down while the daemon stops. (The real daemon: test_daemon_supervise.py.)"""
from __future__ import annotations

import logging
import threading

from appliance.supervise import RESTART_DELAYS_S, STABLE_S, Part, Supervisor


class Flaky:
    """What a watched thread runs: dies with MemoryError `deaths` times, then runs until released."""

    def __init__(self, deaths: int):
        self.deaths, self.runs = deaths, 0
        self.release = threading.Event()

    def make(self):
        def run():
            self.runs += 1
            if self.runs <= self.deaths:
                raise MemoryError("no room for the chapter")
            self.release.wait(30)
        return run


def _dead(part) -> None:
    part.thread.join(5)
    assert not part.thread.is_alive()


def test_a_dead_thread_is_shown_down_and_restarted_after_a_growing_pause(caplog):
    caplog.set_level(logging.INFO, "appliance.supervise")
    sup, flaky = Supervisor(), Flaky(deaths=2)
    part = sup.thread("jobs-0", flaky.make)
    _dead(part)
    h = sup.health()["jobs-0"]
    assert not h["ok"] and h["error"] == "MemoryError: no room for the chapter"
    assert "jobs-0 died: MemoryError" in caplog.text and "Traceback" in caplog.text

    t0 = part.started
    assert sup.check(now=t0 + 0.1) == [] and part.restarts == 0  # first pause: RESTART_DELAYS_S[0]
    assert "jobs-0 is down (MemoryError: no room for the chapter); restarting it in 1 s" in caplog.text
    assert sup.check(now=t0 + 0.1 + RESTART_DELAYS_S[0]) == [] and part.restarts == 1
    _dead(part)  # died again at once: the next pause is twice as long
    t1 = part.started
    sup.check(now=t1 + 0.1)
    assert part.delay == 2 * RESTART_DELAYS_S[0]
    sup.check(now=t1 + 0.1 + RESTART_DELAYS_S[0])
    assert part.restarts == 1, "restarted before its pause was over"
    sup.check(now=t1 + 0.1 + 2 * RESTART_DELAYS_S[0])
    assert part.restarts == 2 and part.thread.is_alive()
    sup.check()
    assert sup.health()["jobs-0"] == {"ok": True, "restarts": 2}
    assert "restarting jobs-0 (restart 2)" in caplog.text
    flaky.release.set()


def test_a_part_that_ran_long_before_dying_gets_the_short_pause_again():
    sup, flaky = Supervisor(), Flaky(deaths=1)
    part = sup.thread("inbox", flaky.make)
    _dead(part)
    part.delay = RESTART_DELAYS_S[1]  # it had been dying often before
    sup.check(now=part.started + STABLE_S + 1)
    assert part.delay == RESTART_DELAYS_S[0]


def test_a_start_that_fails_is_retried():
    calls = []

    def make():
        calls.append(1)
        if len(calls) == 1:
            raise FileExistsError("inbox is a file")
        return lambda: threading.Event().wait(30)

    sup = Supervisor()
    part = sup.thread("inbox", make)
    assert sup.health()["inbox"]["error"] == "FileExistsError: inbox is a file"
    sup.check(now=part.started + 0.1)
    sup.check(now=part.started + 0.1 + RESTART_DELAYS_S[0])
    assert len(calls) == 2 and part.thread.is_alive() and sup.health()["inbox"]["ok"]


def test_a_part_that_cannot_be_restarted_is_handed_back_and_nothing_is_down_while_stopping(caplog):
    alive = [True]
    sup = Supervisor()
    sup.add(Part("engine cpu", alive=lambda: alive[0]))
    assert sup.check() == [] and sup.health()["engine cpu"]["ok"]
    alive[0] = False
    assert [p.name for p in sup.check()] == ["engine cpu"]
    assert "engine cpu is down (it ended); the daemon stops" in caplog.text
    assert sup.health()["engine cpu"] == {"ok": False, "restarts": 0, "error": "it ended"}
    sup.stopping = True
    assert sup.check() == [] and sup.health()["engine cpu"]["ok"]


def test_the_daemon_stops_with_status_1_when_an_engine_loop_is_down(tmp_path):
    import asyncio

    from appliance.config import Config
    from appliance.daemon import Daemon
    from appliance.settings import settings

    cfg = Config()
    cfg.jobs.home = str(tmp_path / "home")
    d = Daemon(settings(cfg))
    alive = [True]
    d.supervisor.add(Part("engine cpu", alive=lambda: alive[0]))

    async def go():
        stop = asyncio.Event()
        task = asyncio.create_task(d._supervise(stop, every_s=0.01))
        await asyncio.sleep(0.05)
        assert not stop.is_set() and d.exit_code == 0
        alive[0] = False  # the engine's loop thread died
        await asyncio.wait_for(stop.wait(), 5)
        await task

    asyncio.run(go())
    assert d.exit_code == 1
