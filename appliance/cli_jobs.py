"""Batch job commands: submit, status, list, cancel, retry, redo, logs (work and watch: cli_work).

The queue lives in the spool folder of the settings (`--home`, jobs.home of the config,
$TTS_APPLIANCE_HOME, default ~/.local/share/tts-appliance). When a daemon is configured
($TTS_APPLIANCE_SOCKET, http.socket) or runs for that folder, submit (without --wait/--model),
status, list and cancel go through its API (a configured daemon that does not answer is an error,
appliance.client); otherwise, and for `--wait`, the work is done in this process (appliance.cli_work).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import click

from jobs.queue import Queue, QueueError
from jobs.report import describe, job_summary
from jobs.settings import FORMATS, JobSpec, with_defaults
from jobs.submit import checkpoint_voices, job_defaults

from appliance.cli_common import emit, fail, home_option, json_option, known_voices, load_runner
from appliance.cli_work import engine_options, finish_in_process, open_queue, spool


def _remote(cfg, paths, note: bool = False):
    """The daemon's API client when one is configured ($TTS_APPLIANCE_SOCKET, http.socket) or runs
    for this spool folder; None when there is none (then, with `note`, say that the work stays in
    this spool folder). A configured daemon that does not answer stops the command."""
    from appliance.client import NO_DAEMON_ENV, DaemonUnreachable, daemon_client

    try:
        client = daemon_client(paths.home, cfg.http.socket or None)
    except DaemonUnreachable as exc:
        fail(str(exc))
    if client is None and note and os.environ.get(NO_DAEMON_ENV, "") in ("", "0"):
        click.echo(f"note: no daemon is configured ($TTS_APPLIANCE_SOCKET, http.socket) or running for "
                   f"{paths.home}; queued there in this process: a daemon serving that folder or "
                   "`tts-appliance work` will synthesize it", err=True)
    return client


def _daemon_or_queue(home):
    """The running daemon's API client, else the local queue (opened only then: the spool folder of a
    daemon may not be writable by this user)."""
    cfg, paths = spool(home)
    return _remote(cfg, paths) or Queue(paths.ensure().db)


def _call(fn, *args):
    """`fn(*args)` with queue and daemon errors as click errors."""
    from appliance.client import DaemonError

    try:
        return fn(*args)
    except (QueueError, DaemonError) as exc:
        fail(str(exc))


def _submit_each(files, spec, queue, paths, remote, as_json: bool, cfg, voices=None) -> list[dict]:
    """Submit each file (through `remote` with `spec` the options given, else to `queue` with `spec`
    a JobSpec, `voices` the engine's when known, under the ingest limits of the settings `cfg`); a file
    that cannot be sent stops the command before it is uploaded."""
    from jobs.ingest.isolate import IngestLimits
    from jobs.submit import SubmitError, submit_file

    results = []
    for f in files:
        try:
            job_id, error = (_call(remote.submit_file, f, spec, cfg.http.max_body_bytes) if remote
                             else submit_file(queue, paths, f, spec, voices, limits=IngestLimits.from_config(cfg.jobs)))
        except SubmitError as exc:
            fail(str(exc))
        results.append({"job_id": job_id, "file": f, "state": "failed" if error else "queued", "error": error})
        if error:
            click.echo(f"error: {error} (job {job_id})", err=True)
        elif not as_json:
            click.echo(job_id)
    return results


def _lexicon_file(path):
    """The entries of `--lexicon FILE` (None without one)."""
    from jobs.errors import LexiconError
    from jobs.normalize import Lexicon

    try:
        return dict(Lexicon.load(path).entries) if path else None
    except LexiconError as exc:
        fail(str(exc))


def _checked_runner(cfg, eng: dict, voice):
    """The engine for `--wait`, loaded before anything is queued: an unknown voice queues nothing."""
    from engines.model.errors import VoiceNotFound
    from jobs.submit import check_voice

    runner = load_runner(cfg, eng["batch_size"])
    try:
        check_voice(runner, voice)
    except VoiceNotFound as exc:  # lists the voices
        fail(f"{exc} (nothing was queued)")
    return runner


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option("--voice", help="Speaker name (see the model's voices) or a saved voice file.")
@click.option("--language", help="Language name (e.g. english) or auto (default: jobs.language of the config).")
@click.option("--format", "fmt", default="flac", show_default=True, type=click.Choice(FORMATS))
@click.option("--title", help="Book title (default: from the document or file name).")
@click.option("--author", help="Book author (default: from the document).")
@click.option("--priority", default=0, show_default=True, help="Higher runs first.")
@click.option("--instruct", help="Style instruction / voice description, when the model takes one "
                                 "(default: jobs.instruct of the config, VoiceDesign models).")
@click.option("--seed", default=0, show_default=True, help="Sampling seed of every segment.")
@click.option("--max-new-tokens", type=int, help="Cap on generated frames per segment.")
@click.option("--speed", type=float, default=1.0, show_default=True,
              help="Speaking speed 0.5-2.0 (time-stretched, pitch kept).")
@click.option("--chapters", help="Only these chapters, numbered as `preview` lists them (e.g. 1,3-5).")
@click.option("--lexicon", type=click.Path(dir_okay=False),
              help="Pronunciation lexicon of this job, a YAML file (word: what to say), over jobs.lexicon's.")
@click.option("--wait", is_flag=True, help="Work in this process until done, with a progress bar.")
@engine_options
@home_option
@json_option
def submit(files, voice, language, fmt, title, author, priority, instruct, seed, max_new_tokens, speed, chapters,
           lexicon, wait, home, as_json, **eng):
    """Queue FILES (one job per file) and print the job ids.

    Options not given come from the config (jobs.voice, jobs.language, jobs.instruct; a CustomVoice
    model without jobs.voice uses its first speaker). Submitting the same file content with the same
    options again gives the same job id. With a daemon configured ($TTS_APPLIANCE_SOCKET, http.socket)
    or running for the spool folder the file is uploaded to it (type and size checked first); a
    configured daemon that cannot be reached is an error."""
    cfg, paths = spool(home, **eng)
    remote = None if wait or eng["model"] else _remote(cfg, paths, note=True)  # a running daemon takes the files
    given = {"voice": voice, "language": language, "format": fmt, "title": title, "author": author,
             "priority": priority, "instruct": instruct, "seed": seed, "chapters": chapters, "speed": speed,
             "sampling": {"max_new_tokens": max_new_tokens} if max_new_tokens else None,
             "model": str(Path(eng["model"]).resolve()) if eng["model"] else None,
             "lexicon": _lexicon_file(lexicon)}
    given = {k: v for k, v in given.items() if v is not None}
    checkpoint = (None, []) if remote else checkpoint_voices(cfg.model.path)  # read once, without the weights
    try:
        spec = JobSpec.from_dict(given)  # e.g. a bad --chapters stops here, before anything is sent
        if not remote:  # the defaults of this process's settings, fitted to its checkpoint
            j = cfg.jobs
            spec = JobSpec.from_dict(with_defaults(given, job_defaults(j.voice, j.language, j.instruct,
                                                                       *checkpoint, lexicon=j.lexicon)))
    except ValueError as exc:
        fail(str(exc))
    queue = None if remote else Queue(paths.ensure().db)
    runner = _checked_runner(cfg, eng, spec.voice) if wait else None
    voices = None if remote else runner.voices if runner else known_voices(cfg, *checkpoint)
    results = _submit_each(files, given if remote else spec, queue, paths, remote, as_json, cfg, voices)
    ok = [r["job_id"] for r in results if not r["error"]]
    if wait and ok:
        finish_in_process(cfg, paths, queue, eng, ok, progress=not as_json, runner=runner)
        for r in results:
            if not r["error"]:
                s = job_summary(queue, r["job_id"])
                r.update(state=s["state"], error=s["error"], output_dir=s["output_dir"])
                if not as_json:
                    click.echo(describe(s))
    if as_json:
        emit(True, results, "")
    if any(r["state"] not in ("queued", "done") for r in results):
        raise SystemExit(1)


@click.command()
@click.argument("job_id")
@home_option
@json_option
def status(job_id, home, as_json):
    """Show one job: state, progress, error and output folder."""
    where = _daemon_or_queue(home)
    s = _call(job_summary, where, job_id) if isinstance(where, Queue) else _call(where.job, job_id)
    emit(as_json, s, describe(s) + "".join(f"\n    segment {f['index']}: {f['error']}" for f in s["failed_segments"]))


@click.command("list")
@click.option("--state", "states", multiple=True, type=click.Choice(
    ["queued", "running", "done", "failed", "cancelled", "partial"]), help="Only jobs in this state (repeatable).")
@home_option
@json_option
def list_jobs(states, home, as_json):
    """List jobs, oldest first."""
    where = _daemon_or_queue(home)
    if isinstance(where, Queue):
        rows = [job_summary(where, j["id"], failed_segments=False) for j in where.jobs(states or None)]
    else:
        rows = _call(where.jobs, states)
    emit(as_json, rows, "\n".join(describe(s) for s in rows) or "no jobs")


@click.command()
@click.argument("job_id")
@home_option
@json_option
def cancel(job_id, home, as_json):
    """Cancel a queued or running job (finished segment audio stays cached)."""
    _call(_daemon_or_queue(home).cancel, job_id)
    emit(as_json, {"id": job_id, "state": "cancelled"}, f"{job_id} cancelled")


@click.command()
@click.argument("job_id")
@click.option("--wait", is_flag=True, help="Work in this process until the job is finished.")
@engine_options
@home_option
@json_option
def retry(job_id, wait, home, as_json, **eng):
    """Requeue the failed/cancelled segments of a job."""
    cfg, paths, queue = open_queue(home, **eng)
    n = _call(queue.retry, job_id)
    if wait:
        finish_in_process(cfg, paths, queue, eng, [job_id], progress=not as_json)
    s = job_summary(queue, job_id)
    emit(as_json, {**s, "requeued": n}, f"{n} segments requeued\n{describe(s)}")


@click.command()
@click.argument("job_id")
@click.option("--segment", "index", required=True, type=int, help="Segment index (as in manifest.json).")
@click.option("--seed", type=int, help="Seed for the new take (default: a random one).")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Re-render and reassemble now in this process (else leave it to a worker).")
@engine_options
@home_option
@json_option
def redo(job_id, index, seed, wait, home, as_json, **eng):
    """Re-render one segment of a job with another seed and reassemble the book."""
    cfg, paths, queue = open_queue(home, **eng)
    seed = _call(queue.redo, job_id, index, seed)
    if wait:
        finish_in_process(cfg, paths, queue, eng, [job_id], progress=not as_json)
    s = job_summary(queue, job_id)
    emit(as_json, {**s, "segment": index, "seed": seed}, f"segment {index} seed {seed}\n{describe(s)}")


@click.command()
@click.argument("job_id")
@home_option
@json_option
def logs(job_id, home, as_json):
    """Show a job's log (submission, retries, failures, completion)."""
    _, _, queue = open_queue(home)
    _call(queue.job, job_id)
    rows = queue.events(job_id)
    text = "\n".join(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e['ts']))} {e['level']:<7} "
                     + (f"[segment {e['segment_idx']}] " if e["segment_idx"] is not None else "") + e["message"]
                     for e in rows)
    emit(as_json, rows, text or "no log entries")


COMMANDS = (submit, status, list_jobs, cancel, retry, redo, logs)
