"""The daemon's watched parts (appliance.supervise): a thread that dies is logged, shown down and
restarted after a pause that grows while it keeps dying; a part that cannot be restarted is handed back
so the daemon stops; nothing is down while the daemon stops. (The real daemon: test_daemon_supervise.py.)"""
from __future__ import annotations

import logging
import threading

import pytest

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
            self.release.wait(3600)  # (set by the test; a slow machine must not end it first)
        return run


def _dead(part) -> None:
    part.thread.join(300)  # (a failure guard)
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
        return lambda: threading.Event().wait(3600)  # runs on (a daemon thread) for the rest of the test

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


class SlowStart:
    """An engine process as the supervisor sees it: it dies, and a restart takes a while to come up."""

    def __init__(self):
        self.up, self.loading, self.starts = True, False, 0

    def restart(self):  # (EngineProcess.restart_async: returns at once, the start goes on in a thread)
        self.loading, self.starts = True, self.starts + 1

    def came_up(self, ok: bool = True):
        self.loading, self.up = False, ok


def test_one_crash_is_one_restart_however_long_the_start_takes(caplog):
    caplog.set_level(logging.INFO, "appliance.supervise")
    e = SlowStart()
    sup = Supervisor()
    part = sup.add(Part("engine cpu", alive=lambda: e.up, restart=e.restart, starting=lambda: e.loading))
    t = part.started + STABLE_S + 100  # it ran a long time, then its process died
    e.up = False
    for second in range(40):  # checked every second while its start-up (loading the model) takes 40 s
        sup.check(now=t + second)
    assert e.starts == 1 and part.restarts == 1
    assert caplog.text.count("restarting engine cpu") == 1 and caplog.text.count("engine cpu is down") == 1
    assert not sup.health()["engine cpu"]["ok"]  # down (503) while it starts
    e.came_up()
    sup.check(now=t + 40)
    assert sup.health()["engine cpu"] == {"ok": True, "restarts": 1}

    # a start that fails soon after the restart: the next one waits twice as long
    e.up = False
    sup.check(now=t + 50)
    assert part.delay == 2 * RESTART_DELAYS_S[0] and e.starts == 1
    sup.check(now=t + 50 + 2 * RESTART_DELAYS_S[0])
    assert e.starts == 2 and part.restarts == 2


def test_idle_time_is_not_counted_as_time_without_progress(tmp_path, monkeypatch):
    """The watchdog ping is withheld only while the engine has work and makes no progress: a request after an hour
    of idling gets its ping (the time without progress counts from when there was work), a stuck one does not."""
    import asyncio
    from types import SimpleNamespace

    import appliance.daemon as daemon
    from appliance.config import Config
    from appliance.settings import settings

    clock = [1000.0]
    monkeypatch.setattr(daemon, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    cfg = Config()
    cfg.jobs.home, cfg.service.status_interval_s = str(tmp_path / "home"), 0.001
    d = daemon.Daemon(settings(cfg))
    pings = []
    d.notifier = SimpleNamespace(watchdog_s=3.0, watchdog=lambda: pings.append(clock[0]), status=lambda text: None)
    d.status_line = lambda: "status"
    # (seconds since the last tick, the engine's figures): an hour idle, a request (no frame yet), frames coming,
    # then the same frame count while it has work: stuck
    idle = {"active_slots": 0, "queued": 0, "frames": 0}
    script = [(600, idle)] * 6 + [(0.5, {"active_slots": 0, "queued": 1, "frames": 0}),
                                  (0.5, {"active_slots": 1, "queued": 0, "frames": 4}),
                                  (0.5, {"active_slots": 1, "queued": 0, "frames": 9})] + \
        [(1.0, {"active_slots": 1, "queued": 0, "frames": 9})] * 4

    class Done(Exception):
        pass

    def stats():
        if not script:
            raise Done
        step, figures = script.pop(0)
        clock[0] += step
        return figures

    d.host = SimpleNamespace(stats=stats, progress=0)
    ticks = [clock[0] + sum(s for s, _ in script[: i + 1]) for i in range(len(script))]
    with pytest.raises(Done):
        asyncio.run(d._tick())
    assert pings[:9] == ticks[:9], "a ping was withheld while the engine idled or made progress"
    assert ticks[-1] not in pings, "a stuck engine still got its ping"  # 3 s without progress > 0.8 * WatchdogSec
