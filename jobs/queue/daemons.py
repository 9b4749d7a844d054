"""The daemons that share one queue, and their spool folders (`Daemons`: a mixin of `jobs.queue.Queue`;
`Peers`: one daemon's side).

A worker writes a segment's audio into its own spool folder (`jobs.home`) and records that absolute
path in the queue; a book is assembled into the spool folder of whichever daemon assembles it. So the
daemons sharing a queue need one spool folder, a shared mount at the same path on every host
(docs/SCALE.md); with two folders a book silently lands in the other daemon's. To see that, each
daemon records itself in the `daemons` table when it starts: host, pid, its spool folder and the
folder's identity (`spool_id`: a random id in the folder's `spool.id`, the same for every host that
mounts the same folder, another for a same-named local folder). It renews its row while it runs (at
most every `BEAT_S`) and deletes it when it stops; a row unseen for `GONE_S`, or of a process of this
host that is gone, does not count and is dropped. `Peers.beat` warns, once per daemon, of each other
one whose spool folder is not this one's; `tts-appliance info` lists them all (`Queue.daemons`).
"""
from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path
from typing import Optional

from jobs.queue import holders

log = logging.getLogger(__name__)

BEAT_S = 30.0   # a daemon renews its row at most this often (each status tick that comes later)
GONE_S = 180.0  # a row unseen this long is a daemon that is gone (its host, or its reach of the queue)
SPOOL_ID = "spool.id"
_COLUMNS = ("id", "host", "pid", "started", "home", "spool", "instance", "started_at", "seen_at")


def spool_id(home: Path) -> Optional[str]:
    """The identity of the spool folder `home`: the id in its `spool.id`, written by the first daemon
    that asks (None where the folder cannot be read or written: then only paths are compared)."""
    marker = Path(home) / SPOOL_ID
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        pass
    except OSError as exc:
        log.debug("cannot write %s: %s", marker, exc)
        return None
    else:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(uuid.uuid4().hex + "\n")
    try:
        return marker.read_text(encoding="ascii").strip() or None
    except OSError as exc:
        log.debug("cannot read %s: %s", marker, exc)
        return None


def host_name(host: str) -> str:
    """A host key (`holders.host_key`: name and PID namespace) as people name the host."""
    return host.split("/", 1)[0]


class Daemons:
    """The `daemons` table; needs `store` and `tx()` of the Queue."""

    def daemon_seen(self, row: dict, now: Optional[float] = None) -> None:
        """Record (or renew) the daemon `row` (the columns but `seen_at`); drop rows of daemons gone."""
        now = time.time() if now is None else now
        values = [row.get(c) for c in _COLUMNS[:-1]] + [now]
        with self.tx() as c:
            for gone in self._gone(c, now):
                c.execute("DELETE FROM daemons WHERE id = ?", (gone,))
            c.execute(f"""INSERT INTO daemons ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})
                          ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at""", values)

    def daemon_gone(self, daemon_id: str) -> None:
        """The daemon `daemon_id` stops: its row goes."""
        with self.tx() as c:
            c.execute("DELETE FROM daemons WHERE id = ?", (daemon_id,))

    def daemons(self) -> list[dict]:
        """The daemons sharing this queue now (oldest first), each {id, host, pid, home, spool, instance,
        started_at, seen_at}; read only (a report may call it), [] where the table is not made yet."""
        if not self.store.has_table("daemons"):
            return []
        gone = set(self._gone(self.store, time.time()))
        rows = self.store.rows(f"SELECT {', '.join(_COLUMNS)} FROM daemons ORDER BY started_at, id")
        return [r for r in rows if r["id"] not in gone]

    @staticmethod
    def _gone(c, now: float) -> list[str]:
        """Ids of rows unseen for GONE_S, or of processes of this host that no longer run."""
        here = holders.host_key()
        return [i for i, host, pid, token, seen in
                c.execute("SELECT id, host, pid, started, seen_at FROM daemons").fetchall()
                if (seen or 0) < now - GONE_S or (host == here and not holders.alive(int(pid), token))]


class Peers:
    """One daemon as the queue records it (`home`: its spool folder; `instance`: tts-appliance@N's N),
    and the other daemons as it sees them: `beat(queue)` at start and on every status tick."""

    def __init__(self, home: Path, instance: Optional[str] = None):
        host, pid, token = holders.me()
        home = Path(home).expanduser().resolve()
        self.row = {"id": uuid.uuid4().hex[:12], "host": host, "pid": pid, "started": token, "home": str(home),
                    "spool": spool_id(home), "instance": instance, "started_at": time.time()}
        self.warned: set[str] = set()
        self.last = 0.0

    @property
    def id(self) -> str:
        return self.row["id"]

    def beat(self, queue, now: Optional[float] = None) -> None:
        """Record or renew this daemon in `queue` (at most every BEAT_S; the first call always) and warn,
        once each, of the daemons sharing it whose spool folder is another."""
        now = time.time() if now is None else now
        if self.last and now - self.last < BEAT_S:
            return
        queue.daemon_seen(self.row, now)
        self.last = now
        for other in queue.daemons():
            why = None if other["id"] in self.warned or other["id"] == self.id else self.conflict(other)
            if why:
                self.warned.add(other["id"])
                log.warning("%s", why)

    def leave(self, queue) -> None:
        queue.daemon_gone(self.id)

    def conflict(self, other: dict) -> Optional[str]:
        """What is wrong when `other` shares the queue with this daemon, or None (one spool folder)."""
        me = self.row
        if other["home"] == me["home"] and (not other["spool"] or not me["spool"] or other["spool"] == me["spool"]):
            return None
        who = f"daemon pid {other['pid']} on {host_name(other['host'])}"
        mine = f"this daemon's (pid {me['pid']} on {host_name(me['host'])})"
        if other["home"] == me["home"]:
            what = (f"{who} shares this queue with spool folder (jobs.home) {other['home']}, the path of {mine}, "
                    f"but not the same folder (another {SPOOL_ID}: not one shared mount)")
        else:
            what = f"{who} shares this queue with spool folder (jobs.home) {other['home']}; {mine} is {me['home']}"
        return (f"{what}: segment audio and finished books land in the folder of whichever daemon does the work; "
                "give every daemon sharing a queue the same jobs.home on one shared mount (docs/SCALE.md)")
