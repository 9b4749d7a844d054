"""Claims and leases of the queue (a mixin of `jobs.queue.Queue`).

A worker *claims* segments: they get its id and a lease expiry; a heartbeat renews the lease.
Every claim counts as an attempt until it ends. An attempt that ends because its worker died is
handed back and does not count: a dead worker on this host (its process gone; see `holders`) gives
its leases back at the next claim at once, one elsewhere when its lease expires. Such lost leases
are counted apart (`lost`); a segment that lost `max_lost` workers ends `failed`, as it may be what
kills them. Only real synthesis failures (`fail`) use up `max_attempts`. Leases taken back are logged
with the worker's host and pid; workers not seen for a lease's time that hold nothing are forgotten.
"""
from __future__ import annotations

import heapq
import logging
import time
from typing import Optional, Sequence

from jobs.queue import holders

log = logging.getLogger(__name__)

# a lost lease goes back to the queue with its attempt given back, or fails at max_lost
_GIVE_BACK = """UPDATE segments SET
    state = CASE WHEN lost + 1 >= ? THEN 'failed' ELSE 'queued' END,
    attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END, lost = lost + 1,
    last_error = CAST(? AS TEXT) || CASE WHEN lost + 1 >= ? THEN '; gave up: ' || (lost + 1) || ' workers died holding it'
                           ELSE ' (attempt not counted)' END,
    worker_id = NULL, lease_expires = NULL, updated_at = ?"""


class Leases:
    """Claims, heartbeats and lease recovery; needs `store`, `max_lost` and `tx()` of the Queue."""

    max_lost: int

    def _register(self, c, worker_id: str, now: float) -> None:
        """Record which process of which host holds `worker_id`'s leases."""
        host, pid, token = holders.me()
        c.execute("""INSERT INTO workers (id, host, pid, started, seen_at) VALUES (?, ?, ?, ?, ?)
                     ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid,
                     started = excluded.started, seen_at = excluded.seen_at""", (worker_id, host, pid, token, now))

    def _reap_dead(self, c, now: float) -> int:
        """Give back, at once, the leases of workers of this host whose process is gone."""
        host = holders.host_key()
        n = 0
        for wid, pid, token in c.execute("SELECT id, pid, started FROM workers WHERE host = ?", (host,)).fetchall():
            if holders.alive(int(pid), token):
                continue
            msg = f"worker {wid} died holding this segment"
            got = c.execute(_GIVE_BACK + " WHERE state = 'leased' AND worker_id = ?",
                            (self.max_lost, msg, self.max_lost, now, wid)).rowcount
            c.execute("UPDATE jobs SET assembly_worker = NULL, assembly_expires = NULL WHERE assembly_worker = ?",
                      (wid,))
            c.execute("DELETE FROM workers WHERE id = ?", (wid,))
            if got:
                log.warning("worker %s (pid %s) is gone: %d segment lease(s) given back", wid, pid, got)
            n += got
        return n

    def _expire(self, c, now: float) -> None:
        """Return expired leases to the queue (the worker stopped renewing: died on another host, hung, cut
        off), one log line per worker saying whose they were."""
        expired = c.execute("SELECT s.id, s.worker_id FROM segments s WHERE s.state = 'leased' AND s.lease_expires < ?"
                            + self.store.skip_locked, (now,)).fetchall()
        if not expired:
            return
        ids = [r[0] for r in expired]
        marks = ",".join("?" * len(ids))
        c.execute(_GIVE_BACK + f" WHERE state = 'leased' AND id IN ({marks})",
                  [self.max_lost, "lease of a worker expired (worker stopped or unreachable)", self.max_lost, now] + ids)
        per_worker: dict = {}
        for _, wid in expired:
            per_worker[wid] = per_worker.get(wid, 0) + 1
        marks = ",".join("?" * len(per_worker))
        where = {r[0]: (r[1], r[2]) for r in c.execute(f"SELECT id, host, pid FROM workers WHERE id IN ({marks})",
                                                         list(per_worker)).fetchall()}
        for wid, n in per_worker.items():
            host, pid = where.get(wid, ("unknown host", "?"))
            log.info("took back %d segment lease(s) of worker %s (host %s, pid %s): its lease expired", n, wid, host, pid)

    def _prune(self, c, now: float, idle_s: float) -> None:
        """Forget workers not seen for `idle_s` that hold nothing (their leases have expired by now): a live
        worker registers again with its next heartbeat or claim."""
        c.execute("""DELETE FROM workers WHERE seen_at < ?
                     AND NOT EXISTS (SELECT 1 FROM segments s WHERE s.state = 'leased' AND s.worker_id = workers.id)
                     AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.assembly_worker = workers.id)""", (now - idle_s,))

    def reap(self) -> int:
        """Give back the leases of dead workers of this host now; returns how many segments."""
        with self.tx() as c:
            return self._reap_dead(c, time.time())

    def claim(self, worker_id: str, limit: int, lease_s: float, model: Optional[str] = None,
              min_priority: Optional[int] = None) -> list[dict]:
        """Lease up to `limit` queued segments, shared fairly between jobs (`fair_turns`): the highest
        job priority first; among jobs of one priority each next segment goes to the job with the fewest
        segments in work, then to the oldest job, so a short job is not stuck behind a long book. A job's
        segments go in order.

        Only jobs whose model is unset or equals `model` are served. Returns segment rows with the
        job's `spec` (JSON) and `priority` joined in, in the order they were handed out.
        """
        now = time.time()
        with self.tx() as c:
            self._reap_dead(c, now)
            self._expire(c, now)
            self._prune(c, now, lease_s)
            self._register(c, worker_id, now)
            jobs = self._claimable(c, model, min_priority, int(limit))
            taken: dict[str, list[int]] = {}  # job id -> its segment ids, in order
            turns: list[str] = []  # the job of each segment handed out
            while jobs and len(turns) < limit:
                want = fair_turns(jobs, int(limit) - len(turns))
                got: dict[str, int] = {}
                for job in jobs:
                    n = want.count(job["id"])
                    if n == 0:
                        continue
                    ids = [r[0] for r in c.execute(
                        "SELECT s.id FROM segments s WHERE s.job_id = ? AND s.state = 'queued' ORDER BY s.idx LIMIT ?"
                        + self.store.skip_locked, (job["id"], n)).fetchall()]
                    self._lease(c, worker_id, ids, now + lease_s, now)
                    taken.setdefault(job["id"], []).extend(ids)
                    got[job["id"]] = len(ids)
                    job["busy"] += len(ids)
                    job["waiting"] = job["waiting"] - len(ids) if len(ids) == n else 0  # fewer: locked elsewhere
                for j in want:  # the turns that got a segment, in hand-out order
                    if got.get(j, 0) > 0:
                        turns.append(j)
                        got[j] -= 1
                jobs = [j for j in jobs if j["waiting"] > 0]
            ids = [taken[j].pop(0) for j in turns]
            if not ids:
                return []
            marks = ",".join("?" * len(ids))
            c.execute(f"""UPDATE jobs SET state = 'running', updated_at = ? WHERE state = 'queued'
                          AND id IN (SELECT job_id FROM segments WHERE id IN ({marks}))""", [now] + ids)
        rows = {r["id"]: r for r in self._rows(f"""SELECT s.*, j.spec AS spec, j.priority AS priority FROM segments s
                                                   JOIN jobs j ON j.id = s.job_id WHERE s.id IN ({marks})""", ids)}
        return [rows[i] for i in ids]

    @staticmethod
    def _claimable(c, model: Optional[str], min_priority: Optional[int], limit: int) -> list[dict]:
        """Jobs with queued segments that this worker may serve: id, priority, created_at, `busy` (segments
        leased now) and `waiting` (queued segments, counted up to `limit`)."""
        sql = """SELECT j.id, j.priority, j.created_at,
                   (SELECT COUNT(*) FROM segments s WHERE s.job_id = j.id AND s.state = 'leased') AS busy,
                   (SELECT COUNT(*) FROM (SELECT 1 FROM segments s WHERE s.job_id = j.id AND s.state = 'queued'
                                          LIMIT ?) w) AS waiting
                 FROM jobs j WHERE j.state IN ('queued', 'running') AND (j.model IS NULL OR j.model = ?)
                   AND EXISTS (SELECT 1 FROM segments s WHERE s.job_id = j.id AND s.state = 'queued')"""
        args: list = [limit, model]
        if min_priority is not None:
            sql += " AND j.priority >= ?"
            args.append(min_priority)
        names = ("id", "priority", "created_at", "busy", "waiting")
        return [dict(zip(names, r)) for r in c.execute(sql, args).fetchall()]

    @staticmethod
    def _lease(c, worker_id: str, ids: list[int], expires: float, now: float) -> None:
        if ids:
            marks = ",".join("?" * len(ids))
            c.execute(f"""UPDATE segments SET state = 'leased', worker_id = ?, lease_expires = ?,
                          attempts = attempts + 1, updated_at = ? WHERE id IN ({marks})""",
                      [worker_id, expires, now] + ids)

    def renew(self, worker_id: str, ids: Sequence[int], lease_s: float) -> int:
        """Extend this worker's leases; returns how many are still held."""
        held = 0
        now = time.time()
        with self.tx() as c:
            if ids:
                marks = ",".join("?" * len(ids))
                held = c.execute(f"""UPDATE segments SET lease_expires = ? WHERE state = 'leased' AND worker_id = ?
                                     AND id IN ({marks})""", [now + lease_s, worker_id] + list(ids)).rowcount
            c.execute("UPDATE jobs SET assembly_expires = ? WHERE assembly_worker = ?", (now + lease_s, worker_id))
            self._register(c, worker_id, now)  # again, if it was forgotten (`_prune`) while cut off
        return held

    def release(self, worker_id: str, ids: Sequence[int]) -> None:
        """Give leased segments back unworked (clean shutdown): the attempt does not count."""
        if not ids:
            return
        marks = ",".join("?" * len(ids))
        with self.tx() as c:
            c.execute(f"""UPDATE segments SET state = 'queued', worker_id = NULL, lease_expires = NULL,
                          attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END
                          WHERE state = 'leased' AND worker_id = ? AND id IN ({marks})""", [worker_id] + list(ids))

    def begin_assembly(self, job_id: str, worker_id: str, lease_s: float) -> bool:
        """Take the right to assemble a finished job (one worker wins; the one holding it may take it again)."""
        now = time.time()
        with self.tx() as c:
            self._reap_dead(c, now)
            self._register(c, worker_id, now)
            cur = c.execute("""UPDATE jobs SET assembly_worker = ?, assembly_expires = ?, state = 'running'
                               WHERE id = ? AND state IN ('queued', 'running')
                               AND (assembly_worker IS NULL OR assembly_expires < ? OR assembly_worker = ?)
                               AND NOT EXISTS (SELECT 1 FROM segments s WHERE s.job_id = ?
                                               AND s.state IN ('queued', 'leased'))""",
                            (worker_id, now + lease_s, job_id, now, worker_id, job_id))
        return cur.rowcount == 1


def fair_turns(jobs: Sequence[dict], n: int) -> list[str]:
    """Hand out up to `n` segments one at a time and return the job id of each: to the highest `priority`,
    then to the job with the fewest in work (`busy` plus those handed out here), then the oldest
    (`created_at`, `id`); a job gets at most its `waiting` segments."""
    heap = [(-j["priority"], j["busy"], j["created_at"] or 0.0, j["id"], j["waiting"]) for j in jobs if j["waiting"] > 0]
    heapq.heapify(heap)
    turns: list[str] = []
    while heap and len(turns) < n:
        prio, busy, created, job_id, left = heapq.heappop(heap)
        turns.append(job_id)
        if left > 1:
            heapq.heappush(heap, (prio, busy + 1, created, job_id, left - 1))
    return turns
