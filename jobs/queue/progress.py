"""What a job's progress, time left and length are read from (a mixin of `jobs.queue.Queue`): its segments'
totals by state, and when its finished segments finished (`jobs.eta`). A library lists every job every few
seconds: the totals and the finishes are read from one index (schema step 9, `segments_progress`), not from
the segments' text; only a running job's remaining text is read."""
from __future__ import annotations


class Progress:
    """Needs `store` and `removed_totals` (jobs.queue.removal) of the Queue."""

    def segment_totals(self, job_id: str) -> dict[str, dict]:
        """{state: {"segments", "audio_s", "pause_ms"}} of one job's segments (states without any left out): how
        many, the seconds of audio made (done ones) and their pauses; the rows removed with the job's working
        files (jobs.retention) counted as they were."""
        rows = self.store.execute("""SELECT state, COUNT(*), SUM(duration_s), SUM(pause_after_ms) FROM segments
                                     WHERE job_id = ? GROUP BY state""", [job_id]).fetchall()
        out = {state: {"segments": int(n), "audio_s": float(audio or 0.0), "pause_ms": int(pause or 0)}
               for state, n, audio, pause in rows}
        for state, gone in self.removed_totals(job_id).items():
            have = out.setdefault(state, {"segments": 0, "audio_s": 0.0, "pause_ms": 0})
            for k in have:
                have[k] += gone[k]
        return out

    def text_chars(self, job_id: str, states: tuple[str, ...]) -> int:
        """The characters of the text of the job's segments in `states` (what is left to make: queued, leased)."""
        marks = ",".join("?" * len(states))
        row = self.store.execute(f"SELECT SUM(LENGTH(text)) FROM segments WHERE job_id = ? AND state IN ({marks})",
                                 [job_id, *states]).fetchone()
        return int(row[0] or 0)

    def finishes(self, job_id: str, limit: int = 2000) -> list[tuple[float, int]]:
        """(when it finished, its text's characters) of the job's `limit` most recently finished segments,
        oldest first."""
        rows = self.store.execute("""SELECT updated_at, LENGTH(text) FROM segments WHERE job_id = ? AND state = 'done'
                                     ORDER BY updated_at DESC LIMIT ?""", [job_id, int(limit)]).fetchall()
        return [(float(t), int(n)) for t, n in reversed(rows)]
