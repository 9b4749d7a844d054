"""The watched inbox's files (a mixin of `jobs.queue.Queue`): one `inbox_files` row per content (sha256)
taken from the inbox, with its state (`ingesting`, `processing` while its job runs, then `done` or
`failed`), where the file and its sidecar lie now, the job it became and why it failed (jobs.watch)."""
from __future__ import annotations

import time
from typing import Optional


class InboxFiles:
    """Needs `tx()` and `_rows()` of the Queue."""

    def inbox_file(self, digest: str) -> Optional[dict]:
        """The row of the file whose content has sha256 `digest`, if one was taken."""
        rows = self._rows("SELECT * FROM inbox_files WHERE sha256 = ?", [digest])
        return rows[0] if rows else None

    def inbox_files(self) -> list[dict]:
        return self._rows("SELECT * FROM inbox_files")

    def record_inbox_file(self, digest: str, name: str, job_id: Optional[str], state: str, path: str,
                          sidecar: Optional[str] = None, reason: Optional[str] = None) -> None:
        """Where the file of content `digest` stands now (the row is made or replaced, taken now)."""
        with self.tx() as c:
            c.execute("""INSERT INTO inbox_files (sha256, name, job_id, state, path, sidecar, reason, taken_at)
                         VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (sha256) DO UPDATE SET name = excluded.name,
                         job_id = excluded.job_id, state = excluded.state, path = excluded.path,
                         sidecar = excluded.sidecar, reason = excluded.reason, taken_at = excluded.taken_at""",
                      (digest, name, job_id, state, path, sidecar, reason, time.time()))

    def inbox_files_of_ended_jobs(self) -> list[dict]:
        """Rows still `processing` whose job has ended, with the job's `job_state`, `job_error` and output
        folder (`out`)."""
        return self._rows("""SELECT f.*, j.state AS job_state, j.error AS job_error, j.output_dir AS out
                             FROM inbox_files f JOIN jobs j ON j.id = f.job_id WHERE f.state = 'processing'
                             AND j.state IN ('done', 'partial', 'failed', 'cancelled')""")

    def inbox_file_filed(self, digest: str, state: str) -> None:
        """The file of content `digest` went to done/ or failed/ (`state`) with its job's results."""
        with self.tx() as c:
            c.execute("UPDATE inbox_files SET state = ?, finished_at = ? WHERE sha256 = ?", (state, time.time(), digest))
