"""Batch job commands: submit, status, list, cancel, retry, redo, logs, work, watch.

`register(cli_group)` adds them to the main `tts-appliance` group. The queue lives in the spool
folder chosen by `--home` / $TTS_APPLIANCE_HOME (default ~/.local/share/tts-appliance). Until the
daemon exists, `--wait` (and `work`) run the synthesis in this process. When a daemon serves the
spool folder, submit (without --wait/--model), status, list and cancel go through its API.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import click

from jobs.queue import TERMINAL, Queue, QueueError
from jobs.report import describe, job_summary
from jobs.settings import FORMATS, HOME_ENV, JobSpec, configured_model, resolve_home

log = logging.getLogger(__name__)


def _home_option(f):
    return click.option("--home", envvar=HOME_ENV, type=click.Path(file_okay=False),
                        help=f"Spool folder with queue.db, audio/, output/, inbox/ (env ${HOME_ENV}; "
                             "default ~/.local/share/tts-appliance).")(f)


def _json_option(f):
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(f)


def _engine_options(f):
    f = click.option("--model", type=click.Path(), help="Checkpoint folder (else $TTS_APPLIANCE_MODEL or "
                                                         "'model:' in HOME/config.yaml).")(f)
    f = click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")(f)
    f = click.option("--dtype", default="float32", show_default=True,
                     type=click.Choice(["float32", "bfloat16", "float16"]))(f)
    f = click.option("--batch-size", default=8, show_default=True, help="Segments per engine call.")(f)
    f = click.option("--lease-seconds", default=120.0, show_default=True,
                     help="Segment lease; a dead worker's segments return to the queue after this.")(f)
    f = click.option("--guard/--no-guard", default=True, show_default=True,
                     help="Retry/fail segments whose audio is far too long/short for the text or silent.")(f)
    return f


def _open(home):
    paths = resolve_home(home).ensure()
    return paths, Queue(paths.db)


def _emit(as_json: bool, data, text: str) -> None:
    click.echo(json.dumps(data, indent=2, default=str) if as_json else text)


def _fail(msg: str):
    raise click.ClickException(msg)


def _remote(home):
    """The running daemon's API client when one serves this spool folder, else None (work in-process)."""
    from appliance.client import daemon_client

    return daemon_client(home)


def _via(remote, fn, *args):
    from appliance.client import DaemonError

    try:
        return fn(*args)
    except DaemonError as exc:
        _fail(str(exc))


def load_engine(paths, opts: dict):
    """Load the TTS engine for in-process work (from the engine options)."""
    device, dtype = opts["device"], opts["dtype"]
    model = configured_model(paths, opts["model"])
    if not model:
        _fail(f"no model: pass --model PATH, set $TTS_APPLIANCE_MODEL or put 'model: PATH' in {paths.config}")
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    from engines.api import TTSEngine

    log.info("loading %s on %s (%s)", model, device, dtype)
    return TTSEngine.load(model, device=device, dtype=dtype)


def make_runner(paths, queue, engine, opts: dict):
    """A Runner from the engine options (batch_size, guard, lease_seconds, model)."""
    from jobs.guard import GuardSettings
    from jobs.worker import Worker

    explicit_model = opts["model"]
    return Worker(queue, engine, paths, batch_size=opts["batch_size"], guard=GuardSettings(enabled=opts["guard"]),
                  lease_s=opts["lease_seconds"],
                  model=str(Path(explicit_model).resolve()) if explicit_model else None)


def run_until_finished(queue: Queue, runner, job_ids: list[str], progress: bool = True) -> None:
    """Work in-process until every job in `job_ids` is finished, with a tqdm bar and ETA."""
    from tqdm import tqdm

    def finished():
        return sum(queue.counts(j)[s] for j in job_ids for s in ("done", "failed", "cancelled"))

    total = sum(sum(queue.counts(j).values()) for j in job_ids)
    with tqdm(total=total, unit="seg", desc="synthesizing", disable=not progress, initial=finished()) as bar:
        try:
            while not all(queue.job(j)["state"] in TERMINAL for j in job_ids):
                worked = runner.run_once()
                bar.update(finished() - bar.n)
                if not worked:
                    time.sleep(0.5)  # leases of a stopped worker must expire first
        finally:
            runner.close()


def register(cli_group: click.Group) -> None:
    """Add the job commands to `cli_group`."""

    @cli_group.command()
    @click.argument("files", nargs=-1, required=True, type=click.Path())
    @click.option("--voice", help="Speaker name (see the model's voices) or a saved voice file.")
    @click.option("--language", default="auto", show_default=True, help="Language name (e.g. english) or auto.")
    @click.option("--format", "fmt", default="flac", show_default=True, type=click.Choice(FORMATS))
    @click.option("--title", help="Book title (default: from the document or file name).")
    @click.option("--author", help="Book author (default: from the document).")
    @click.option("--priority", default=0, show_default=True, help="Higher runs first.")
    @click.option("--instruct", help="Style instruction / voice description, when the model takes one.")
    @click.option("--seed", default=0, show_default=True, help="Sampling seed of every segment.")
    @click.option("--max-new-tokens", type=int, help="Cap on generated frames per segment.")
    @click.option("--wait", is_flag=True, help="Work in this process until done, with a progress bar.")
    @_engine_options
    @_home_option
    @_json_option
    def submit(files, voice, language, fmt, title, author, priority, instruct, seed, max_new_tokens, wait,
               home, as_json, **eng):
        """Queue FILES (one job per file) and print the job ids."""
        from jobs.submit import SubmitError, check_voice, submit_file

        engine, model = None, eng["model"]
        remote = None if wait or model else _remote(home)  # a running daemon takes the files
        paths, queue = _open(home)
        if wait:
            engine = load_engine(paths, eng)
            from engines.model.errors import VoiceNotFound

            try:
                check_voice(engine, voice)
            except VoiceNotFound as exc:  # lists the voices; nothing is queued
                _fail(f"{exc} (nothing was queued)")
        sampling = {"max_new_tokens": max_new_tokens} if max_new_tokens else {}
        spec = JobSpec(voice=voice, language=language, format=fmt, title=title, author=author, priority=priority,
                       instruct=instruct, seed=seed, sampling=sampling,
                       model=str(Path(model).resolve()) if model else None)
        results = []
        for f in files:
            try:
                job_id, error = _via(remote, remote.submit_file, f, spec) if remote else submit_file(
                    queue, paths, f, spec)
            except SubmitError as exc:
                _fail(str(exc))
            results.append({"job_id": job_id, "file": f, "state": "failed" if error else "queued", "error": error})
            if error:
                click.echo(f"error: {error} (job {job_id})", err=True)
            elif not as_json:
                click.echo(job_id)
        ok = [r["job_id"] for r in results if not r["error"]]
        if wait and ok:
            runner = make_runner(paths, queue, engine, eng)
            run_until_finished(queue, runner, ok, progress=not as_json)
            for r in results:
                if not r["error"]:
                    s = job_summary(queue, r["job_id"])
                    r.update(state=s["state"], error=s["error"], output_dir=s["output_dir"])
                    if not as_json:
                        click.echo(describe(s))
        if as_json:
            click.echo(json.dumps(results, indent=2))
        if any(r["state"] not in ("queued", "done") for r in results):
            raise SystemExit(1)

    @cli_group.command()
    @click.argument("job_id")
    @_home_option
    @_json_option
    def status(job_id, home, as_json):
        """Show one job: state, progress, error and output folder."""
        remote = _remote(home)
        if remote:
            s = _via(remote, remote.job, job_id)
        else:
            _, queue = _open(home)
            s = _call(job_summary, queue, job_id)
        text = describe(s) + "".join(f"\n    segment {f['index']}: {f['error']}" for f in s["failed_segments"])
        _emit(as_json, s, text)

    @cli_group.command("list")
    @click.option("--state", "states", multiple=True, type=click.Choice(
        ["queued", "running", "done", "failed", "cancelled", "partial"]), help="Only jobs in this state (repeatable).")
    @_home_option
    @_json_option
    def list_jobs(states, home, as_json):
        """List jobs, oldest first."""
        remote = _remote(home)
        if remote:
            rows = _via(remote, remote.jobs, states)
        else:
            _, queue = _open(home)
            rows = [job_summary(queue, j["id"], failed_segments=False) for j in queue.jobs(states or None)]
        _emit(as_json, rows, "\n".join(describe(s) for s in rows) or "no jobs")

    @cli_group.command()
    @click.argument("job_id")
    @_home_option
    @_json_option
    def cancel(job_id, home, as_json):
        """Cancel a queued or running job (finished segment audio stays cached)."""
        remote = _remote(home)
        if remote:
            _via(remote, remote.cancel, job_id)
        else:
            _, queue = _open(home)
            _call(queue.cancel, job_id)
        _emit(as_json, {"id": job_id, "state": "cancelled"}, f"{job_id} cancelled")

    @cli_group.command()
    @click.argument("job_id")
    @click.option("--wait", is_flag=True, help="Work in this process until the job is finished.")
    @_engine_options
    @_home_option
    @_json_option
    def retry(job_id, wait, home, as_json, **eng):
        """Requeue the failed/cancelled segments of a job."""
        paths, queue = _open(home)
        n = _call(queue.retry, job_id)
        if wait:
            engine = load_engine(paths, eng)
            run_until_finished(queue, make_runner(paths, queue, engine, eng),
                               [job_id], progress=not as_json)
        s = job_summary(queue, job_id)
        _emit(as_json, {**s, "requeued": n}, f"{n} segments requeued\n{describe(s)}")

    @cli_group.command()
    @click.argument("job_id")
    @click.option("--segment", "index", required=True, type=int, help="Segment index (as in manifest.json).")
    @click.option("--seed", type=int, help="Seed for the new take (default: a random one).")
    @click.option("--wait/--no-wait", default=True, show_default=True,
                  help="Re-render and reassemble now in this process (else leave it to a worker).")
    @_engine_options
    @_home_option
    @_json_option
    def redo(job_id, index, seed, wait, home, as_json, **eng):
        """Re-render one segment of a job with another seed and reassemble the book."""
        paths, queue = _open(home)
        seed = _call(queue.redo, job_id, index, seed)
        if wait:
            engine = load_engine(paths, eng)
            run_until_finished(queue, make_runner(paths, queue, engine, eng),
                               [job_id], progress=not as_json)
        s = job_summary(queue, job_id)
        _emit(as_json, {**s, "segment": index, "seed": seed}, f"segment {index} seed {seed}\n{describe(s)}")

    @cli_group.command()
    @click.argument("job_id")
    @_home_option
    @_json_option
    def logs(job_id, home, as_json):
        """Show a job's log (submission, retries, failures, completion)."""
        _, queue = _open(home)
        _get(queue, job_id)
        rows = queue.events(job_id)
        text = "\n".join(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e['ts']))} {e['level']:<7} "
                         + (f"[segment {e['segment_idx']}] " if e["segment_idx"] is not None else "") + e["message"]
                         for e in rows)
        _emit(as_json, rows, text or "no log entries")

    @cli_group.command()
    @click.option("--until-idle", is_flag=True, help="Exit when nothing is left to do.")
    @_engine_options
    @_home_option
    def work(until_idle, home, **eng):
        """Run a worker: synthesize queued segments and assemble finished books (Ctrl-C stops)."""
        paths, queue = _open(home)
        engine = load_engine(paths, eng)
        runner = make_runner(paths, queue, engine, eng)
        stop = threading.Event()
        try:
            if until_idle:  # also waits out a dead worker's leases (segments or assembly)
                while runner.run_once() or [j for j in queue.jobs(["queued", "running"])
                                            if j["model"] in (None, runner.model)]:
                    if not queue.counts()["queued"]:
                        time.sleep(0.5)
                runner.close()
            else:
                runner.run_forever(stop)
        except KeyboardInterrupt:
            stop.set()
            runner.close()

    @cli_group.command()
    @click.option("--poll", is_flag=True, help="Poll the folder (network mounts) instead of inotify events.")
    @click.option("--quiet-seconds", default=5.0, show_default=True, help="A file must be unchanged this long.")
    @click.option("--work/--no-work", "do_work", default=True, show_default=True,
                  help="Also run a worker in this process (needs a model).")
    @_engine_options
    @_home_option
    def watch(poll, quiet_seconds, do_work, home, **eng):
        """Watch HOME/inbox: new books become jobs; results land in done/<job>/, failures in failed/."""
        from jobs.watch import InboxWatcher

        paths, queue = _open(home)
        stop = threading.Event()
        if do_work:
            engine = load_engine(paths, eng)
            runner = make_runner(paths, Queue(paths.db), engine, eng)
            threading.Thread(target=runner.run_forever, args=(stop,), daemon=True, name="worker").start()
        watcher = InboxWatcher(paths, quiet_s=quiet_seconds, polling=poll)
        click.echo(f"watching {paths.inbox} (Ctrl-C stops)")
        try:
            watcher.run(stop)
        except KeyboardInterrupt:
            stop.set()


def _get(queue: Queue, job_id: str) -> dict:
    return _call(queue.job, job_id)


def _call(fn, *args):
    try:
        return fn(*args)
    except QueueError as exc:
        _fail(str(exc))


def main() -> None:
    """`python -m appliance.cli_jobs ...`: the job commands on their own."""

    @click.group()
    @click.option("-v", "--verbose", count=True, help="More log output.")
    def group(verbose):
        logging.basicConfig(level=logging.WARNING - 10 * min(verbose, 2),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    register(group)
    group()


if __name__ == "__main__":
    main()
