"""What goes when a job's working files are removed or the job is deleted (a mixin of `jobs.queue.Queue`).

Segment audio is shared by content: two jobs whose segments have the same text, voice, seed and model
(a book submitted again as mp3) name the same file, and the audio cache (`audio_cache`: content key ->
file) hands it to later segments. A file goes only when no segment row names it any more: each batch
of a job's segment rows is deleted, then the files its rows named that no other row names are handed
to `remove` (which deletes them) inside the same transaction, with their cache entries. A cache hit
being recorded (`Records.complete_cached`) locks its entry: a removal waits for it and then sees the
segment that now names the file, or the hit finds the entry gone and the segment is synthesized. New
audio never lands on a name being removed: each write has a name of its own (jobs.worker).

`remove_work` (retention, jobs.retention) keeps a job's row, chapters, log and failed segments (what
`status`, `list`, `logs` and the page show; the counts of the rows removed go to `removed_counts`) and
marks it `work_removed_at`: retry and redo are refused after it. `delete_job` removes every row of the
job. Both only touch rows whose audio lies under `home` (a daemon removes files in its own spool folder;
several hosts share one: docs/SCALE.md).
"""
from __future__ import annotations

import json
import time
from typing import Callable, Iterable

from jobs.queue.records import QueueError, TERMINAL

BATCH = 400  # segment rows per removal transaction (other writers wait for one batch's files, not a book's)
Remove = Callable[[list[str]], None]  # deletes these files (inside the transaction that forgets them)


class Removal:
    """Needs `tx()`, `_rows()`, `job()` and `store` of the Queue."""

    def job_states(self, job_ids: Iterable[str]) -> dict[str, str]:
        """{job id: state} of these jobs; a job that does not exist (deleted) is left out."""
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        return dict(self.store.execute(f"SELECT id, state FROM jobs WHERE id IN ({marks})", ids).fetchall())

    def ended_before(self, cutoff: float) -> list[str]:
        """Jobs that ended (done, partial, failed, cancelled) before `cutoff` and still have their working
        files, oldest first."""
        marks = ",".join("?" * len(TERMINAL))
        return [r[0] for r in self.store.execute(
            f"""SELECT id FROM jobs WHERE state IN ({marks}) AND finished_at < ? AND work_removed_at IS NULL
                ORDER BY finished_at""", [*TERMINAL, cutoff]).fetchall()]

    def working_files(self) -> dict[str, list[str]]:
        """{job id: the files it still names besides segment audio}: for a job whose working files are kept,
        its sources, the cover and the narrated EPUB's book; for one whose working files went, its cover
        (the library shows it for as long as the job is there)."""
        out = {}
        for r in self._rows("SELECT id, sources, meta, work_removed_at FROM jobs"):
            meta = json.loads(r["meta"] or "{}")
            files = [meta["cover_path"]] if meta.get("cover_path") else []
            if r["work_removed_at"] is None:
                files += list(json.loads(r["sources"] or "[]"))
                files += [p for p in ((meta.get("narration") or {}).get("package"),) if p]
            out[r["id"]] = files
        return out

    def audio_in_use(self, paths: Iterable[str]) -> set[str]:
        """Which of these audio files a segment row or a cache entry names."""
        paths, used = sorted(set(paths)), set()
        for start in range(0, len(paths), BATCH):
            part = paths[start:start + BATCH]
            marks = ",".join("?" * len(part))
            for sql in (f"SELECT audio_path FROM segments WHERE audio_path IN ({marks})",
                        f"SELECT path FROM audio_cache WHERE path IN ({marks})"):
                used.update(r[0] for r in self.store.execute(sql, part).fetchall())
        return used

    def unused_cache(self, before: float, remove: Remove, home: str) -> int:
        """Cache entries made before `before` that no segment row names (a redo's earlier take; a deleted
        job's audio another host wrote), with their files under `home`; returns how many."""
        n = 0
        while True:
            with self.tx() as c:
                rows = c.execute(f"""SELECT key, path FROM audio_cache c WHERE created_at < ? AND {_under('path')}
                                     AND NOT EXISTS (SELECT 1 FROM segments s WHERE s.audio_path = c.path)
                                     LIMIT {BATCH}""" + self.store.for_update, (before, *_args(home))).fetchall()
                if not rows:
                    return n
                marks = ",".join("?" * len(rows))
                c.execute(f"DELETE FROM audio_cache WHERE key IN ({marks})", [r[0] for r in rows])
                remove(sorted({r[1] for r in rows}))
                n += len(rows)

    def remove_work(self, job_id: str, remove: Remove, home: str) -> bool:
        """Remove an ended job's segment rows but its failed ones, and the audio files no other row names
        (module docstring); True once none is left (the job is marked `work_removed_at`). False when its
        rows with audio in another spool folder stay (that folder's daemon removes them)."""
        job = self.job(job_id)
        if job["state"] not in TERMINAL:
            raise QueueError(f"job {job_id} is {job['state']}: its working files are in use")
        while self._remove_batch(job_id, remove, home, keep_failed=True):
            pass
        with self.tx() as c:
            left = c.execute("""SELECT COUNT(*) FROM segments WHERE job_id = ? AND state <> 'failed'""",
                             (job_id,)).fetchone()[0]
            if left:
                return False
            c.execute("UPDATE jobs SET work_removed_at = ? WHERE id = ? AND work_removed_at IS NULL",
                      (time.time(), job_id))
            self._event(c, job_id, "working files removed (jobs.keep_work_days); the outputs stay")
        return True

    def delete_job(self, job_id: str, remove: Remove, home: str) -> dict:
        """Remove every row of job `job_id` (it must have ended: cancel it first) and the audio files no
        other row names, those under `home`; returns the job's row as it was (QueueError: no such job)."""
        job = self.job(job_id)
        if job["state"] not in TERMINAL:
            raise QueueError(f"job {job_id} is {job['state']}: cancel it before deleting it")
        while self._remove_batch(job_id, remove, home, keep_failed=False, anywhere=True):
            pass
        with self.tx() as c:
            for sql in ("DELETE FROM segments WHERE job_id = ?", "DELETE FROM chapters WHERE job_id = ?",
                        "DELETE FROM events WHERE job_id = ?", "DELETE FROM submissions WHERE job_id = ?",
                        "DELETE FROM inbox_files WHERE job_id = ?", "DELETE FROM positions WHERE job_id = ?",
                        "DELETE FROM jobs WHERE id = ?"):
                c.execute(sql, (job_id,))
        return job

    def _remove_batch(self, job_id: str, remove: Remove, home: str, keep_failed: bool,
                      anywhere: bool = False) -> bool:
        """One batch of `remove_work` / `delete_job`: True when rows were removed."""
        with self.tx() as c:
            where = ["s.job_id = ?"] + (["s.state <> 'failed'"] if keep_failed else [])
            args: list = [job_id]
            if not anywhere:
                where.append(f"(s.audio_path IS NULL OR {_under('s.audio_path')})")
                args += _args(home)
            rows = c.execute(f"SELECT s.id, s.state, s.audio_path, s.duration_s, s.pause_after_ms FROM segments s "
                             f"WHERE {' AND '.join(where)} "
                             f"ORDER BY s.id LIMIT {BATCH}" + self.store.skip_locked, args).fetchall()
            if not rows:
                return False
            ids = [r[0] for r in rows]
            paths = sorted({r[2] for r in rows if r[2]})
            if paths:  # a cache hit being recorded holds its entry: wait for it (then its segment is seen)
                c.execute(f"SELECT key FROM audio_cache WHERE path IN ({','.join('?' * len(paths))})"
                          + self.store.for_update, paths).fetchall()
            marks = ",".join("?" * len(ids))
            c.execute(f"DELETE FROM synth_log WHERE segment_id IN ({marks})", ids)
            c.execute(f"DELETE FROM segments WHERE id IN ({marks})", ids)
            if keep_failed:
                self._count_removed(c, job_id, [(r[1], r[3], r[4]) for r in rows])
            if paths:
                pm = ",".join("?" * len(paths))
                used = {r[0] for r in c.execute(f"SELECT audio_path FROM segments WHERE audio_path IN ({pm})",
                                                paths).fetchall()}
                gone = [p for p in paths if p not in used]
                if gone:
                    c.execute(f"DELETE FROM audio_cache WHERE path IN ({','.join('?' * len(gone))})", gone)
                    remove(gone)
        return True

    def _count_removed(self, c, job_id: str, removed: list[tuple]) -> None:
        """Add the rows `removed` ((state, seconds of audio, pause after in ms) each) to the job's
        `removed_counts`: {state: rows, "audio_s": {state: seconds}, "pause_ms": {state: ms}}."""
        row = c.execute("SELECT removed_counts FROM jobs WHERE id = ?" + self.store.for_update, (job_id,)).fetchone()
        counts = json.loads(row[0] or "{}") if row else {}
        audio, pause = counts.setdefault("audio_s", {}), counts.setdefault("pause_ms", {})
        for state, seconds, pause_ms in removed:
            counts[state] = counts.get(state, 0) + 1
            audio[state] = audio.get(state, 0.0) + float(seconds or 0.0)
            pause[state] = pause.get(state, 0) + int(pause_ms or 0)
        c.execute("UPDATE jobs SET removed_counts = ? WHERE id = ?", (json.dumps(counts), job_id))

    def removed_totals(self, job_id: str) -> dict[str, dict]:
        """{state: {"segments", "audio_s", "pause_ms"}} of the job's rows removed with its working files ({} when
        none were), as `jobs.queue.progress.Progress.segment_totals` reads the rows there are."""
        rows = self._rows("SELECT * FROM jobs WHERE id = ?", [job_id])  # a report may read a queue of an older step
        raw = json.loads(rows[0].get("removed_counts") or "{}") if rows else {}
        audio, pause = raw.get("audio_s", {}), raw.get("pause_ms", {})
        return {state: {"segments": n, "audio_s": float(audio.get(state, 0.0)), "pause_ms": int(pause.get(state, 0))}
                for state, n in raw.items() if isinstance(n, int)}


def _under(column: str) -> str:
    """SQL: `column` (a path) lies under the folder given by `_args` (no LIKE: a path may hold `_` or `%`)."""
    return f"substr({column}, 1, length(?)) = ?"


def _args(home: str) -> tuple[str, str]:
    prefix = home.rstrip("/") + "/"
    return prefix, prefix

