"""Synthesis in this process for the job commands: `work`, `watch`, and the worker behind
`submit --wait`, `retry --wait` and `redo`. The engine is the same EngineRunner the daemon uses
(`appliance.engine_host.load_runner`), with the batch size as its slots, driven by a
`jobs.worker.Worker` in this thread.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Optional

import click

from jobs.queue import TERMINAL, Queue

from appliance.cli_common import home_option, load_runner, model_options, settings


def engine_options(f):
    """The engine flags of in-process work (model, device, dtype, batch size, lease, guard)."""
    f = click.option("--guard/--no-guard", default=True, show_default=True,
                     help="Retry/fail segments whose audio is far too long/short for the text or silent.")(f)
    f = click.option("--lease-seconds", default=120.0, show_default=True,
                     help="Segment lease; a dead worker's segments return to the queue after this.")(f)
    f = click.option("--batch-size", default=8, show_default=True,
                     help="Segments per engine call (also the engine's slots).")(f)
    return model_options(f)


def spool(home, **flags):
    """(settings, spool paths) of a job command, no folder created; `flags` override the config
    (model, device, dtype)."""
    cfg = settings(home=home, **{k: flags.get(k) for k in ("model", "device", "dtype")})
    return cfg, cfg.home()


def open_queue(home, **flags):
    """(settings, spool paths, queue): `spool` with its folders created and the queue opened."""
    cfg, paths = spool(home, **flags)
    return cfg, paths.ensure(), Queue(paths.db)


def make_worker(cfg, paths, queue: Queue, eng: dict, runner=None):
    """A jobs Worker on `runner` (default: the engine of `cfg` with --batch-size slots). Jobs pinned
    to a model are claimed only when --model named it (as before: an unpinned worker takes any)."""
    from jobs.guard import guard_for
    from jobs.worker import Worker

    runner = runner or load_runner(cfg, eng["batch_size"])
    pinned = str(Path(eng["model"]).resolve()) if eng.get("model") else None
    return Worker(queue, runner, paths, batch_size=eng["batch_size"], guard=guard_for(eng["guard"], runner.engine),
                  lease_s=eng["lease_seconds"], model=pinned)


def run_until_finished(queue: Queue, worker, job_ids: list[str], progress: bool = True) -> None:
    """Work in-process until every job in `job_ids` is finished, with a tqdm bar and ETA."""
    from tqdm import tqdm

    def finished():
        return sum(queue.counts(j)[s] for j in job_ids for s in ("done", "failed", "cancelled"))

    total = sum(sum(queue.counts(j).values()) for j in job_ids)
    with tqdm(total=total, unit="seg", desc="synthesizing", disable=not progress, initial=finished()) as bar:
        try:
            while not all(queue.job(j)["state"] in TERMINAL for j in job_ids):
                worked = worker.run_once()
                bar.update(finished() - bar.n)
                if not worked:
                    time.sleep(0.5)  # leases of a stopped worker must expire first
        finally:
            worker.close()


def work_until_idle(queue: Queue, worker) -> None:
    """Work until no job this worker may take is queued or running (also waits out a dead worker's
    leases, of segments or of an assembly)."""
    try:
        while worker.run_once() or [j for j in queue.jobs(["queued", "running"])
                                    if j["model"] in (None, worker.model)]:
            if not queue.counts()["queued"]:
                time.sleep(0.5)
    finally:
        worker.close()


@click.command()
@click.option("--until-idle", is_flag=True, help="Exit when nothing is left to do.")
@engine_options
@home_option
def work(until_idle, home, **eng):
    """Run a worker: synthesize queued segments and assemble finished books (Ctrl-C stops)."""
    cfg, paths, queue = open_queue(home, **eng)
    worker = make_worker(cfg, paths, queue, eng)
    stop = threading.Event()
    try:
        if until_idle:
            work_until_idle(queue, worker)
        else:
            worker.run_forever(stop)
    except KeyboardInterrupt:
        stop.set()
        worker.close()


@click.command()
@click.option("--poll", is_flag=True, help="Poll the folder (network mounts) instead of inotify events.")
@click.option("--quiet-seconds", default=5.0, show_default=True, help="A file must be unchanged this long.")
@click.option("--work/--no-work", "do_work", default=True, show_default=True,
              help="Also run a worker in this process (needs a model).")
@engine_options
@home_option
def watch(poll, quiet_seconds, do_work, home, **eng):
    """Watch HOME/inbox: new books become jobs; results land in done/<job>/, failures in failed/."""
    from jobs.submit import checkpoint_voices, job_defaults
    from jobs.ingest.isolate import IngestLimits
    from jobs.watch import InboxWatcher

    cfg, paths, _ = open_queue(home, **eng)
    stop = threading.Event()
    if do_work:
        worker = make_worker(cfg, paths, Queue(paths.db), eng)
        threading.Thread(target=worker.run_forever, args=(stop,), daemon=True, name="worker").start()
    j = cfg.jobs
    defaults = job_defaults(j.voice, j.language, j.instruct, *checkpoint_voices(cfg.model.path), lexicon=j.lexicon)
    watcher = InboxWatcher(paths, quiet_s=quiet_seconds, polling=poll, defaults=defaults,
                           limits=IngestLimits.from_config(cfg.jobs))
    click.echo(f"watching {paths.inbox} (Ctrl-C stops)")
    try:
        watcher.run(stop)
    except KeyboardInterrupt:
        stop.set()


def finish_in_process(cfg, paths, queue: Queue, eng: dict, job_ids: list[str], progress: bool,
                      runner: Optional[object] = None) -> None:
    """`--wait`: work on `job_ids` in this process until they are finished."""
    run_until_finished(queue, make_worker(cfg, paths, queue, eng, runner), job_ids, progress=progress)
