"""The two places a queue can live, behind one small interface: a SQLite file (default) or a
PostgreSQL database (`jobs.queue: postgresql://user@host/db`).

Queue code writes one SQL text with `?` placeholders and the subset both databases share
(`ON CONFLICT ... DO UPDATE`, `RETURNING`, `CASE`); a store runs it. The differences live here:
DDL words (`{id}`, `{real}`), write transactions (SQLite `BEGIN IMMEDIATE`; PostgreSQL row locks
with `FOR UPDATE ... SKIP LOCKED` claims) and what a lost connection means.
"""
from __future__ import annotations

import functools
import logging
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

from jobs.queue.location import is_url, redact

log = logging.getLogger(__name__)


class QueueUnavailable(Exception):
    """The queue database cannot be reached right now (workers back off and try again)."""


_SQLITE_AWAY = ("locked", "busy", "disk i/o", "unable to open", "readonly", "disk is full")


class SqliteStore:
    """A SQLite file in WAL mode; writes serialize on `BEGIN IMMEDIATE`."""

    dialect = "sqlite"
    skip_locked = ""  # BEGIN IMMEDIATE already makes a claim exclusive
    for_update = ""
    ddl = {"id": "INTEGER PRIMARY KEY AUTOINCREMENT", "real": "REAL"}

    def __init__(self, path: str | Path, busy_timeout_s: float = 30.0, read_only: bool = False):
        self.location = Path(path)
        if read_only:  # the file as it is: never created, writes refused
            target, uri = self.location.absolute().as_uri() + "?mode=ro", True
        else:
            self.location.parent.mkdir(parents=True, exist_ok=True)
            target, uri = str(self.location), False
        conn = sqlite3.connect(target, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False, uri=uri)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            if not read_only:
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = FULL")
        except sqlite3.Error:  # not a database, or locked: the caller says so (jobs.queue.core.Queue)
            conn.close()
            raise
        self.conn = conn

    def _unavailable(self, exc: sqlite3.Error) -> Exception:
        """A locked or unreadable file (another process holding the write lock past the busy timeout, a
        full or failing disk) is an outage the workers wait out, as a PostgreSQL server going away is;
        other errors (a bad statement) stay what they are."""
        msg = str(exc).lower()
        if isinstance(exc, sqlite3.OperationalError) and any(w in msg for w in _SQLITE_AWAY):
            return QueueUnavailable(f"the queue database {self.location} cannot be used now: {exc}")
        return exc

    def execute(self, sql: str, args: Sequence | dict = ()):
        try:
            return self.conn.execute(sql, args)
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc

    def executemany(self, sql: str, rows: Sequence[Sequence]) -> None:
        try:
            self.conn.executemany(sql, rows)
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc

    def has_table(self, name: str) -> bool:
        return self.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None

    def rows(self, sql: str, args: Sequence | dict = ()) -> list[dict]:
        cur = self.execute(sql, args)
        names = [d[0] for d in cur.description or ()]
        return [dict(zip(names, r)) for r in cur.fetchall()]

    @contextmanager
    def tx(self, lock: bool = False):
        """A write transaction (waits up to the busy timeout for other writers)."""
        self.execute("BEGIN IMMEDIATE")
        try:
            yield self
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise
        try:
            self.execute("COMMIT")
        finally:  # a COMMIT that failed (busy) leaves the transaction open: end it, the work is retried
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")

    def close(self) -> None:
        self.conn.close()


@functools.lru_cache(maxsize=512)
def to_pyformat(sql: str) -> str:
    """`?` placeholders outside quoted literals -> `%s`; literal `%` doubled (psycopg's format)."""
    out, quoted = [], False
    for ch in sql:
        if ch == "'":
            quoted = not quoted
        if ch == "%":
            out.append("%%")
        elif ch == "?" and not quoted:
            out.append("%s")
        else:
            out.append(ch)
    return "".join(out)


_CONNECT_HINTS = (  # (words of the library's message, what to do), first match wins
    (("password authentication failed", "no password supplied", "authentication failed"),
     "authentication failed: check the user name and password of jobs.queue (or of jobs.queue_file, or "
     "~/.pgpass) and the server's pg_hba.conf"),
    (("does not exist",), "create the database (createdb -O USER DATABASE, docs/SCALE.md) or fix its name in the URL"),
    (("connection refused",), "is PostgreSQL running there, listening on that address and port?"),
    (("timeout expired", "timed out"), "no answer within {timeout} s: is the host reachable (a firewall; under "
                                       "systemd the unit's IPAddressAllow, docs/SCALE.md)?"),
    (("resolve host", "translate host name", "name or service not known"), "unknown host: check the host name"),
    (("no route to host", "network is unreachable", "operation not permitted"),
     "the host cannot be reached from here (routing, a firewall; under systemd the unit's IPAddressAllow, "
     "docs/SCALE.md)"),
)


def connect_failure(exc: Exception, timeout_s: float) -> str:
    """Why a PostgreSQL connection failed, in one line (the password masked), with what to do where the
    library's message says which of the usual causes it was."""
    reason = redact(" ".join(str(exc).split()) or type(exc).__name__)
    lowered = f"{type(exc).__name__} {reason}".lower()
    for words, hint in _CONNECT_HINTS:
        if any(w in lowered for w in words):
            return f"{reason}; {hint.format(timeout=timeout_s)}"
    return reason


class PostgresStore:
    """A PostgreSQL database through psycopg 3. Claims lock rows with `FOR UPDATE ... SKIP LOCKED`,
    so workers on several hosts never wait on each other's segments."""

    dialect = "postgresql"
    skip_locked = " FOR UPDATE OF s SKIP LOCKED"
    for_update = " FOR UPDATE"
    ddl = {"id": "BIGSERIAL PRIMARY KEY", "real": "DOUBLE PRECISION"}

    def __init__(self, url: str, connect_timeout_s: float = 10.0, read_only: bool = False):
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - a dependency of the package
            raise QueueUnavailable("jobs.queue names PostgreSQL but psycopg is not installed: "
                                   "pip install 'psycopg[binary]>=3.1'") from exc
        self._psycopg = psycopg
        self.location = url
        self.connect_timeout_s = connect_timeout_s
        self.read_only = read_only
        self.conn = None
        self._connect()

    def _connect(self) -> None:
        psycopg = self._psycopg
        timeout_s = max(2, int(self.connect_timeout_s))  # libpq's shortest
        try:
            self.conn = psycopg.connect(self.location, autocommit=True, connect_timeout=timeout_s)
        except psycopg.Error as exc:  # a server that refuses, or (ProgrammingError) a URL the library cannot read
            raise QueueUnavailable(f"cannot connect to the queue database {redact(self.location)}: "
                                   f"{connect_failure(exc, timeout_s)}") from exc
        if self.read_only:
            self.conn.execute("SET default_transaction_read_only = on")

    def _lost(self, exc: Exception) -> QueueUnavailable:
        """The connection broke: drop it (the next call reconnects) and say so."""
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001 - already broken
            pass
        self.conn = None
        reason = redact(" ".join(str(exc).split()) or type(exc).__name__)
        return QueueUnavailable(f"lost the queue database {redact(self.location)}: {reason}")

    def _ready(self):
        if self.conn is None or self.conn.closed:
            self._connect()
        return self.conn

    def execute(self, sql: str, args: Sequence | dict = ()):
        conn = self._ready()
        try:
            return conn.execute(to_pyformat(sql), args)
        except self._psycopg.OperationalError as exc:
            if conn.closed or conn.broken:
                raise self._lost(exc) from exc
            raise

    def executemany(self, sql: str, rows: Sequence[Sequence]) -> None:
        conn = self._ready()
        try:
            with conn.cursor() as cur:
                cur.executemany(to_pyformat(sql), rows)
        except self._psycopg.OperationalError as exc:
            if conn.closed or conn.broken:
                raise self._lost(exc) from exc
            raise

    def has_table(self, name: str) -> bool:
        return self.execute("SELECT to_regclass(?) IS NOT NULL", (name,)).fetchone()[0]

    def rows(self, sql: str, args: Sequence | dict = ()) -> list[dict]:
        cur = self.execute(sql, args)
        names = [d.name for d in cur.description or ()]
        return [dict(zip(names, r)) for r in cur.fetchall()]

    @contextmanager
    def tx(self, lock: bool = False):
        """A transaction; `lock=True` also serializes it with every other `lock=True` one
        (schema changes), like SQLite's single writer."""
        conn = self._ready()
        try:
            with conn.transaction():
                if lock:
                    conn.execute("SELECT pg_advisory_xact_lock(7215001)")
                yield self
        except self._psycopg.OperationalError as exc:
            if conn.closed or conn.broken:
                raise self._lost(exc) from exc
            raise

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def open_store(location, busy_timeout_s: float = 30.0, read_only: bool = False):
    """The store of `location` (as `parse_location` returns it): a `postgresql://` URL or a SQLite file.
    `read_only` (a report): the database as it is, writes refused; `busy_timeout_s` then also bounds the
    PostgreSQL connect."""
    if is_url(location):
        return PostgresStore(location, busy_timeout_s, read_only=True) if read_only else PostgresStore(location)
    return SqliteStore(location, busy_timeout_s, read_only)
