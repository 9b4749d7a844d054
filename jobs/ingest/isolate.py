"""Ingestion in a child process under CPU-time, memory and wall-clock limits.

A user's file is parsed by ``python -m jobs.ingest.isolate``: the parent writes the path and the
options as JSON to a temporary file, the child's stdin, before it starts; the child limits itself
(RLIMIT_CPU, RLIMIT_AS, no core files, lower priority), reads the file and answers with the document
as JSON on stdout. The calling thread only
waits on the child, so a pathological file can neither stall the daemon's other threads nor take its
memory; a file over a limit fails with a reason that names the setting to raise. The daemon calls
:func:`cancel_all` when it stops, so no ingest outlives (or delays) it.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from jobs.document import Document
from jobs.errors import IngestError, JobError
from jobs.ingest import MAX_FILE_MB

log = logging.getLogger(__name__)

EXIT_MEMORY = 75  # the child ran out of its address-space limit
POLL_S = 0.1


class IngestCancelled(JobError):
    """The ingest was stopped from outside (the daemon is stopping); the file was not judged."""


@dataclass(frozen=True)
class IngestLimits:
    """Limits for parsing files (config: jobs.ingest_cpu_s, jobs.ingest_memory_mb, jobs.ingest_wall_s per
    file; jobs.max_file_mb the largest file; jobs.ingest_parallel files parsed at once by the inbox)."""

    cpu_s: float = 120.0
    memory_mb: int = 2048
    wall_s: float = 300.0
    file_mb: int = MAX_FILE_MB
    parallel: int = 2

    @classmethod
    def from_config(cls, jobs_section) -> "IngestLimits":
        """The limits of a config's `jobs` section (defaults for the keys it lacks)."""
        d = cls()
        return cls(cpu_s=float(getattr(jobs_section, "ingest_cpu_s", d.cpu_s)),
                   memory_mb=int(getattr(jobs_section, "ingest_memory_mb", d.memory_mb)),
                   wall_s=float(getattr(jobs_section, "ingest_wall_s", d.wall_s)),
                   file_mb=int(getattr(jobs_section, "max_file_mb", d.file_mb)),
                   parallel=int(getattr(jobs_section, "ingest_parallel", d.parallel)))


_live: dict[subprocess.Popen, threading.Event] = {}  # running children -> their cancel flag
_live_lock = threading.Lock()


def cancel_all() -> int:
    """Kill every running ingest child (daemon shutdown); their callers raise IngestCancelled."""
    with _live_lock:
        procs = list(_live.items())
    for proc, cancelled in procs:
        cancelled.set()
        _kill(proc)
    if procs:
        log.info("stopped %d running ingest(s)", len(procs))
    return len(procs)


def _kill(proc: subprocess.Popen) -> None:
    try:
        proc.kill()
    except OSError:  # already gone
        pass


def _options_json(options) -> dict:
    data = dataclasses.asdict(options)
    if data.get("allowed_roots") is not None:
        data["allowed_roots"] = [str(r) for r in data["allowed_roots"]]
    return data


def _child_command() -> tuple[list[str], dict]:
    root = str(Path(__file__).resolve().parents[2])  # the folder holding the `jobs` package
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return [sys.executable or "python3", "-m", "jobs.ingest.isolate"], env


def load_document_isolated(path: str | Path, options=None, limits: Optional[IngestLimits] = None,
                           cancel: Optional[threading.Event] = None) -> Document:
    """:func:`jobs.ingest.load_document` in a child process under `limits` (its file_mb caps the size).

    Raises IngestError for bad input or a file over a limit, IngestCancelled when `cancel` is set
    (or :func:`cancel_all` runs) before the child is done.
    """
    from jobs.ingest import IngestOptions

    path, limits = Path(path), limits or IngestLimits()
    options = dataclasses.replace(options or IngestOptions(), max_bytes=limits.file_mb << 20)
    request = json.dumps({"path": str(path), "options": _options_json(options),
                          "cpu_s": limits.cpu_s, "memory_mb": limits.memory_mb}).encode("utf-8")
    cmd, env = _child_command()
    cancelled = threading.Event()
    with tempfile.TemporaryFile() as stdin:  # the whole request is there before the child starts
        stdin.write(request)
        stdin.seek(0)
        proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                close_fds=True)
    with _live_lock:
        _live[proc] = cancelled
    try:
        out, err, timed_out = _wait(proc, limits.wall_s, cancel, cancelled)
    finally:
        with _live_lock:
            _live.pop(proc, None)
    if err.strip():
        log.info("ingest of %s said: %s", path.name, err.decode("utf-8", "replace").strip()[-2000:])
    if cancelled.is_set() or (cancel is not None and cancel.is_set()):
        raise IngestCancelled(f"reading {path.name} was stopped (the service is stopping); it is taken again later")
    if timed_out:
        raise IngestError(f"parsing {path.name} took longer than {limits.wall_s:g} s; "
                          "raise jobs.ingest_wall_s or split the file")
    return _answer(path, proc.returncode, out, limits)


def _wait(proc, wall_s: float, cancel, cancelled) -> tuple[bytes, bytes, bool]:
    """Collect (stdout, stderr, timed out), polling for cancellation and the wall-clock limit (the child is
    killed on either). The child's request is not written here: it reads it from a file (a poll that wakes
    late, past its timeout, must not keep it from the child)."""
    deadline = time.monotonic() + wall_s
    while True:
        try:
            out, err = proc.communicate(timeout=POLL_S)
            return out or b"", err or b"", False
        except subprocess.TimeoutExpired:
            pass
        stop = (cancel is not None and cancel.is_set()) or cancelled.is_set()
        if stop or time.monotonic() >= deadline:
            _kill(proc)
            out, err = proc.communicate()
            return out or b"", err or b"", not stop


def _answer(path: Path, code: int, out: bytes, limits: IngestLimits) -> Document:
    """The child's document, or the IngestError that explains its end."""
    if code == -signal.SIGXCPU:
        raise IngestError(f"parsing {path.name} used more than {limits.cpu_s:g} s of CPU time; "
                          "raise jobs.ingest_cpu_s or split the file")
    if code == -signal.SIGKILL:
        raise IngestError(f"parsing {path.name} was killed (over {limits.cpu_s:g} s of CPU time, or the machine "
                          "ran out of memory); raise jobs.ingest_cpu_s or split the file")
    if code == EXIT_MEMORY:
        raise IngestError(f"parsing {path.name} needed more than {limits.memory_mb} MB of memory; "
                          "raise jobs.ingest_memory_mb or split the file")
    try:
        reply = json.loads(out.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        reply = None
    if code != 0 or not isinstance(reply, dict):
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        raise IngestError(f"the reader for {path.name} crashed ({how}); see the service log, "
                          "and convert the file to plain text or EPUB if it keeps failing")
    if "error" in reply:
        raise IngestError(str(reply["error"]))
    try:
        return Document.from_dict(reply["document"])
    except (KeyError, TypeError, ValueError) as exc:
        raise IngestError(f"the reader for {path.name} gave a malformed answer ({exc}); see the service log")


# -- the child -------------------------------------------------------------------------------------
def _limit_self(cpu_s: float, memory_mb: int) -> None:
    import resource

    soft = max(1, math.ceil(cpu_s))
    resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 2))  # SIGXCPU at soft, SIGKILL at hard
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        os.nice(5)  # parsing yields to synthesis
    except OSError:
        pass


def main() -> int:
    """Child entry: one JSON request on stdin, one JSON answer on stdout."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")
    req = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    from jobs.ingest import IngestOptions, load_document

    opts = dict(req["options"])
    if opts.get("allowed_roots") is not None:
        opts["allowed_roots"] = [Path(r) for r in opts["allowed_roots"]]
    options = IngestOptions(**opts)
    _limit_self(float(req["cpu_s"]), int(req["memory_mb"]))
    try:
        try:
            reply = {"document": load_document(req["path"], options).to_dict()}
        except IngestError as exc:
            reply = {"error": str(exc)}
        except MemoryError:
            raise
        except Exception as exc:  # a reader bug: still a clear job error
            log.exception("reading %s failed", req["path"])
            reply = {"error": f"could not read {Path(req['path']).name}: {type(exc).__name__}: {exc}"}
        data = json.dumps(reply).encode("utf-8")
    except MemoryError:
        os._exit(EXIT_MEMORY)  # no allocation on this path: the limit is what failed
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
