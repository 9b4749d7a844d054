"""What a job's progress, time left and length are read from (a mixin of `jobs.queue.Queue`): its segments'
totals by state, and when its finished segments finished (`jobs.eta`)."""
from __future__ import annotations


class Progress:
    """Needs `store` and `_rows()` of the Queue."""

    def segment_totals(self, job_id: str) -> dict[str, dict]:
        """{state: {"segments", "chars", "audio_s", "pause_ms"}} of one job's segments (states without any
        left out): how many, their text's characters, the seconds of audio made (done ones) and their pauses."""
        rows = self.store.execute("""SELECT state, COUNT(*), SUM(LENGTH(text)), SUM(duration_s), SUM(pause_after_ms)
                                     FROM segments WHERE job_id = ? GROUP BY state""", [job_id]).fetchall()
        return {state: {"segments": int(n), "chars": int(chars or 0), "audio_s": float(audio or 0.0),
                        "pause_ms": int(pause or 0)} for state, n, chars, audio, pause in rows}

    def finishes(self, job_id: str, limit: int = 2000) -> list[tuple[float, int]]:
        """(when it finished, its text's characters) of the job's `limit` most recently finished segments,
        oldest first."""
        rows = self.store.execute("""SELECT updated_at, LENGTH(text) FROM segments WHERE job_id = ? AND state = 'done'
                                     ORDER BY updated_at DESC LIMIT ?""", [job_id, int(limit)]).fetchall()
        return [(float(t), int(n)) for t, n in reversed(rows)]
