"""What the spool folder keeps: `delete` (a job and its files) and `prune` (the retention, now).

With a daemon configured or running for the spool folder they go through its API (`DELETE /v1/jobs/{id}`,
`POST /v1/jobs/prune`: the daemon's workers stop a deleted job's segments at once, and it may write where
this user may not); otherwise on the local queue, as the other job commands (appliance.cli_jobs)."""
from __future__ import annotations

import click

from jobs.disk import mb

from appliance.cli_common import emit, home_option, json_option
from appliance.cli_jobs import _call, _remote
from appliance.cli_work import open_queue, spool


def _locally(home, fn):
    """`fn(queue, paths, cfg)` on the local queue (opened, its folders made), the queue closed after."""
    cfg, paths, queue = open_queue(home)
    try:
        return _call(fn, queue, paths, cfg)
    finally:
        queue.close()


@click.command()
@click.argument("job_id")
@home_option
@json_option
def delete(job_id, home, as_json):
    """Delete a job and its files: its outputs, its segments' audio, an uploaded document, its queue rows.

    A queued or running job is cancelled first. Files you gave (a document submitted by path, one dropped
    into the inbox) stay. Prints the space freed; --json: {"id", "deleted": true, "freed_bytes"}."""
    from jobs.deletion import delete_job

    cfg, paths = spool(home)
    remote = _remote(cfg, paths)
    if remote is not None:
        out = _call(remote.delete, job_id)
    else:
        out = _locally(home, lambda q, p, _: delete_job(q, p, job_id))
    emit(as_json, out, f"{job_id} deleted, {mb(out['freed_bytes'])} freed")


@click.command()
@home_option
@json_option
def prune(home, as_json):
    """Remove the working files of jobs that ended more than jobs.keep_work_days ago (default 7), now.

    The daemon does it at start and every hour. A job's working files are its segments' audio (what
    `redo` and `retry` need) and an uploaded document; its outputs stay, and so do its row and log.
    --json: {"jobs": [ids], "freed_bytes", "files"}."""
    from jobs.retention import prune as apply

    cfg, paths = spool(home)
    remote = _remote(cfg, paths)
    if remote is not None:
        out = _call(remote.prune)
    else:
        out = _locally(home, lambda q, p, c: apply(q, p, c.jobs.keep_work_days))
    emit(as_json, out, f"working files of {len(out['jobs'])} job(s) removed ({', '.join(out['jobs']) or 'none due'}), "
                       f"{out['files']} file(s), {mb(out['freed_bytes'])} freed")


COMMANDS = (delete, prune)
