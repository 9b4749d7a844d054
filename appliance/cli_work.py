"""Synthesis in this process for the job commands: `work`, `watch`, and the worker behind
`submit --wait` (without a daemon), `retry --wait` and `redo`. Engines, worker, watcher and, for `work` and
`watch`, the retention (jobs.keep_work_days) are the daemon's, built by `appliance.compose` from the same
settings (appliance.settings); the command's flags only override config keys (`appliance.cli_common.settings`).
"""
from __future__ import annotations

import threading
import time

import click

from jobs.queue import TERMINAL, Queue

from appliance.cli_common import home_option, model_options, run_settings, settings


def worker_options(f):
    """The queue worker's flags: override jobs.batch_size, jobs.lease_s and jobs.guard of the config."""
    f = click.option("--guard/--no-guard", default=None,
                     help="Retry/fail segments whose audio is far too long/short for the text or silent "
                          "(default: jobs.guard of the config, on).")(f)
    f = click.option("--lease-seconds", type=float,
                     help="Segment lease; a dead worker's segments return to the queue after this "
                          "(default: jobs.lease_s of the config, 120).")(f)
    return click.option("--batch-size", type=click.IntRange(min=0),
                        help="Segments kept in flight (default: jobs.batch_size of the config; 0: the engines' "
                             "slots, runtime.max_slots).")(f)


def engine_options(f):
    """The flags of in-process work: model, device, dtype and the worker's."""
    return model_options(worker_options(f))


def spool(home, **flags):
    """(configuration, spool paths) of a job command, no folder created; `flags` override the config."""
    cfg = settings(home=home, **flags)
    return cfg, cfg.home()


def open_queue(home, **flags):
    """(configuration, spool paths, queue): `spool` with its folders created and the queue opened."""
    cfg, paths = spool(home, **flags)
    return cfg, paths.ensure(), Queue(paths.db)


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
def work(until_idle, home, **flags):
    """Run a worker: synthesize queued segments and assemble finished books (Ctrl-C stops). Finished jobs' working
    files go after jobs.keep_work_days, as the daemon does it: at the start and every hour."""
    from appliance.compose import engines_here, make_worker, retention_here

    s = run_settings(need_model=True, home=home, **flags)
    queue = Queue(s.paths.ensure().db)
    with retention_here(s), engines_here(s) as host:
        worker = make_worker(s, host, queue)
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
@click.option("--poll/--no-poll", default=None,
              help="Poll the folder (network mounts) instead of inotify events (default: jobs.watch_poll).")
@click.option("--quiet-seconds", type=float,
              help="A file must be unchanged this long (default: jobs.watch_quiet_s of the config, 5).")
@click.option("--work/--no-work", "do_work", default=True, show_default=True,
              help="Also run a worker in this process (needs a model).")
@engine_options
@home_option
def watch(do_work, home, **flags):
    """Watch HOME/inbox: new books become jobs; results land in done/<job>/, failures in failed/. Finished jobs'
    working files go after jobs.keep_work_days, as the daemon does it: at the start and every hour."""
    from contextlib import nullcontext

    from appliance.compose import engines_here, make_watcher, make_worker, retention_here

    s = run_settings(need_model=do_work, home=home, **flags)
    s.paths.ensure()
    stop = threading.Event()
    with retention_here(s), engines_here(s) if do_work else nullcontext() as host:
        if host is not None:
            worker = make_worker(s, host)
            threading.Thread(target=worker.run_forever, args=(stop,), daemon=True, name="worker").start()
        watcher = make_watcher(s, host)
        click.echo(f"watching {s.paths.inbox} (Ctrl-C stops)")
        try:
            watcher.run(stop)
        except KeyboardInterrupt:
            stop.set()


def finish_in_process(s, queue: Queue, job_ids: list[str], progress: bool, host=None) -> None:
    """`--wait` without a daemon: work on `job_ids` in this process until they are finished, on `host`
    (engines started already) or on the engines of the settings `s`."""
    from contextlib import nullcontext

    from appliance.compose import engines_here, make_worker

    with nullcontext(host) if host is not None else engines_here(s) as h:
        run_until_finished(queue, make_worker(s, h, queue), job_ids, progress=progress)
