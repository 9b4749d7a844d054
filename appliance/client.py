"""Small synchronous client of the daemon's HTTP API over its Unix socket (stdlib only).

The CLI job commands use it when a daemon serves the spool folder: `daemon_client(home)` finds the
socket through $TTS_APPLIANCE_SOCKET or the HOME/daemon*.json file the daemon writes at start-up,
checks `/health`, and returns None when no daemon answers (the CLI then works in-process).
Set $TTS_APPLIANCE_NO_DAEMON=1 to always work in-process.
"""
from __future__ import annotations

import http.client
import json
import os
import socket
import uuid
from pathlib import Path
from typing import Optional

SOCKET_ENV = "TTS_APPLIANCE_SOCKET"
NO_DAEMON_ENV = "TTS_APPLIANCE_NO_DAEMON"


class DaemonError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


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

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                timeout: Optional[float] = None):
        conn = _UnixConnection(self.socket_path, timeout or self.timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        data = json.loads(raw) if raw and resp.getheader("Content-Type", "").startswith("application/json") else raw
        if resp.status >= 400 and resp.status != 422:
            msg = data.get("error", {}).get("message") if isinstance(data, dict) else None
            raise DaemonError(resp.status, msg or f"daemon answered HTTP {resp.status}")
        return data

    def json(self, method: str, path: str, payload=None):
        body = json.dumps(payload).encode() if payload is not None else None
        return self.request(method, path, body, {"Content-Type": "application/json"} if body else None)

    # -- what the CLI needs ----------------------------------------------------------------------
    def submit_file(self, path, spec) -> tuple[str, Optional[str]]:
        """Upload one file as a job with its JobSpec (the `spec` part: `spec.to_json()`); returns
        (job id, error or None) like jobs.submit.submit_file."""
        from jobs.submit import SubmitError

        p = Path(path)
        if not p.is_file():
            raise SubmitError(f"{p}: no such file")
        boundary = uuid.uuid4().hex
        name = p.name.replace('"', "_")
        body = (f'--{boundary}\r\nContent-Disposition: form-data; name="spec"\r\n'
                f"Content-Type: application/json\r\n\r\n{spec.to_json()}\r\n".encode()
                + f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
                  f"Content-Type: application/octet-stream\r\n\r\n".encode() + p.read_bytes()
                + f"\r\n--{boundary}--\r\n".encode())
        try:
            s = self.request("POST", "/v1/jobs", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"})
        except DaemonError as exc:
            if exc.status == 400:
                raise SubmitError(str(exc)) from None
            raise
        return s["id"], s.get("submit_error")

    def job(self, job_id: str) -> dict:
        return self.json("GET", f"/v1/jobs/{job_id}")

    def jobs(self, states=None) -> list:
        query = "&".join(f"state={s}" for s in states or ())
        return self.json("GET", "/v1/jobs" + (f"?{query}" if query else ""))

    def cancel(self, job_id: str) -> dict:
        return self.json("DELETE", f"/v1/jobs/{job_id}")


def daemon_client(home) -> Optional[DaemonClient]:
    """A client of the daemon serving the spool folder `home` (see the module docstring), or None."""
    if os.environ.get(NO_DAEMON_ENV, "") not in ("", "0"):
        return None
    candidates = [os.environ[SOCKET_ENV]] if os.environ.get(SOCKET_ENV) else []
    if not candidates:
        for f in sorted(Path(home).glob("daemon*.json")):
            try:
                candidates.append(json.loads(f.read_text(encoding="utf-8"))["socket"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
    for path in candidates:
        if not path:
            continue
        client = DaemonClient(path)
        try:
            client.request("GET", "/health", timeout=3.0)
            return client
        except (OSError, DaemonError, http.client.HTTPException):
            continue
    return None
