"""The real daemon keeps its parts alive: a dead inbox watcher shows in /health (503, which part and why)
and is restarted with a log line once it can run again; a job whose book cannot be written ends `failed`
with the reason while the worker goes on, and is assembled again after a restart of the daemon.
(The supervisor itself, backoff and the engine loop's fatal path: test_supervise.py.)"""
from __future__ import annotations

import shutil
import time

from daemon_util import Daemon, base_config, book_text, needs_daemon
from jobs.queue import Queue

pytestmark = needs_daemon


def _health_until(d: Daemon, check, timeout: float = 300.0):  # (a failure guard)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, h, _ = d.get("/health")
        if check(status, h):
            return h
        time.sleep(0.1)
    raise AssertionError(f"/health never matched; last {status}: {h}\n{d.log_text()[-3000:]}")


def test_a_dead_inbox_watcher_is_shown_down_and_restarted(tmp_path):
    d = Daemon(tmp_path, base_config(tmp_path, jobs={"watch": True})).start()
    try:
        status, h, _ = d.get("/health")
        assert status == 200 and h["status"] == "ok", h
        assert {"inbox", "jobs-0", "engine cpu"} <= set(h["parts"]) and all(p["ok"] for p in h["parts"].values())
        inbox = d.home / "inbox"
        shutil.rmtree(inbox)
        inbox.write_text("an admin put a file where the inbox folder was")
        h = _health_until(d, lambda s, h: s == 503)
        assert h["status"] == "degraded" and set(h["down"]) == {"inbox"} and "Error" in h["down"]["inbox"], h
        assert not h["parts"]["inbox"]["ok"] and h["parts"]["jobs-0"]["ok"]
        assert "inbox died: NotADirectoryError" in d.log_text()
        inbox.unlink()  # the cause goes away: the next restart succeeds
        h = _health_until(d, lambda s, h: s == 200)
        assert h["status"] == "ok" and h["parts"]["inbox"]["ok"] and h["parts"]["inbox"]["restarts"] >= 1
        assert "inbox is down (NotADirectoryError" in d.log_text() and "restarting inbox (restart 1)" in d.log_text()
        assert inbox.is_dir()
    finally:
        assert d.stop() == 0


def test_a_job_whose_book_cannot_be_written_fails_with_why_and_is_retried_after_a_restart(tmp_path):
    (tmp_path / "allowed").mkdir()
    cfg = base_config(tmp_path, jobs={"allowed_dirs": [str(tmp_path / "allowed")], "watch": False})
    book = tmp_path / "allowed" / "b.txt"
    book.write_text(book_text(2))
    d = Daemon(tmp_path, cfg).start()
    output = d.home / "output"
    try:
        shutil.rmtree(output)
        output.write_text("not a folder")  # no book can be written under it
        status, s, _ = d.post("/v1/jobs", {"path": str(book), "spec": {"voice": "ryan", "format": "wav",
                                                                       "sampling": {"max_new_tokens": 4}}})
        assert status == 201, s
        job_id = s["id"]
        s = d.wait_job(job_id)
        assert s["state"] == "failed" and s["error"].startswith("assembly failed: "), s
        assert f"tts-appliance retry {job_id}" in s["error"]
        status, h, _ = d.get("/health")
        assert status == 200 and h["parts"]["jobs-0"] == {"ok": True, "restarts": 0, "books": {}}, h
        assert "Exception in thread" not in d.log_text()
    finally:
        assert d.stop() == 0
    output.unlink()
    output.mkdir()
    d.start()
    try:
        s = d.wait_job(job_id, states=("done",))
        assert s["state"] == "done" and not s.get("error"), s
        q = Queue(d.home / "queue.db")
        assert sum("trying it once more" in e["message"] for e in q.events(job_id)) == 1
        assert q.job(job_id)["assembly_attempts"] == 0
        q.close()
    finally:
        assert d.stop() == 0
