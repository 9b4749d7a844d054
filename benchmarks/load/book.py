"""A book job running beside the streams of the load benchmark (benchmarks/load.py --book N).

The book goes in through the daemon's jobs API as a multipart upload (works for a daemon on another
user's socket too: no server-side path needed). Two body shapes exist: a `file` part plus a `spec`
part holding the job settings as JSON (the newer API), or a `file` part plus one form field per
setting (the older one). `submit_book` tries the newer shape and falls back to the older one when
the server rejects the `spec` part.

`BookLoad` keeps one book job in work: when a book finishes it submits the next one with another
seed (new audio keys, so nothing comes from the audio cache), and `sample()` returns the segments
done so far over all its books, plus their audio seconds when it can know them: from the job
summary if the daemon ever reports them, else, for a daemon this benchmark started, from the
queue database read only (`segments.duration_s`).
"""
from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Optional

from benchmarks.load.client import Target, http_request, multipart
from benchmarks.load.text import book_text

TERMINAL = ("done", "failed", "cancelled", "partial")


class BookError(RuntimeError):
    """The book job could not be submitted or followed."""


def _message(body) -> str:
    if isinstance(body, dict):
        err = body.get("error")
        return str(err.get("message") if isinstance(err, dict) else body)[:400]
    return (body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body))[:400]


async def submit_book(target: Target, text: str, spec: dict, timeout: float = 120.0) -> tuple[dict, str]:
    """Submit `text` as a job with settings `spec` (JobSpec fields; `sampling` may hold max_new_tokens).
    Returns (job summary, 'spec-part' or 'form-fields': the body shape the daemon took)."""
    file = {"file": ("load-book.txt", text.encode("utf-8"), "text/plain")}
    body, ctype = multipart({"spec": json.dumps(spec)}, file)
    status, _, answer = await http_request(target, "POST", "/v1/jobs", body, ctype, timeout)
    if status in (200, 201):
        return answer, "spec-part"
    first = f"HTTP {status}: {_message(answer)}"
    if status not in (400, 415, 422) or status == 422 and isinstance(answer, dict) and answer.get("id"):
        raise BookError(f"POST /v1/jobs (multipart with a 'spec' part) failed: {first}")
    old = {k: v for k, v in spec.items() if k != "sampling" and v is not None}
    old.update({k: v for k, v in (spec.get("sampling") or {}).items() if k == "max_new_tokens"})
    body, ctype = multipart({k: str(v) for k, v in old.items()}, file)
    status, _, answer = await http_request(target, "POST", "/v1/jobs", body, ctype, timeout)
    if status in (200, 201):
        return answer, "form-fields"
    raise BookError(f"POST /v1/jobs failed in both body shapes: with a 'spec' part {first}; with form fields "
                    f"HTTP {status}: {_message(answer)}")


class BookLoad:
    """One book job at a time, resubmitted with the next seed whenever the last one ends."""

    def __init__(self, target: Target, segments: int, spec: dict, db_path: Optional[Path] = None,
                 text: Optional[str] = None):
        """`text`: the book's text (default: `book_text(segments)`, generated)."""
        self.target, self.segments, self.spec, self.db_path = target, segments, dict(spec), db_path
        self.text = text if text is not None else book_text(segments)
        self.jobs: list[dict] = []  # {"id", "state", "done", "total", "submitted_at"}
        self.shape: Optional[str] = None
        self.errors: list[str] = []
        self.stopped = False  # a book ended without any work done: no more resubmissions
        self._lock = asyncio.Lock()  # one sample (and resubmission) at a time

    @property
    def current(self) -> Optional[dict]:
        return self.jobs[-1] if self.jobs else None

    async def submit_next(self) -> dict:
        spec = {**self.spec, "seed": int(self.spec.get("seed") or 0) + len(self.jobs),
                "title": f"load benchmark book {len(self.jobs) + 1}"}
        summary, self.shape = await submit_book(self.target, self.text, spec)
        if not isinstance(summary, dict) or "id" not in summary:
            raise BookError(f"POST /v1/jobs answered without a job id: {str(summary)[:300]}")
        p = summary.get("progress") or {}
        job = {"id": summary["id"], "state": summary.get("state"), "done": p.get("done", 0),
               "total": p.get("total"), "submitted_at": time.time()}
        if summary.get("submit_error"):
            raise BookError(f"the daemon took the book but could not queue it: {summary['submit_error']}")
        self.jobs.append(job)
        return job

    async def _refresh(self, job: dict) -> None:
        status, _, s = await http_request(self.target, "GET", f"/v1/jobs/{job['id']}", timeout=30.0)
        if status != 200 or not isinstance(s, dict):
            raise BookError(f"GET /v1/jobs/{job['id']}: HTTP {status}: {_message(s)}")
        p = s.get("progress") or {}
        job.update(state=s.get("state"), done=int(p.get("done", 0)), total=p.get("total"),
                   failed=p.get("failed", 0))
        for key in ("audio_s", "done_audio_s", "audio_done_s"):  # if the daemon ever reports it
            if isinstance(p.get(key), (int, float)):
                job["audio_s"] = float(p[key])

    def _db_audio(self) -> Optional[float]:
        if self.db_path is None or not self.db_path.is_file():
            return None
        ids = [j["id"] for j in self.jobs]
        try:
            conn = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=5.0)
            try:
                row = conn.execute(f"SELECT SUM(duration_s) FROM segments WHERE state = 'done' AND job_id IN "
                                   f"({','.join('?' * len(ids))})", ids).fetchone()
            finally:
                conn.close()
        except sqlite3.Error:
            return None
        return float(row[0] or 0.0)

    async def sample(self, keep_running: bool = True) -> dict:
        """{"t", "done", "audio_s" (None if unknown), "audio_source", "books", "state"} now; submits the
        next book first when the current one has ended and `keep_running`."""
        async with self._lock:
            return await self._sample(keep_running)

    async def _sample(self, keep_running: bool) -> dict:
        try:
            if self.current and self.current["state"] not in TERMINAL:
                await self._refresh(self.current)
            job = self.current
            if keep_running and job and job["state"] in TERMINAL:
                if job["done"] == 0 and job["state"] != "done":
                    if not self.stopped:
                        self.errors.append(f"book {job['id']} ended {job['state']} with no segment done: "
                                           "not resubmitting (see the daemon log)")
                    self.stopped = True
                else:
                    await self.submit_next()
        except (BookError, OSError, asyncio.TimeoutError) as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
        t = time.perf_counter()
        done = sum(j["done"] for j in self.jobs)
        audio, source = None, None
        if self.jobs and all("audio_s" in j for j in self.jobs):
            audio, source = sum(j["audio_s"] for j in self.jobs), "jobs api"
        elif self.db_path is not None:
            audio = await asyncio.get_running_loop().run_in_executor(None, self._db_audio)
            source = "queue database" if audio is not None else None
        return {"t": t, "done": done, "audio_s": audio, "audio_source": source, "books": len(self.jobs),
                "state": self.current["state"] if self.current else None}

    async def cancel(self) -> None:
        """Cancel the book in work (best effort)."""
        job = self.current
        if job and job["state"] not in TERMINAL:
            try:
                await http_request(self.target, "POST", f"/v1/jobs/{job['id']}/cancel", timeout=30.0)
            except (OSError, asyncio.TimeoutError) as exc:
                self.errors.append(f"cancel {job['id']}: {exc}")
