"""The real daemon as a subprocess, for the open-loop load benchmark (benchmarks/load.py).

Writes the checkpoint to serve (random weights of a real shape through benchmarks.dummy_checkpoint,
or a folder of links to a given checkpoint) with `min_new_tokens` in its generation_config.json so
that EOS cannot end a request before `max_frames`; writes a YAML config; starts
`python -m appliance.cli daemon --config CFG` with its output in a log file; waits for HOME/daemon.json
and GET /health; stops it with SIGTERM (SIGKILL after a timeout).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import yaml

from benchmarks.load.client import Target, http_request

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]  # the repository: `python -m benchmarks.X` children find the package there
# variables that would make the child act as a systemd service or read another configuration
SERVICE_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES",
               "JOURNAL_STREAM", "RUNTIME_DIRECTORY")


class DaemonError(RuntimeError):
    """The daemon (or a helper process) could not be started or failed; the message says why."""


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def run_helper(argv: list, timeout: float, what: str) -> str:
    """Run a helper process to completion (stdout returned); DaemonError with its output otherwise."""
    try:
        p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=child_env()[0])
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or "") + (exc.stderr or "")
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        raise DaemonError(f"{what}: no result within {timeout:.0f} s\n{_tail(out)}") from None
    if p.returncode != 0:
        raise DaemonError(f"{what} failed (exit {p.returncode}):\n{_tail(p.stdout + p.stderr)}")
    return p.stdout


def write_dummy(shape: str, out: Path, device: str, dtype: str, seed: int = 0, timeout: float = 1800.0) -> None:
    """Random weights of the real `shape` written as an official checkpoint folder (in a child process,
    so this process never holds the weights or a CUDA context)."""
    run_helper([sys.executable, "-m", "benchmarks.dummy_checkpoint", "--dummy", shape, "--seed", str(seed),
                "--device", device, "--dtype", dtype, "--out", str(out)], timeout, f"writing the dummy {shape} checkpoint")
    if not (out / "model.safetensors").is_file():
        raise DaemonError(f"benchmarks.dummy_checkpoint wrote no model.safetensors into {out}")


def link_checkpoint(src: Path, out: Path) -> None:
    """`out`: links to every entry of the checkpoint folder `src` except generation_config.json,
    which is copied (so it can be changed without touching the original)."""
    if not (src / "config.json").is_file():
        raise DaemonError(f"{src}: not a checkpoint folder (no config.json)")
    out.mkdir(parents=True)
    for entry in src.iterdir():
        if entry.name == "generation_config.json":
            shutil.copyfile(entry, out / entry.name)
        else:
            (out / entry.name).symlink_to(entry.resolve())


def force_min_frames(folder: Path, min_new_tokens: int) -> dict:
    """Write `min_new_tokens` into folder/generation_config.json (EOS is masked until then); returns
    the file's new content."""
    path = folder / "generation_config.json"
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    data["min_new_tokens"] = int(min_new_tokens)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return data


def set_dotted(cfg: dict, item: str) -> None:
    """Apply one `section.key=value` (value parsed as YAML, as the daemon's environment overrides are)."""
    key, sep, raw = item.partition("=")
    section, dot, name = key.strip().partition(".")
    if not sep or not dot or not section or not name:
        raise ValueError(f"--config-extra {item!r}: give SECTION.KEY=VALUE, e.g. runtime.max_slots=64")
    try:
        value = yaml.safe_load(raw) if raw.strip() != "" else ""
    except yaml.YAMLError:
        value = raw
    cfg.setdefault(section, {})[name] = value


def child_env() -> tuple[dict, list]:
    """This process's environment minus what would reconfigure the daemon (TTS_APPLIANCE_*) or make it
    talk to systemd; returns (env, removed names)."""
    env, removed = dict(os.environ), []
    for name in list(env):
        if name.startswith("TTS_APPLIANCE_") or name in SERVICE_ENV:
            removed.append(name)
            del env[name]
    env["PYTHONUNBUFFERED"] = "1"
    return env, sorted(removed)


def _die_with_parent() -> None:  # runs in the child before exec (Linux): SIGTERM when we die
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort; the normal path stops the daemon explicitly
        pass


class DaemonProcess:
    """`tts-appliance daemon` on a generated config; its stdout and stderr go to `log_path`."""

    def __init__(self, config: dict, workdir: Path, log_path: Path):
        self.config, self.workdir, self.log_path = config, workdir, Path(log_path)
        self.config_path = workdir / "config" / "config.yaml"  # its own folder: no stray config.d/
        self.config_path.parent.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=True), encoding="utf-8")
        self.home = Path(config["jobs"]["home"])
        self.argv = [sys.executable, "-m", "appliance.cli", "daemon", "--config", str(self.config_path)]
        self.proc: Optional[subprocess.Popen] = None
        self._log = None

    def effective_config(self, timeout: float = 120.0) -> dict:
        """`daemon --print-config`: the configuration the daemon will run with (validates it)."""
        out = run_helper(self.argv + ["--print-config"], timeout, "checking the daemon configuration")
        try:
            return json.loads(out)
        except ValueError:
            raise DaemonError(f"daemon --print-config printed no JSON:\n{_tail(out)}") from None

    def start(self) -> None:
        env, _ = child_env()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        try:
            return _tail(self.log_path.read_text(encoding="utf-8", errors="replace"), lines)
        except OSError:
            return "(no daemon log)"

    async def wait_ready(self, timeout: float) -> tuple[Target, dict]:
        """Until the daemon has announced itself in HOME/daemon.json and GET /health says ok; returns
        (where to reach it, the health answer). DaemonError if it exits or the time runs out."""
        deadline = time.monotonic() + timeout
        announce, last = self.home / "daemon.json", "no HOME/daemon.json yet"
        while time.monotonic() < deadline:
            if not self.alive():
                raise DaemonError(f"the daemon exited with status {self.proc.returncode} while starting; "
                                  f"log {self.log_path}:\n{self.log_tail()}")
            try:
                info = json.loads(announce.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                info = None
            if info and info.get("pid") == self.proc.pid:
                target = Target(socket=info["socket"]) if info.get("socket") else (
                    Target.from_url(info["tcp"]) if info.get("tcp") else None)
                if target is None:
                    raise DaemonError("the daemon serves no HTTP socket (http.socket is empty and http.tcp off)")
                try:
                    status, _, health = await http_request(target, "GET", "/health", timeout=10.0)
                    if status == 200 and isinstance(health, dict) and health.get("status") == "ok":
                        return target, health
                    last = f"/health answered {status}: {str(health)[:200]}"
                except (OSError, asyncio.TimeoutError) as exc:
                    last = f"/health: {type(exc).__name__}: {exc}"
            await asyncio.sleep(0.25)
        raise DaemonError(f"the daemon was not ready within {timeout:.0f} s ({last}); log {self.log_path}:\n"
                          f"{self.log_tail()}")

    def stop(self, timeout: float = 90.0) -> Optional[int]:
        """SIGTERM, then SIGKILL after `timeout` s; returns the exit status."""
        if self.proc is None:
            return None
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(30)
                    log.warning("the daemon did not stop within %.0f s of SIGTERM and was killed", timeout)
            return self.proc.returncode
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
