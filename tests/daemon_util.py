"""Helpers for the daemon tests: start `tts-appliance daemon` as a subprocess on the tiny
checkpoint in a temp folder, talk HTTP over its real Unix socket."""
from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CV = ROOT / "tests" / "data" / "tiny" / "cv_small"
# Failure guards only: the tests wait for events (ready, a job's end, the process's exit), never for a time they
# rely on; a loaded 2-core machine starts a daemon (torch imported twice: the daemon, its engine process) in minutes.
READY_S, JOB_S, STOP_S = 300.0, 300.0, 120.0


def skip_reason():
    if not (CV / "model.safetensors").is_file():
        return f"tiny checkpoint missing: {CV}"
    try:
        import aiohttp  # noqa: F401
        import engines.runtime.runner  # noqa: F401
    except ImportError as exc:
        return f"daemon dependencies missing: {exc}"
    return None


def endless_model(tmp: Path, frames: int = 2000) -> str:
    """The tiny checkpoint linked into `tmp` with EOS masked for `frames` frames: a request runs until its
    max_frames or until it is cancelled, never ended early by a random model's EOS (a test that needs a stream
    to hold its slot, or to fill a client's buffers, must not depend on when noise samples EOS)."""
    from benchmarks.load.daemon import force_min_frames, link_checkpoint

    model = tmp / "cv_endless"
    link_checkpoint(CV, model)
    force_min_frames(model, frames + 1)
    return str(model)


def free_port() -> int:
    """A loopback TCP port nobody listens on now (for http.tcp_port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_config(tmp: Path, **sections) -> dict:
    """A fast test config: tiny model, 1 torch thread, few frames, sockets in a short temp dir."""
    run = Path(tempfile.mkdtemp(prefix="tts-run-"))  # AF_UNIX paths must stay short
    os.chmod(run, 0o755)
    cfg = {"model": {"path": str(CV), "threads": 1, "max_frames": 400},
           "runtime": {"max_slots": 4, "max_queue": 8},
           "jobs": {"home": str(tmp / "home"), "guard": False, "batch_size": 4, "watch_quiet_s": 0.5,
                    "lease_s": 30.0},
           "http": {"read_timeout_s": 2.0, "write_timeout_s": 60.0},  # (a test client reads late on a busy machine)
           "service": {"runtime_dir": str(run), "status_interval_s": 0.5, "stop_timeout_s": 20.0}}
    for sec, values in sections.items():
        cfg.setdefault(sec, {}).update(values)
    return cfg


class Daemon:
    def __init__(self, tmp: Path, cfg: dict, env: dict | None = None, name: str = "config.yaml"):
        self.tmp, self.cfg = tmp, cfg
        self.path = tmp / name
        self.path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
        self.home = Path(cfg["jobs"]["home"])
        self.run_dir = Path(cfg["service"]["runtime_dir"])
        self.socket = str(self.run_dir / "api.sock")
        self.wyoming = str(self.run_dir / "wyoming.sock")
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.env.pop("NOTIFY_SOCKET", None) if "NOTIFY_SOCKET" not in (env or {}) else None
        self.log = tmp / "daemon.log"
        self.proc = None

    def start(self, wait: bool = True, timeout: float = READY_S, wrap=None, **popen) -> "Daemon":
        self.logf = open(self.log, "ab")
        argv = [sys.executable, "-m", "appliance.cli", "daemon", "--config", str(self.path)]
        self.proc = subprocess.Popen(wrap(argv) if wrap else argv, cwd=ROOT, env=self.env, stdout=self.logf,
                                     stderr=subprocess.STDOUT, **popen)
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = READY_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log_text()}")
            if (self.home / "daemon.json").is_file():
                try:
                    if self.get("/health")[0] == 200:
                        return
                except OSError:
                    pass
            time.sleep(0.1)
        raise AssertionError(f"daemon not ready in {timeout} s:\n{self.log_text()}")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, sig=signal.SIGTERM, timeout: float = STOP_S) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"daemon did not stop within {timeout} s:\n{self.log_text()}")
        finally:
            self.logf.close()

    # -- HTTP over the Unix socket -------------------------------------------------------------
    def conn(self, timeout: float = 30.0) -> http.client.HTTPConnection:
        path = self.socket

        class C(http.client.HTTPConnection):
            def connect(self):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(timeout)
                s.connect(path)
                self.sock = s

        return C("localhost", timeout=timeout)

    def request(self, method: str, url: str, body=None, headers=None):
        c = self.conn()
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
                headers = {"Content-Type": "application/json", **(headers or {})}
            c.request(method, url, body=body, headers=headers or {})
            r = c.getresponse()
            data = r.read()
            ctype = r.getheader("Content-Type", "")
            return r.status, (json.loads(data) if ctype.startswith("application/json") else data), dict(r.getheaders())
        finally:
            c.close()

    def get(self, url):
        return self.request("GET", url)

    def post(self, url, body):
        return self.request("POST", url, body)

    def wait_job(self, job_id: str, states=("done", "partial", "failed", "cancelled"), timeout: float = JOB_S) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, s, _ = self.get(f"/v1/jobs/{job_id}")
            assert status == 200, s
            if s["state"] in states:
                return s
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} still {s['state']} after {timeout} s:\n{self.log_text()[-3000:]}")


def book_text(n_paragraphs: int) -> str:
    words = ["Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot", "Golf", "Hotel", "India", "Juliet"]
    return "\n\n".join(f"{words[i % 10]} sentence number {i} is read aloud." for i in range(n_paragraphs)) + "\n"


needs_daemon = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
