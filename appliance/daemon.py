"""`tts-appliance daemon`: one engine serving streams (HTTP, Wyoming), the job queue and the inbox.

Start-up: read the config, load the engine on its accelerator, warm it up, start the queue worker
(a thread that yields to streams) and the inbox watcher, bind the sockets (or take the ones systemd
passed), write HOME/daemon.json (how the CLI finds us), then READY=1. The worker, the watcher and
the engines' loops are watched (`appliance.supervise`): a worker or watcher that dies is restarted
with a log line, an engine loop that dies stops the daemon with status 1 (systemd restarts it);
/health answers 503 naming the part while one is down.
SIGTERM/SIGINT: STOPPING=1, stop taking work, cancel streams, let in-flight segments finish within
`service.stop_timeout_s` (else give their leases back to the queue), exit 0. SIGHUP: reload the config
(settings that need a restart are reported and kept).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
import time
from dataclasses import fields
from typing import Optional

from appliance.compose import make_retention, make_watcher, make_worker
from appliance.config import ConfigError, resolve
from appliance.logs import error_line, setup_logging  # noqa: F401 - also used by the CLI from here
from appliance.engine_host import EngineHost
from appliance.metrics import Metrics
from appliance.queue_view import QueueState, QueueView
from appliance.settings import Settings, reloaded, settings
from appliance.sdnotify import Notifier
from appliance.supervise import Part, Supervisor

log = logging.getLogger("tts_appliance.daemon")
STOP_MARGIN_S = 30.0  # a stop's time beyond service.stop_timeout_s: engine processes stopping, leases given back
RESTART_ONLY = {"model", "runtime", "http.socket", "http.tcp", "http.tcp_host", "http.tcp_port", "http.group",
                "http.mode", "wyoming", "jobs.home", "jobs.queue", "jobs.queue_file", "jobs.enabled", "jobs.voice",
                "jobs.language", "jobs.instruct", "service.runtime_dir"}


class Daemon:
    def __init__(self, s: Settings, config_path: Optional[str] = None, instance: Optional[str] = None):
        self.settings, self.config_path, self.instance = s, config_path, instance
        self.paths = s.paths.ensure()
        self.pid = os.getpid()
        self.state = "starting"
        self.accepting = False
        self.active_handles: set = set()
        self.metrics = Metrics()
        self.host = EngineHost(s, self.metrics)
        self.notifier = Notifier()
        self.stop_jobs = threading.Event()
        self.workers: list = []  # the queue workers now running (one per jobs-N thread)
        self.watcher = None  # the inbox watcher now running
        self.retention = None  # jobs.retention.Retention: working files of finished jobs removed (jobs.keep_work_days)
        self.supervisor = Supervisor()
        self.exit_code = 0
        self.announce = self.paths.home / (f"daemon@{instance}.json" if instance else "daemon.json")
        self.queue = QueueView(self.paths, instance)  # its counts; this daemon among those sharing the queue

    @property
    def cfg(self):
        """The merged configuration (sockets, HTTP limits, service): what the servers read."""
        return self.settings.config

    @property
    def job_defaults(self) -> dict:
        """Spec values of jobs that name none (POST /v1/jobs, the inbox)."""
        return self.settings.job_defaults

    # -- queue side ------------------------------------------------------------------------------
    def queue_state(self) -> QueueState:
        """The queue's counts, or why it cannot be read now (appliance.queue_view): never raises."""
        return self.queue.state()

    def _start_workers(self) -> None:
        for r in self.host.runners:  # an engine process is started again; an engine loop in this process is not
            self.supervisor.add(Part(f"engine {r.device}", alive=lambda r=r: r.running,
                                     restart=getattr(r, "restart_async", None),
                                     starting=lambda r=r: getattr(r, "starting", False),
                                     detail=lambda r=r: {"status": getattr(r, "status", "ok" if r.running else "stopped")}))
        w = self.settings.worker
        if w.enabled:
            for i in range(w.threads):
                self.workers.append(None)
                self.supervisor.thread(f"jobs-{i}", lambda i=i: self._worker(i),
                                       detail=lambda i=i: {"books": self.workers[i].books() if self.workers[i] else {}})
        if w.enabled:
            self.supervisor.thread("retention", self._retention,
                                   detail=lambda: {"last": self.retention.last} if self.retention is not None else {})
        if self.settings.inbox.enabled:
            self.supervisor.thread("inbox", self._watcher,
                                   detail=lambda: self.watcher.problems() if self.watcher is not None else {})

    def _worker(self, i: int):
        """A new queue worker for thread jobs-i (at start, and when it died; appliance.compose.make_worker)
        -> what the thread runs. The segments a dead one held go back to the queue first."""
        old = self.workers[i]
        if old is not None:
            try:
                old.release_held()
            except Exception as exc:  # noqa: BLE001 - they come back when their lease expires
                log.warning("jobs-%d: could not give back its segments (%s); they return when their leases expire",
                            i, exc)
        worker = make_worker(self.settings, self.host)  # fed continuously: every engine, yielding to streams
        self.workers[i] = worker
        return lambda: worker.run_forever(self.stop_jobs, 0.5)

    def _watcher(self):
        """A new inbox watcher (at start, and when it died) -> what its thread runs."""
        watcher = self.watcher = make_watcher(self.settings, self.host)
        return lambda: watcher.run(self.stop_jobs)

    def _retention(self):
        """The retention (at start, and when it died) -> what its thread runs: prune now and every hour."""
        retention = self.retention = make_retention(self.settings)
        return lambda: retention.run(self.stop_jobs)

    def job_ended(self, job_id: str) -> None:
        """Job `job_id` was cancelled or is being deleted: the workers stop its segments in the engine now."""
        for worker in self.workers:
            if worker is not None:
                worker.job_ended(job_id)

    def disk_state(self) -> dict:
        """The spool folder's disk for /health (jobs.disk.disk_state): free space, and whether jobs wait for room."""
        from jobs.disk import disk_state

        return disk_state(self.paths.home, self.settings.worker.min_free_mb << 20)

    def parts(self) -> dict:
        """The watched parts as /health shows them: {name: {"ok", "restarts", "error"?, ...}}."""
        return self.supervisor.health()

    def status_line(self) -> str:
        s = self.host.stats()
        n = len(s.get("engines", ()))
        on = f" on {n} engines" if n > 1 else ""
        line = (f"{self.state}; streams {s.get('streams', 0)}, slots {s.get('active_slots', 0)}/"
                f"{s.get('max_slots', '?')}{on}, waiting {s.get('queued', 0)}; ")
        q = self.queue_state()
        if not q.ok:
            return line + f"queue unreachable: {q.error}"
        counts, jobs = q.segments, q.jobs
        disk = self.disk_state()
        return line + (f"jobs running {jobs.get('running', 0)}, queued {jobs.get('queued', 0)}; "
                       f"segments {counts['done']}/{sum(counts.values())} done, {counts['leased']} in work"
                       + ("" if disk["ok"] else f"; {disk['error']}"))

    # -- lifecycle -------------------------------------------------------------------------------
    def run(self) -> int:
        self.queue.counts()  # a queue that cannot be opened (jobs.queue) stops the start before the model loads;
        try:                 # this daemon is recorded there, and daemons sharing it with another spool folder warned of
            self.notifier.status("loading model")
            self.host.load()  # (and the warm-up request, model.warmup)
            self._start_workers()
            asyncio.run(self._serve())
        finally:
            self.announce.unlink(missing_ok=True)
            self.queue.leave()
            self.notifier.close()
        return self.exit_code

    async def _serve(self) -> None:
        from appliance.servers import Servers

        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(self.reload()))
        servers = Servers(self)
        await servers.start()
        self.announce.write_text(json.dumps({"pid": self.pid, "socket": servers.http_path, "tcp": servers.tcp_url,
                                             "wyoming": servers.wyoming_path}), encoding="utf-8")
        self.state, self.accepting = "ok", True
        self.notifier.ready(self.status_line())
        log.info("ready: %s", ", ".join(servers.describe()))
        ticker = loop.create_task(self._tick())
        supervising = loop.create_task(self._supervise(stop))
        await stop.wait()
        ticker.cancel()
        supervising.cancel()
        await self.shutdown(servers)

    async def _supervise(self, stop: asyncio.Event, every_s: float = 1.0) -> None:
        """Every second: restart dead parts that are due; a part that cannot be restarted (an engine's
        loop) stops the daemon with exit status 1."""
        while not stop.is_set():
            await asyncio.sleep(every_s)
            if self.supervisor.check():
                self.exit_code = 1
                stop.set()

    async def _tick(self) -> None:
        """STATUS= every status_interval_s; WATCHDOG=1 while idle or while the engine makes progress (the time
        without progress counts from when it last moved or last had nothing to do: idle time is not stuck time)."""
        wd = self.notifier.watchdog_s
        period = min(self.cfg.service.status_interval_s, wd / 3 if wd else 1e9)
        last_progress, last_change = None, time.monotonic()
        loop = asyncio.get_running_loop()
        while True:
            s = self.host.stats()
            mark = (self.host.progress, s.get("frames"), s.get("steps"))
            now = time.monotonic()
            busy = s.get("active_slots") or s.get("queued")
            if mark != last_progress or not busy:
                last_progress, last_change = mark, now
            alive = s.get("alive", True)
            if alive and now - last_change < (wd or 60) * 0.8:
                self.notifier.watchdog()
            elif wd:
                log.warning("engine made no progress for %.0f s with work to do: withholding the watchdog ping",
                            now - last_change)
            try:
                self.notifier.status(await loop.run_in_executor(None, self.status_line))
            except Exception as exc:  # nothing must stop the pings (the queue's outages are in the line itself)
                log.debug("status: %s", exc)
            await asyncio.sleep(period)

    async def reload(self) -> None:
        """SIGHUP: re-read the config; apply what can change live, report what needs a restart."""
        self.notifier.reloading()
        try:
            new = resolve(self.config_path)
        except ConfigError as exc:
            log.error("reload: config invalid, keeping the old one: %s", exc)
            self.notifier.ready(self.status_line())
            return
        held = []
        for sec in ("model", "runtime", "jobs", "http", "wyoming", "service"):
            old_s, new_s = getattr(self.cfg, sec), getattr(new, sec)
            for f in fields(old_s):
                a, b = getattr(old_s, f.name), getattr(new_s, f.name)
                if a != b and (sec in RESTART_ONLY or f"{sec}.{f.name}" in RESTART_ONLY):
                    held.append(f"{sec}.{f.name}")
                    setattr(new_s, f.name, a)
        self.settings = reloaded(self.settings, new)
        setup_logging(new.service.log_level)
        log.info("configuration reloaded%s", f"; needs a restart to change: {', '.join(held)}" if held else "")
        self.notifier.ready(self.status_line())

    async def shutdown(self, servers) -> None:
        deadline = time.monotonic() + max(self.cfg.service.stop_timeout_s - 5.0, 1.0)
        log.info("stopping: no new work; in-flight segments get %.0f s", deadline - time.monotonic())
        self.state, self.accepting = "stopping", False
        self.supervisor.stopping = True
        self.notifier.stopping(self.cfg.service.stop_timeout_s + STOP_MARGIN_S)  # the unit's TimeoutStopSec stretched
        self.stop_jobs.set()
        from jobs.ingest.isolate import cancel_all

        cancel_all()  # a file being parsed (inbox or submit) must not hold up the stop
        for h in list(self.active_handles):
            h.cancel()
        await servers.stop()
        loop = asyncio.get_running_loop()
        threads = self.supervisor.threads()
        for t in threads:
            await loop.run_in_executor(None, t.join, max(deadline - time.monotonic(), 0.1))
        if any(t.is_alive() for t in threads):
            held = sum(w.release_held() for w in self.workers if w is not None)
            log.warning("stop timeout: returned %d in-flight segments to the queue", held)
        self.host.stop()
        log.info("stopped%s", f" after a failure (exit status {self.exit_code})" if self.exit_code else "")


EX_CONFIG = 78  # what to fix is the configuration, the checkpoint or the device: the unit's RestartPreventExitStatus


def check(s: Settings) -> int:
    """`daemon --check`: the configuration resolved (done by now), its devices are on this machine, its checkpoint's
    files read (`permanent_error`), and its queue opened read only within a few seconds (`jobs.queue.check`): 0, or
    78 (EX_CONFIG) with what fails in one line."""
    from jobs.queue import QueueError
    from jobs.queue.check import check_queue

    why = permanent_error(s)
    if why:
        error_line(f"config error: {why}")
        return EX_CONFIG
    try:
        queue = check_queue(s.paths.db)
    except QueueError as exc:
        error_line(f"config error: queue: {exc}")
        return EX_CONFIG
    print(f"config OK ({', '.join(s.config.sources) or 'built-in defaults'}); queue {queue}")
    return 0


def permanent_error(s: Settings) -> Optional[str]:
    """Why no start of these settings can succeed, found before anything loads (a device of model.device that is
    not on this machine, a checkpoint whose files do not read), or None."""
    from engines.catalog import Catalog
    from engines.device.detect import device_missing
    from engines.model.errors import TTSError

    for device in s.devices:
        why = device_missing(device)
        if why:
            named = s.config.model.device
            return (f"model.device = {named}{'' if named == device else f' ({device})'}: {why}; set model.device to "
                    "auto or cpu")
    try:
        if s.model and s.catalog is None:
            Catalog.from_dir(s.model, s.voices_dir)  # (raises what is wrong with it)
    except (TTSError, OSError, ValueError) as exc:
        return f"model.path = {s.model}: {exc}"
    return None


def start_failure(exc: BaseException) -> int:
    """The exit status of a start that failed with `exc`, its one line logged: 78 (EX_CONFIG, not restarted by the
    unit) when no retry can succeed (a checkpoint that does not load, a device that is not there, a configuration
    that does not work), else 1 (systemd tries again: the queue's database may come back, memory may free)."""
    from engines.model.errors import CheckpointError, DeviceNotFound, TTSError
    from jobs.queue import QueueError

    if isinstance(exc, (ConfigError, CheckpointError, DeviceNotFound)) or getattr(exc, "permanent", False):
        log.error("cannot start, and a restart would not help: %s; fix it, then start the service again "
                  "(systemctl start tts-appliance)", exc)
        return EX_CONFIG
    if isinstance(exc, (TTSError, QueueError, RuntimeError, OSError)):
        log.error("cannot start: %s", exc)
    else:  # a defect: its traceback goes to the log (at priority err under systemd), not raw to stderr
        log.exception("cannot start: internal error: %s: %s", type(exc).__name__, exc)
    return 1


def main(config_path: Optional[str] = None, instance: Optional[str] = None, check_only: bool = False) -> int:
    """Entry point used by `tts-appliance daemon`. Exit status 78 (EX_CONFIG) when no restart can help (a
    configuration that does not resolve, a device that is not there, a checkpoint that does not load), 1 for a
    start that fails otherwise (the installation, the queue), 0 after a stop."""
    try:
        cfg = resolve(config_path)
    except ConfigError as exc:
        error_line(f"config error: {exc}")
        return EX_CONFIG  # systemd shows it as a configuration problem
    setup_logging(cfg.service.log_level)
    if instance:
        cfg.service.runtime_dir = str(cfg.runtime_dir() / instance)
    try:
        s = settings(cfg, instance)  # an instance's device: appliance.settings.devices
    except ConfigError as exc:
        error_line(f"config error: {exc}")
        return EX_CONFIG
    from engines.load import code_error

    broken = code_error()
    if broken:
        error_line(f"error: {broken}; reinstall (./install.sh); `tts-appliance info` describes the installation")
        return 1
    if check_only:
        return check(s)
    log.info("config: %s", ", ".join(cfg.sources) or "built-in defaults")
    why = permanent_error(s)
    if why:
        error_line(f"config error: {why}; fix it, then start the service again (systemctl start tts-appliance)")
        return EX_CONFIG
    try:
        return Daemon(s, config_path, instance).run()
    except Exception as exc:
        return start_failure(exc)
