"""A throwaway PostgreSQL server for tests: initdb + pg_ctl from Debian's `postgresql` package on a
free local port, in a temporary folder, as an unprivileged user (initdb refuses root: as root the
server runs as `nobody`). `pg_server()` skips the test with the reason when the binaries are absent."""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

import pytest


def pg_bin() -> Optional[Path]:
    """The newest /usr/lib/postgresql/*/bin that has initdb and pg_ctl (None: not installed)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4] or 0))
    extra = shutil.which("initdb")
    path = Path(found[-1]).parent if found else (Path(extra).parent if extra else None)
    return path if path and (path / "pg_ctl").is_file() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """A running server; `url(db)` gives a URL for database `db` (created on first use)."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="tts-pg-"))
        self.port = _free_port()
        self.user = "tts"
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            self.as_user = ["runuser", "-u", "nobody", "--"]
            shutil.chown(self.dir, "nobody")
        self.data = self.dir / "data"
        pwfile = self.dir / "pw"
        pwfile.write_text("secret\n")
        if self.as_user:
            shutil.chown(pwfile, "nobody")
        self._run("initdb", "-D", str(self.data), "-U", self.user, "--pwfile", str(pwfile), "-A", "scram-sha-256",
                  "--no-sync", "-E", "UTF8")
        self._dbs: set[str] = set()
        self.start()

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "-t", "60", "-o",
                  f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off", "start")

    def halt(self) -> None:
        """Stop the server abruptly (clients lose their connections); `start()` brings it back."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def _run(self, tool: str, *args: str) -> None:
        out = subprocess.run([*self.as_user, str(self.bindir / tool), *args], capture_output=True, text=True,
                             timeout=120, cwd=self.dir)
        if out.returncode != 0:
            raise RuntimeError(f"{tool} failed: {out.stdout}{out.stderr}")

    def url(self, db: str = "tts", password: str = "secret") -> str:
        if db not in self._dbs:
            import psycopg

            with psycopg.connect(self.url("postgres") if db != "postgres" else
                                 f"postgresql://{self.user}:secret@127.0.0.1:{self.port}/postgres",
                                 autocommit=True) as c:
                if db != "postgres":
                    c.execute(f'CREATE DATABASE "{db}"')
            self._dbs.add(db)
        return f"postgresql://{self.user}:{password}@127.0.0.1:{self.port}/{db}"

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():  # not already halted by the test
                self.halt()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def pg_server() -> PgServer:
    """Start a server (skips the test when PostgreSQL or psycopg is not installed)."""
    bindir = pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin; "
                    "`apt-get install postgresql` or ./install.sh --dev)")
    pytest.importorskip("psycopg", reason="psycopg not installed (pip install 'psycopg[binary]')")
    return PgServer(bindir)
