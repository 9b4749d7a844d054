"""Batch job commands: submit, status, list, cancel, retry, redo, logs (work and watch: cli_work; delete and
prune: cli_spool).

The queue lives in the spool folder of the settings (`--home`, jobs.home of the config,
$TTS_APPLIANCE_HOME, default ~/.local/share/tts-appliance). When a daemon is configured
($TTS_APPLIANCE_SOCKET, http.socket) or runs for that folder, submit (without --model), status, list
and cancel go through its API (a configured daemon that does not answer is an error,
appliance.client), and `submit --wait` follows the daemon's work on the job through its event stream;
otherwise the work of `--wait` is done in this process (appliance.cli_work), as for retry and redo.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import click

from jobs.queue import Queue, QueueError
from jobs.report import describe, job_summary
from jobs.settings import FORMATS, JobSpec, with_defaults

from appliance.cli_common import emit, fail, home_option, json_option, run_settings
from appliance.cli_work import engine_options, finish_in_process, open_queue, spool


def _remote(cfg, paths, note: bool = False):
    """The daemon's API client when one is configured ($TTS_APPLIANCE_SOCKET, http.socket) or runs
    for this spool folder; None when there is none (then, with `note`, say that the work stays in
    this spool folder). A configured daemon that does not answer stops the command."""
    from appliance.client import NO_DAEMON_ENV, DaemonUnreachable, daemon_client

    try:
        client = daemon_client(paths.home, cfg.http.socket or None, on_wait=lambda m: click.echo(f"note: {m}", err=True))
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


def _no_queue(home, job_id: str):
    fail(f"no job {job_id!r}: no daemon serves this user and there is no queue in {spool(home)[1].home} "
         "(jobs.home; --home)")


def _look_up(home, remote, local, none):
    """What a reading command shows: `remote(client)` from the daemon when one serves (it may be the only
    one allowed to read its queue), else `local(queue)` from the local queue opened read-only, or `none`
    where no queue was made yet. A reading command never creates a spool folder or a queue."""
    cfg, paths = spool(home)
    client = _remote(cfg, paths)
    if client is not None:
        return _call(remote, client)
    with Queue.reading(paths.db) as queue:
        return none if queue is None else _call(local, queue)


def _call(fn, *args):
    """`fn(*args)` with queue and daemon errors as click errors."""
    from appliance.client import DaemonError

    try:
        return fn(*args)
    except (QueueError, DaemonError) as exc:
        fail(str(exc))


def _submit_each(files, send, as_json: bool) -> list[dict]:
    """Submit each file with `send(path)` -> (job id, error or None, the job's state: queued, or done, running
    ... for the job of an earlier submit of the same content and options); a file that cannot be sent stops
    the command before it is uploaded or queued."""
    from jobs.submit import SubmitError

    results = []
    for f in files:
        try:
            job_id, error, state = send(f)
        except SubmitError as exc:
            fail(str(exc))
        results.append({"job_id": job_id, "file": f, "state": state, "error": error})
        if error:
            click.echo(f"error: {error} (job {job_id})", err=True)
        elif not as_json:
            click.echo(job_id)
    return results


def _lexicon_file(path):
    """The entries of `--lexicon FILE` (None without one)."""
    from text.normalize.lexicon import Lexicon, LexiconError

    try:
        return dict(Lexicon.load(path).entries) if path else None
    except LexiconError as exc:
        fail(str(exc))


def follow(client, job_ids: list[str], progress: bool = True) -> dict:
    """`submit --wait` with a daemon: follow the daemon's work on `job_ids` through their event streams
    (GET /v1/jobs/{id}/events) until each is finished, with one progress bar over their segments and an
    ETA; nothing is synthesized here. Returns {job id: its final summary}. A stream that breaks or ends
    before its job (the daemon stopping) stops the command; the job goes on in the daemon."""
    import http.client

    from tqdm import tqdm

    from appliance.client import DaemonError

    latest, ended, broken = {}, {}, {}
    news = threading.Event()

    def read(job_id: str) -> None:
        try:
            for event, data in client.events(job_id):
                if event == "progress":
                    latest[job_id] = data["progress"]
                elif event == "end":
                    ended[job_id] = data["state"]
                news.set()
        except (OSError, DaemonError, http.client.HTTPException, ValueError) as exc:
            broken[job_id] = f"{type(exc).__name__}: {exc}"
        finally:
            news.set()

    readers = [threading.Thread(target=read, args=(j,), name=f"follow-{j}", daemon=True) for j in job_ids]
    for t in readers:
        t.start()
    try:
        with tqdm(total=0, unit="seg", desc="synthesizing (daemon)", disable=not progress) as bar:
            while any(t.is_alive() for t in readers) or news.is_set():
                news.wait(1.0)
                news.clear()
                counts = list(latest.values())
                bar.total = sum(p["total"] for p in counts)
                bar.update(sum(p["done"] + p["failed"] + p["cancelled"] for p in counts) - bar.n)
    except KeyboardInterrupt:
        click.echo(f"\nstopped following; the daemon goes on with {', '.join(job_ids)} "
                   "(tts-appliance status JOB)", err=True)
        raise
    lost = [j for j in job_ids if j not in ended]
    if lost:
        fail("; ".join(f"job {j}: {broken.get(j, 'the daemon ended its event stream before the job finished')}"
                       for j in lost) + ". The daemon goes on with the job when it runs: tts-appliance status JOB")
    return {j: _call(client.job, j) for j in job_ids}


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option("--voice", help="Speaker name (see the model's voices) or a saved voice file.")
@click.option("--language", help="Language name (e.g. english) or auto (default: jobs.language of the config).")
@click.option("--format", "fmt", default="flac", show_default=True, type=click.Choice(FORMATS),
              help="Audio format of the book, or epub: a narrated EPUB (EPUB 3 with Media Overlays), audio in mp3.")
@click.option("--title", help="Book title (default: from the document or file name).")
@click.option("--author", help="Book author (default: from the document).")
@click.option("--priority", default=0, show_default=True, help="Higher runs first.")
@click.option("--instruct", help="Style instruction / voice description, when the model takes one "
                                 "(default: jobs.instruct of the config, VoiceDesign models).")
@click.option("--seed", default=0, show_default=True, help="Sampling seed of every segment.")
@click.option("--max-new-tokens", type=int, help="Cap on generated frames per segment.")
@click.option("--speed", type=float, default=1.0, show_default=True,
              help="Speaking speed 0.25-4.0 (time-stretched, pitch kept; natural within 0.5-2.0).")
@click.option("--chapters", help="Only these chapters, numbered as `preview` lists them (e.g. 1,3-5).")
@click.option("--lexicon", type=click.Path(dir_okay=False),
              help="Pronunciation lexicon of this job, a YAML file (word: what to say), over jobs.lexicon's.")
@click.option("--wait", is_flag=True, help="Wait until done, with a progress bar: follows the daemon's work when "
                                         "one is configured or running, else works in this process.")
@engine_options
@home_option
@json_option
def submit(files, voice, language, fmt, title, author, priority, instruct, seed, max_new_tokens, speed, chapters,
           lexicon, wait, home, as_json, **eng):
    """Queue FILES (one job per file) and print the job ids.

    Options not given come from the config (jobs.voice, jobs.language, jobs.instruct; a CustomVoice
    model without jobs.voice uses its first speaker). Submitting the same file content with the same
    options again gives the same job id. With a daemon configured ($TTS_APPLIANCE_SOCKET, http.socket)
    or running for the spool folder the file is uploaded to it (type and size checked first) and
    `--wait` follows the daemon's work; a configured daemon that cannot be reached is an error.
    `--model` queues in the spool folder for work in this process (`--wait`) or by `tts-appliance work`."""
    cfg, paths = spool(home, **eng)
    remote = None if eng["model"] else _remote(cfg, paths, note=not wait)  # a running daemon takes the files
    given = {"voice": voice, "language": language, "format": fmt, "title": title, "author": author,
             "priority": priority, "instruct": instruct, "seed": seed, "chapters": chapters, "speed": speed,
             "sampling": {"max_new_tokens": max_new_tokens} if max_new_tokens else None,
             "model": str(Path(eng["model"]).resolve()) if eng["model"] else None,
             "lexicon": _lexicon_file(lexicon)}
    given = {k: v for k, v in given.items() if v is not None}
    if remote:
        _spec(given)  # e.g. a bad --chapters stops here, before anything is sent
        if wait:
            _note_daemon_settings(eng)
        def send(f):
            s = _call(remote.submit, f, given, cfg.http.max_body_bytes, lambda m: click.echo(f"note: {m}", err=True))
            return s["id"], s.get("submit_error"), s["state"]

        results = _submit_each(files, send, as_json)
        ok = [r["job_id"] for r in results if not r["error"]]
        final = follow(remote, ok, progress=not as_json) if wait and ok else {}
    else:
        s = run_settings(cfg, need_model=wait)
        spec = _spec(with_defaults(given, s.job_defaults))  # the defaults of these settings, fitted to the checkpoint
        queue = Queue(s.paths.ensure().db)
        results, final = _submit_here(files, spec, s, queue, wait, as_json)
    for r in results:
        if r["job_id"] in final:
            summary = final[r["job_id"]]
            r.update(state=summary["state"], error=summary["error"], output_dir=summary["output_dir"])
            if not as_json:
                click.echo(describe(summary))
    if as_json:
        emit(True, results, "")
    if any(r["error"] or r["state"] not in (("done",) if wait else ("queued", "running", "done")) for r in results):
        raise SystemExit(1)


def _spec(data: dict) -> JobSpec:
    """`data` as a JobSpec; a click error saying what is wrong (e.g. a bad --chapters)."""
    try:
        return JobSpec.from_dict(data)
    except ValueError as exc:
        fail(str(exc))


def _submit_here(files, spec: JobSpec, s, queue: Queue, wait: bool, as_json: bool) -> tuple[list, dict]:
    """Queue `files` in the spool folder of the settings `s`; with `wait`, start the engines first (a voice
    they do not have queues nothing) and work until the jobs are finished. -> (results, {job id: summary})."""
    from contextlib import nullcontext

    from appliance.compose import engines_here
    from engines.model.errors import VoiceNotFound
    from jobs.submit import check_voice, submit_file

    with engines_here(s) if wait else nullcontext() as host:
        if host is not None:
            try:
                check_voice(host.pool, spec.voice)
            except VoiceNotFound as exc:  # lists the voices
                fail(f"{exc} (nothing was queued)")
        where = host.pool if host is not None else s.catalog  # the voices a job may name, when known
        voices = where.voices if where is not None else None
        def send(f):
            job_id, error = submit_file(queue, s.paths, f, spec, voices, limits=s.ingest)
            return job_id, error, queue.job(job_id)["state"]

        results = _submit_each(files, send, as_json)
        ok = [r["job_id"] for r in results if not r["error"]]
        if not (wait and ok):
            return results, {}
        finish_in_process(s, queue, ok, progress=not as_json, host=host)
    return results, {j: job_summary(queue, j) for j in ok}


@click.command()
@click.argument("job_id")
@home_option
@json_option
def status(job_id, home, as_json):
    """Show one job: state, progress, error and output folder."""
    s = _look_up(home, lambda c: c.job(job_id), lambda q: job_summary(q, job_id), None) or _no_queue(home, job_id)
    emit(as_json, s, describe(s) + "".join(f"\n    segment {f['index']}: {f['error']}" for f in s["failed_segments"]))


@click.command("list")
@click.option("--state", "states", multiple=True, type=click.Choice(
    ["queued", "running", "done", "failed", "cancelled", "partial"]), help="Only jobs in this state (repeatable).")
@home_option
@json_option
def list_jobs(states, home, as_json):
    """List jobs, oldest first."""
    rows = _look_up(home, lambda c: c.jobs(states),
                    lambda q: [job_summary(q, j["id"], failed_segments=False) for j in q.jobs(states or None)], [])
    emit(as_json, rows, "\n".join(describe(s) for s in rows) or "no jobs")


@click.command()
@click.argument("job_id")
@home_option
@json_option
def cancel(job_id, home, as_json):
    """Cancel a queued or running job: its segments stop in the engine (the audio of those finished stays
    until jobs.keep_work_days has passed, or `tts-appliance delete JOB`)."""
    _call(_daemon_or_queue(home).cancel, job_id)
    emit(as_json, {"id": job_id, "state": "cancelled"}, f"{job_id} cancelled")


def _note_daemon_settings(eng: dict) -> None:
    """Say that the engine flags given (`eng`) do not reach a daemon that does the work."""
    ignored = [f"--{k.replace('_', '-')}" for k, v in eng.items() if v is not None]
    if ignored:
        click.echo(f"note: {', '.join(ignored)} apply to work in this process; the daemon works with its "
                   "own settings", err=True)


def _through_daemon(home, eng: dict, wait: bool):
    """The running daemon's client when a retry or redo should go to it (one is configured or runs for the
    spool folder and no --model asks for work in this process), else None. The daemon's engines do the work:
    a second engine in this process would compete for its accelerator."""
    cfg, paths = spool(home, **eng)
    remote = None if eng.get("model") else _remote(cfg, paths)
    if remote is not None and wait:
        _note_daemon_settings(eng)
    return remote


def _after(remote, job_id: str, wait: bool, as_json: bool, answer: dict) -> dict:
    """A daemon's answer to retry/redo, followed to the job's end with --wait (summary as `job_summary`)."""
    if wait:
        return follow(remote, [job_id], progress=not as_json)[job_id]
    return answer


@click.command()
@click.argument("job_id")
@click.option("--wait", is_flag=True, help="Wait until the job is finished: follows the daemon's work when one "
              "runs, else works in this process.")
@engine_options
@home_option
@json_option
def retry(job_id, wait, home, as_json, **eng):
    """Requeue the failed/cancelled segments of a job."""
    remote = _through_daemon(home, eng, wait)
    if remote is not None:
        answer = _call(remote.retry, job_id)
        n, s = answer["requeued"], _after(remote, job_id, wait, as_json, answer)
    else:
        cfg, _, queue = open_queue(home, **eng)
        n = _call(queue.retry, job_id)
        if wait:
            finish_in_process(run_settings(cfg, need_model=True), queue, [job_id], progress=not as_json)
        s = job_summary(queue, job_id)
    s = {k: v for k, v in s.items() if k not in ("requeued", "segment", "seed")}
    emit(as_json, {**s, "requeued": n}, f"{n} segments requeued\n{describe(s)}")


@click.command()
@click.argument("job_id")
@click.option("--segment", "index", required=True, type=int, help="Segment index (as in manifest.json).")
@click.option("--seed", type=int, help="Seed for the new take (default: a random one).")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until the book is reassembled: follows the daemon's work when one runs, else re-renders "
                   "in this process (--no-wait: leave it to the daemon or a worker).")
@engine_options
@home_option
@json_option
def redo(job_id, index, seed, wait, home, as_json, **eng):
    """Re-render one segment of a job with another seed and reassemble the book."""
    remote = _through_daemon(home, eng, wait)
    if remote is not None:
        answer = _call(remote.redo, job_id, index, seed)
        seed, s = answer["seed"], _after(remote, job_id, wait, as_json, answer)
    else:
        cfg, _, queue = open_queue(home, **eng)
        seed = _call(queue.redo, job_id, index, seed)
        if wait:
            finish_in_process(run_settings(cfg, need_model=True), queue, [job_id], progress=not as_json)
        s = job_summary(queue, job_id)
    s = {k: v for k, v in s.items() if k not in ("requeued", "segment", "seed")}
    emit(as_json, {**s, "segment": index, "seed": seed}, f"segment {index} seed {seed}\n{describe(s)}")


@click.command()
@click.argument("job_id")
@home_option
@json_option
def logs(job_id, home, as_json):
    """Show a job's log (submission, retries, failures, completion)."""
    def local(queue):
        queue.job(job_id)  # QueueError naming the job when there is none
        return queue.events(job_id)

    rows = _look_up(home, lambda c: c.log(job_id), local, None)
    if rows is None:
        _no_queue(home, job_id)
    text = "\n".join(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e['ts']))} {e['level']:<7} "
                     + (f"[segment {e['segment_idx']}] " if e["segment_idx"] is not None else "") + e["message"]
                     for e in rows)
    emit(as_json, rows, text or "no log entries")


COMMANDS = (submit, status, list_jobs, cancel, retry, redo, logs)
