"""Where the listener stopped in each book (a mixin of `jobs.queue.Queue`): one row per job, the latest
place any player of this appliance saved (`PUT /v1/jobs/{id}/position`), so a book opened in another
browser, or on another device, goes on from there. The appliance has one listener per book: whoever
plays it last moves its place."""
from __future__ import annotations

import time
from typing import Optional


class Positions:
    """Needs `tx()` and `_rows()` of the Queue."""

    def position(self, job_id: str) -> Optional[dict]:
        """{"position_s", "chapter", "updated_at"} saved for `job_id`, or None when none was."""
        rows = self._rows("SELECT position_s, chapter, updated_at FROM positions WHERE job_id = ?", [job_id])
        return rows[0] if rows else None

    def set_position(self, job_id: str, position_s: float, chapter: Optional[int] = None) -> dict:
        """Keep `position_s` seconds into `job_id`'s book (in `chapter`, 0-based, when given) as its place;
        answers what `position` then reads."""
        now = time.time()
        with self.tx() as c:
            c.execute("""INSERT INTO positions (job_id, position_s, chapter, updated_at) VALUES (?, ?, ?, ?)
                         ON CONFLICT (job_id) DO UPDATE SET position_s = excluded.position_s,
                         chapter = excluded.chapter, updated_at = excluded.updated_at""",
                      (job_id, float(position_s), chapter, now))
        return {"position_s": float(position_s), "chapter": chapter, "updated_at": now}

    def forget_position(self, job_id: str) -> None:
        """Drop `job_id`'s place (its book was deleted)."""
        with self.tx() as c:
            c.execute("DELETE FROM positions WHERE job_id = ?", (job_id,))
