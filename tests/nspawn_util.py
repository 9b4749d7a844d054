"""A throw-away Debian container with a real systemd as PID 1, for the live unit tests.

The root file system is a debootstrap'ed Debian minbase with systemd, built once and cached (keyed by
suite and package list) in $TTS_APPLIANCE_TEST_ROOTFS_CACHE (default /var/cache/tts-appliance-test).
Each session boots it with `systemd-nspawn --volatile=overlay`, so every write lands in a tmpfs and the
cache stays pristine. The project folder, its venv and the venv's base interpreter are bind-mounted
read-only at the same paths: the daemon runs from the project's own `.venv`, nothing is installed.
Commands run inside through `nsenter` into the container's PID 1. No systemd needs to run on the
host: nspawn gets its own cgroup (`--keep-unit --register=no`), which is removed on teardown.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
SUITE = "bookworm"  # systemd 252
MIRROR = os.environ.get("TTS_APPLIANCE_TEST_MIRROR", "http://deb.debian.org/debian")
CACHE = Path(os.environ.get("TTS_APPLIANCE_TEST_ROOTFS_CACHE", "/var/cache/tts-appliance-test"))
# systemd, and the shared libraries a CPython build (pyenv, python.org) links its modules against
PACKAGES = ["systemd", "systemd-sysv", "libbz2-1.0", "libexpat1", "libffi8", "libgdbm6", "liblzma5",
            "libncursesw6", "libreadline8", "libsqlite3-0", "libssl3", "libuuid1", "zlib1g"]
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TOOLS = ("systemd-nspawn", "debootstrap", "nsenter", "setpriv")
# `systemctl is-system-running` before the container's systemd answers: nothing (no bus yet), "offline"
# (/run/systemd/system not made yet), "unknown"; `--wait` itself waits out "initializing" and "starting"
NOT_UP_YET = ("", "offline", "unknown", "initializing", "starting")


class Unavailable(Exception):
    """The container cannot be built or booted here (a reason to skip, not a failure of the units)."""


class BootFailed(Exception):
    """The container started but its systemd did not come up: a failure, not a reason to skip."""


def interpreter() -> tuple[Path, Path]:
    """(venv, the venv's base interpreter prefix) of the running Python, symlinks resolved."""
    return Path(sys.prefix), Path(os.path.realpath(sys.base_prefix))


def packages() -> list[str]:
    _, base = interpreter()
    return PACKAGES + (["python3.11"] if base.parts[:2] == ("/", "usr") else [])


def skip_reason() -> Optional[str]:
    if os.geteuid() != 0:
        return "needs root (systemd-nspawn, cgroups, debootstrap)"
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        return f"{', '.join(missing)} missing (apt-get install -y systemd-container debootstrap util-linux)"
    if not cgroup_hierarchies():
        return "no writable systemd or cgroup2 hierarchy under /sys/fs/cgroup"
    venv, base = interpreter()
    if venv == base:
        return "run the tests from the project's venv (.venv/bin/python -m pytest)"
    if base.parts[:2] == ("/", "usr") and sys.version_info[:2] != (3, 11):
        return f"the venv uses the system Python {sys.version_info[:2]}; the {SUITE} container has 3.11"
    for p in (ROOT, venv, base):
        top = next(b for b in binds() + [Path("/usr")] if b in (p, *p.parents))
        closed = [str(d) for d in (p, *p.parents) if top in (d, *d.parents) and d.stat().st_mode & 0o005 != 0o005]
        if closed:
            return f"{closed[0]} is not world-readable: the service user could not read the checkout or venv"
    return None


def binds() -> list[Path]:
    """What the container gets read-only at the same paths: the project, its venv, the base interpreter."""
    venv, base = interpreter()
    return [ROOT] + [p for p in (venv, base) if ROOT not in (p, *p.parents) and p.parts[:2] != ("/", "usr")]


def cgroup_hierarchies() -> list[Path]:
    """Where nspawn needs a cgroup of its own: the name=systemd (v1) and the unified (v2) hierarchies."""
    fs = Path("/sys/fs/cgroup")
    found = [fs / "systemd", fs / "unified"] if (fs / "systemd" / "cgroup.procs").exists() else []
    if (fs / "cgroup.controllers").exists():  # pure cgroup v2
        found.append(fs)
    return [h for h in found if (h / "cgroup.procs").exists() and os.access(h, os.W_OK)]


class Lock:
    """An exclusive lock on the cache (one build, one booted copy of a root at a time)."""

    def __init__(self, path: Path, timeout: float):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(path, "a")
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self.f.close()
                    raise Unavailable(f"{path} stayed locked for {timeout:.0f} s (another test run?)")
                time.sleep(1)

    def release(self) -> None:
        self.f.close()


def rootfs(timeout: float = 600) -> Path:
    """The cached root file system; built with debootstrap when absent (about 1-2 minutes)."""
    key = hashlib.sha256(json.dumps([SUITE, MIRROR, packages()]).encode()).hexdigest()[:12]
    root = CACHE / f"{SUITE}-{key}"
    if (root / "usr/lib/systemd/systemd").exists():
        return root
    lock = Lock(CACHE / ".build.lock", timeout)
    try:
        if (root / "usr/lib/systemd/systemd").exists():
            return root
        tmp = root.with_name(root.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        log = CACHE / f"{root.name}.debootstrap.log"
        with open(log, "wb") as out:
            try:
                r = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(packages())}", SUITE,
                                    str(tmp), MIRROR], stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
            except subprocess.TimeoutExpired:
                r = None
        if r is None or r.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tail = log.read_text(errors="replace").splitlines()[-5:]
            raise Unavailable(f"debootstrap {SUITE} from {MIRROR} failed: {' | '.join(tail)}")
        for deb in (tmp / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        tmp.rename(root)
        return root
    finally:
        lock.release()


class Container:
    """A booted container; use as a context manager (teardown runs even when a test fails)."""

    def __init__(self, root: Path, binds: Sequence[Path], boot_timeout: float = 90):
        self.root, self.binds, self.boot_timeout = root, list(binds), boot_timeout
        self.name = f"tts-test-{os.getpid()}"
        self.cgroups = [h / self.name for h in cgroup_hierarchies()]
        self.log = CACHE / f"{root.name}.boot.log"  # the console of the latest boot
        self.proc: Optional[subprocess.Popen] = None
        self.lock: Optional[Lock] = None
        self.pid1: Optional[int] = None

    def __enter__(self) -> "Container":
        self.lock = Lock(CACHE / f".{self.root.name}.lock", timeout=600)
        try:
            reap_stale()
            self._boot()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _boot(self) -> None:
        for cg in self.cgroups:
            cg.mkdir(exist_ok=True)

        def join_cgroups():  # in the child, before exec: nspawn starts in its own cgroups
            for cg in self.cgroups:
                (cg / "cgroup.procs").write_text("0")

        argv = ["systemd-nspawn", "--quiet", "--boot", f"--directory={self.root}", "--volatile=overlay",
                "--register=no", "--keep-unit", "--private-network", f"--machine={self.name}",
                "--console=read-only", *[f"--bind-ro={b}" for b in self.binds]]
        self.logf = open(self.log, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.logf, stderr=subprocess.STDOUT,
                                     preexec_fn=join_cgroups)
        deadline = time.monotonic() + self.boot_timeout
        while self.pid1 is None:
            self._check_alive()
            if time.monotonic() > deadline:
                raise Unavailable(f"container init did not appear in {self.boot_timeout:.0f} s: {self.boot_log()}")
            self.pid1 = self._find_init()
            time.sleep(0.2)
        self.wait_for_systemd(max(deadline, time.monotonic() + 5))

    def wait_for_systemd(self, deadline: float) -> str:
        """The container's system state once its systemd has started up ("running" or "degraded").
        Right after PID 1 appears its bus is not up yet: `systemctl is-system-running --wait` then
        prints nothing ("Failed to connect to bus") or "offline", so it is asked again until `deadline`
        (time.monotonic()). A container that boots but never gets there is BootFailed, not a skip."""
        last = ""
        while True:
            self._check_alive()
            left = deadline - time.monotonic()
            if left <= 0:
                raise BootFailed(f"container systemd did not answer in {self.boot_timeout:.0f} s (last answer: "
                                 f"{last!r}): {self.boot_log()}")
            try:
                r = self.run("systemctl", "is-system-running", "--wait", check=False, timeout=left)
            except subprocess.TimeoutExpired:
                continue
            state = r.stdout.strip()
            if state in ("running", "degraded"):
                return state
            if state not in NOT_UP_YET:
                raise BootFailed(f"container systemd is {state!r} after boot: {self.boot_log()}")
            last = state or r.stderr.strip()
            time.sleep(0.2)

    def _check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise Unavailable(f"systemd-nspawn exited with {self.proc.returncode}: {self.boot_log()}")

    def _pids(self) -> list[int]:
        pids = set()
        for cg in self.cgroups:
            for procs in cg.rglob("cgroup.procs") if cg.exists() else ():
                pids.update(int(p) for p in procs.read_text().split())
        return sorted(pids)

    def _find_init(self) -> Optional[int]:
        """The container's PID 1: the process of our cgroup that is PID 1 of its own PID namespace."""
        for pid in self._pids():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            nspid = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), [])
            if len(nspid) >= 2 and nspid[-1] == "1":
                return pid
        return None

    def boot_log(self, lines: int = 15) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def run(self, *argv: str, user: Optional[tuple[int, Sequence[int]]] = None, check: bool = True,
            timeout: float = 60, input: Optional[str] = None) -> subprocess.CompletedProcess:
        """Run argv inside the container (as root, or as user=(uid, [gid, supplementary...]))."""
        self._check_alive()
        prefix = ["nsenter", f"--target={self.pid1}", "--mount", "--uts", "--ipc", "--net", "--pid", "--cgroup",
                  "--root", "--wd", "env", "-i", f"PATH={PATH}", "LANG=C.UTF-8", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0"]
        if user is not None:
            uid, gids = user
            groups = f"--groups={','.join(map(str, gids[1:]))}" if len(gids) > 1 else "--clear-groups"
            prefix += ["setpriv", f"--reuid={uid}", f"--regid={gids[0]}", groups]
        r = subprocess.run(prefix + list(argv), capture_output=True, text=True, timeout=timeout, input=input)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited with {r.returncode}:\n{r.stdout}\n{r.stderr}")
        return r

    def close(self) -> None:
        """Power the container off (SIGTERM to nspawn), kill what is left by PID, remove our cgroups."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                for pid in self._pids():
                    _kill(pid)
                self.proc.kill()
                self.proc.wait(10)
        deadline = time.monotonic() + 10
        while self._pids() and time.monotonic() < deadline:
            for pid in self._pids():
                _kill(pid)
            time.sleep(0.2)
        remove_cgroups(self.cgroups)
        if self.proc is not None:
            self.logf.close()
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def remove_cgroups(cgroups: Sequence[Path]) -> None:
    for cg in cgroups:
        if cg.exists():
            for d in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                d.rmdir()
            cg.rmdir()


def reap_stale() -> None:
    """Containers left by a test run that was killed (its PID is in the cgroup name): stop and remove."""
    for h in cgroup_hierarchies():
        for cg in h.glob("tts-test-*"):
            owner = cg.name.rsplit("-", 1)[1]
            if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                for _ in range(50):
                    pids = [int(x) for procs in cg.rglob("cgroup.procs") for x in procs.read_text().split()]
                    if not pids:
                        break
                    for pid in pids:
                        _kill(pid)
                    time.sleep(0.1)
                remove_cgroups([cg])


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
