"""Small synchronous client of the daemon's HTTP API over its Unix socket (stdlib only).

The CLI job commands use it when a daemon serves them: `daemon_client(home, socket)` takes the
socket of $TTS_APPLIANCE_SOCKET, else http.socket of the config, else the one a running daemon
announced in HOME/daemon*.json, and checks `/health`. A daemon that is configured (or announced
by a live process) but does not answer is an error (DaemonUnreachable: socket path, the reason,
what to do), never a silent switch to work in this process; None means no daemon is configured
or running (the CLI then works in-process and says so). $TTS_APPLIANCE_NO_DAEMON=1 always works
in-process.
"""
from __future__ import annotations

import grp
import http.client
import json
import logging
import os
import select
import socket
import stat
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

SOCKET_ENV = "TTS_APPLIANCE_SOCKET"
ANSWER_S = 5.0  # a running daemon answers /health at once
SUBMIT_MARGIN_S = 120.0  # a submit's answer, beyond the daemon's ingest limit: upload, segmenting, queueing
READING_NOTE_S = 10.0  # a submit not answered by then is said to wait on the daemon reading the document
POLL_S = 0.5  # how often a resubmit looks whether the earlier submit's job is queued
START_WAIT_S = 600.0  # a daemon that is starting may load and warm up a model that long (the unit's TimeoutStartSec)
NO_DAEMON_ENV = "TTS_APPLIANCE_NO_DAEMON"
log = logging.getLogger(__name__)


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


class DaemonError(Exception):
    def __init__(self, status: int, message: str, body=None):
        super().__init__(message)
        self.status, self.body = status, body


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.socket_path)
        self.sock = s


class DaemonClient:
    def __init__(self, socket_path: str, timeout: float = 60.0):
        self.socket_path, self.timeout = socket_path, timeout
        self.health: dict = {}  # the daemon's /health answer (daemon_client fills it)

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                timeout: Optional[float] = None, slow: Optional[tuple[float, Callable[[], None]]] = None):
        """The daemon's answer (JSON decoded); `slow` (seconds, say): `say()` once when the request is sent
        and no answer has begun after that long (the wait goes on up to `timeout`)."""
        conn = _UnixConnection(self.socket_path, timeout or self.timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            if slow is not None and not select.select([conn.sock], [], [], slow[0])[0]:
                slow[1]()
            resp = conn.getresponse()
            return _answer(resp, resp.read())
        finally:
            conn.close()

    def read_health(self, timeout: float = 5.0) -> dict:
        """/health, also when the daemon answers 503 because a part of it is down (`down` in the answer:
        it still serves; a warning names the part)."""
        try:
            return self.request("GET", "/health", timeout=timeout)
        except DaemonError as exc:
            if exc.status == 503 and isinstance(exc.body, dict) and exc.body.get("down"):
                log.warning("the daemon at %s is degraded: %s", self.socket_path,
                            "; ".join(f"{k} down ({v})" for k, v in exc.body["down"].items()))
                return exc.body
            raise

    def json(self, method: str, path: str, payload=None):
        body = json.dumps(payload).encode() if payload is not None else None
        return self.request(method, path, body, {"Content-Type": "application/json"} if body else None)

    # -- what the CLI needs ----------------------------------------------------------------------
    def submit_file(self, path, spec, max_body_bytes: Optional[int] = None) -> tuple[str, Optional[str]]:
        """Upload one file as a job; returns (job id, error or None) like jobs.submit.submit_file (`submit`)."""
        s = self.submit(path, spec, max_body_bytes)
        return s["id"], s.get("submit_error")

    def submit(self, path, spec, max_body_bytes: Optional[int] = None,
               on_wait: Optional[Callable[[str], None]] = None) -> dict:
        """Upload one file as a job; returns the daemon's job summary (its `state`; `submit_error`: why the
        file could not become a job, else None). `spec`: the options the user gave (a mapping: what it leaves
        out, the daemon's job defaults fill in) or a JobSpec. Before anything is sent, a file the daemon would
        refuse raises SubmitError: a type ingestion cannot read, larger than the daemon reads (its
        jobs.max_file_mb, from /health), or larger than it takes as an upload (http.max_body_bytes, from
        /health, else `max_body_bytes`).

        The daemon reads the document before it answers, for up to its jobs.ingest_wall_s (from /health):
        the answer is awaited that long and SUBMIT_MARGIN_S more, `on_wait` told once when it is slow.
        The same content with the same options still being read for an earlier submit: its job is awaited
        as long (a job id is returned only once its job exists). SubmitError, saying what to do, when the
        wait ends first."""
        from jobs.ingest.isolate import IngestLimits
        from jobs.settings import JobSpec
        from jobs.submit import SubmitError, precheck_type

        p = Path(path)
        precheck_type(p)
        spec_json = spec.to_json() if isinstance(spec, JobSpec) else json.dumps(spec)
        boundary = uuid.uuid4().hex
        name = p.name.replace('"', "_")
        head = (f'--{boundary}\r\nContent-Disposition: form-data; name="spec"\r\n'
                f"Content-Type: application/json\r\n\r\n{spec_json}\r\n"
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
                f"Content-Type: application/octet-stream\r\n\r\n").encode()
        tail = f"\r\n--{boundary}--\r\n".encode()
        limits = self.health.get("limits") or {}
        limit, readable = limits.get("max_body_bytes") or max_body_bytes, limits.get("max_file_bytes")
        size = p.stat().st_size
        if readable and size > readable:  # no route takes it (upload, path, inbox): say which key to raise
            raise SubmitError(f"{p.name} is {_size(size)}; the daemon reads documents up to {_size(readable)} "
                              "(jobs.max_file_mb): raise jobs.max_file_mb (and http.max_body_bytes to upload it) "
                              "in the daemon's config, or split the file")
        if limit and len(head) + size + len(tail) > limit:
            raise SubmitError(f"{p.name} is {_size(size)}; the daemon takes uploads up to {_size(limit)} "
                              "(http.max_body_bytes, with the request's own few hundred bytes): raise http.max_body_bytes in the daemon's config, or put "
                              "the file in a folder of jobs.allowed_dirs and submit it by path (POST /v1/jobs "
                              '{"path": ...}) or drop it into the inbox')
        say = on_wait or _say_waiting
        wall = float(limits.get("ingest_wall_s") or IngestLimits().wall_s)
        wait = wall + SUBMIT_MARGIN_S
        try:
            s = self.request("POST", "/v1/jobs", head + p.read_bytes() + tail,
                             {"Content-Type": f"multipart/form-data; boundary={boundary}"}, timeout=wait,
                             slow=(READING_NOTE_S, lambda: say(
                                 f"the daemon is reading {p.name} (a document may take up to {wall:g} s: "
                                 f"jobs.ingest_wall_s); waiting for its answer up to {wait:.0f} s (Ctrl-C stops "
                                 "waiting; the daemon goes on, and the same submit again gives its job)")))
        except TimeoutError:
            raise SubmitError(
                f"the daemon has not answered the submit of {p.name} in {wait:.0f} s: it may still be reading it "
                f"(it reads a document for up to {wall:g} s, jobs.ingest_wall_s) or be stuck (systemctl status "
                "tts-appliance, journalctl -u tts-appliance); submit the same file again later: the same content "
                "with the same options gives the job it became") from None
        except DaemonError as exc:
            if exc.status in (400, 413, 415):
                raise SubmitError(str(exc)) from None
            raise
        if s.get("state") == "ingesting":
            s = self._earlier_job(s["id"], p.name, wait, say)
        return s

    def _earlier_job(self, job_id: str, name: str, wait: float, say: Callable[[str], None]) -> dict:
        """The job of an earlier submit of the same content and options, which the daemon is still reading:
        awaited up to `wait` seconds (SubmitError then), as the daemon's submit answers it."""
        say(f"{name}: the daemon is still reading the same content with the same options for an earlier submit; "
            f"waiting for its job up to {wait:.0f} s (Ctrl-C stops waiting; the daemon goes on)")
        deadline = time.monotonic() + wait
        while True:
            try:
                s = self.job(job_id)
                return {**s, "submit_error": s.get("error") if s["state"] == "failed" else None, "existing": True}
            except DaemonError as exc:
                if exc.status != 404:
                    raise
            if time.monotonic() >= deadline:
                from jobs.submit import SubmitError

                raise SubmitError(f"the daemon is still reading {name} for an earlier submit of the same content "
                                  f"and options after {wait:.0f} s; submit it again later to get its job "
                                  "(tts-appliance list shows it once it is queued)")
            time.sleep(POLL_S)

    def job(self, job_id: str) -> dict:
        return self.json("GET", f"/v1/jobs/{job_id}")

    def jobs(self, states=None) -> list:
        query = "&".join(f"state={s}" for s in states or ())
        return self.json("GET", "/v1/jobs" + (f"?{query}" if query else ""))

    def log(self, job_id: str) -> list:
        """The job's log entries, oldest first (GET /v1/jobs/{id}/log)."""
        return self.json("GET", f"/v1/jobs/{job_id}/log")

    def cancel(self, job_id: str) -> dict:
        """Cancel a job; it and its files stay (POST /v1/jobs/{id}/cancel)."""
        return self.json("POST", f"/v1/jobs/{job_id}/cancel", {})

    def delete(self, job_id: str) -> dict:
        """The job and its files, gone (DELETE /v1/jobs/{id}): {"id", "deleted": true, "freed_bytes"}."""
        return self.json("DELETE", f"/v1/jobs/{job_id}")

    def prune(self) -> dict:
        """The retention applied now (POST /v1/jobs/prune): {"jobs", "freed_bytes", "files"}."""
        return self.json("POST", "/v1/jobs/prune", {})

    def retry(self, job_id: str) -> dict:
        return self.json("POST", f"/v1/jobs/{job_id}/retry", {})

    def redo(self, job_id: str, index: int, seed: Optional[int] = None) -> dict:
        return self.json("POST", f"/v1/jobs/{job_id}/segments/{index}/redo", {} if seed is None else {"seed": seed})

    def events(self, job_id: str):
        """A job's progress as the daemon sends it (GET /v1/jobs/{id}/events, Server-Sent Events): yields
        (event, data) with the data decoded from JSON: ("progress", job summary) whenever it changes,
        ("log", log line), ("end", {"state": ...}) when the job is finished; the stream ends after "end", or
        earlier when the daemon stops. DaemonError for an unknown job; OSError (a timeout among them) when
        the daemon goes away or sends nothing, not even its keep-alive, for the client's timeout."""
        conn = _UnixConnection(self.socket_path, self.timeout)
        try:
            conn.request("GET", f"/v1/jobs/{job_id}/events", headers={"Accept": "text/event-stream"})
            resp = conn.getresponse()
            if resp.status != 200:
                _answer(resp, resp.read())
            event, data = "message", []
            while line := resp.readline():
                line = line.decode("utf-8").rstrip("\r\n")
                if not line:  # a blank line ends an event
                    if data:
                        yield event, json.loads("\n".join(data))
                    event, data = "message", []
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
        finally:
            conn.close()


def _answer(resp, raw: bytes):
    """The body of a daemon's answer (JSON decoded); DaemonError with its message for an error status
    (422, a submit the daemon refused, is an answer)."""
    data = json.loads(raw) if raw and resp.getheader("Content-Type", "").startswith("application/json") else raw
    if resp.status >= 400 and resp.status != 422:
        msg = data.get("error", {}).get("message") if isinstance(data, dict) else None
        raise DaemonError(resp.status, msg or f"daemon answered HTTP {resp.status}", data)
    return data


class DaemonUnreachable(Exception):
    """A daemon is configured (or announced and alive) but cannot be reached; the message says why
    and what to do. The CLI stops: work is never queued elsewhere behind the user's back."""


def _why(path: str, exc: BaseException) -> str:
    """What went wrong connecting to `path`, and what to do about it."""
    if isinstance(exc, PermissionError):
        try:
            st = os.stat(path)
            group = grp.getgrgid(st.st_gid).gr_name
        except (OSError, KeyError):
            return ("permission denied; ask the administrator for access to the daemon's socket (its group, "
                    "then log in again)")
        return (f"permission denied: the socket belongs to group {group!r} (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"add yourself to group {group}: sudo usermod -aG {group} $USER, then log in again")
    if isinstance(exc, FileNotFoundError):
        return "no such socket: is the daemon running? (systemctl status tts-appliance)"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused: nothing listens there (the daemon stopped or crashed; systemctl status tts-appliance)"
    if isinstance(exc, DaemonError):
        return f"it answered /health with HTTP {exc.status}: {exc}"
    return f"{type(exc).__name__}: {exc}"


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


def _say_waiting(message: str) -> None:
    log.warning("%s", message)


def connect(path: str, origin: str, on_wait: Callable[[str], None] = _say_waiting) -> DaemonClient:
    """A client of the daemon at `path` that answered /health; DaemonUnreachable naming `origin`
    (where the path came from) otherwise. A socket that takes the connection but stays silent belongs to a
    daemon that is starting (systemd's socket activation starts it on this very connection; loading a model
    takes a while): `on_wait` is told once, then the answer is awaited up to START_WAIT_S."""
    client = DaemonClient(path)
    try:
        try:
            client.health = client.read_health(ANSWER_S)
        except TimeoutError:
            on_wait(f"the daemon at {path} took the connection but has not answered yet: it is starting "
                    f"(socket activation; loading the model). Waiting up to {START_WAIT_S:.0f} s (Ctrl-C stops "
                    "waiting; systemctl status tts-appliance shows it)")
            client.health = client.read_health(START_WAIT_S)
    except (OSError, DaemonError, http.client.HTTPException) as exc:
        raise DaemonUnreachable(
            f"cannot reach the tts-appliance daemon at {path} ({origin}): {_why(path, exc)}. Nothing was done; "
            f"to work in this process instead, set {NO_DAEMON_ENV}=1") from None
    return client


def daemon_client(home, configured_socket: Optional[str] = None,
                  on_wait: Callable[[str], None] = _say_waiting) -> Optional[DaemonClient]:
    """The daemon to use for the spool folder `home` (see the module docstring): the socket of
    $TTS_APPLIANCE_SOCKET, else `configured_socket` (http.socket of the config), else the one a
    live daemon announced in HOME/daemon*.json. None only when no daemon is configured or running;
    DaemonUnreachable when one is but does not answer."""
    if os.environ.get(NO_DAEMON_ENV, "") not in ("", "0"):
        return None
    if os.environ.get(SOCKET_ENV):
        return connect(os.environ[SOCKET_ENV], f"${SOCKET_ENV}", on_wait)
    if configured_socket:
        return connect(str(configured_socket), "http.socket of the config", on_wait)
    for f in sorted(Path(home).glob("daemon*.json")):
        try:
            info = json.loads(f.read_text(encoding="utf-8"))
            path, pid = info["socket"], info.get("pid")
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not path:
            continue
        try:
            return connect(path, f"announced in {f}", on_wait)
        except DaemonUnreachable:
            if _alive(pid):
                raise
            log.info("%s is left from a daemon that is gone (pid %s); ignored", f, pid)
    return None
