"""A full disk, live: the daemon's spool folder (jobs.home) on a 20 MB tmpfs, filled to the last byte while a
book is synthesized. The job waits: one error line naming the folder and the space needed, /health degraded
(200: speech goes on), nothing failed and no segment synthesized twice, no worker restarted; once the filler
is removed the book is finished by itself. Needs root to mount the tmpfs: skips with the reason elsewhere, a
failure where $TTS_APPLIANCE_REQUIRE_SYSTEM_TESTS=1 (CI runs as root)."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from daemon_util import Daemon, base_config, book_text, skip_reason

from appliance.client import DaemonClient
from jobs.settings import JobSpec

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]


@pytest.fixture
def tmpfs():
    """A fresh 20 MB tmpfs, unmounted after the test."""
    if skip_reason():
        pytest.skip(skip_reason())
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs this as root)")
    where = Path(tempfile.mkdtemp(prefix="tts-tmpfs-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m,mode=0755", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        where.rmdir()


def _fill(path: Path) -> int:
    """Write `path` until the filesystem has no byte left; returns its size."""
    block = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1 << 9):
            while True:
                try:
                    f.write(block[:size])
                except OSError:
                    break
    return path.stat().st_size


def _until(cond, what: str, daemon: Daemon, timeout: float = 300.0):
    deadline = time.monotonic() + timeout
    while not (result := cond()):
        assert time.monotonic() < deadline, f"never: {what}\n{daemon.log_text()[-4000:]}"
        time.sleep(0.1)
    return result


def _disk_gauges(daemon: Daemon) -> dict:
    """tts_disk_ok and tts_disk_free_bytes of /metrics, read by prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    text = daemon.get("/metrics")[1].decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name in ("tts_disk_ok", "tts_disk_free_bytes")}


def test_a_full_spool_folder_makes_the_book_wait_and_it_goes_on_when_space_returns(tmpfs, tmp_path):
    home = tmpfs / "home"
    cfg = base_config(tmp_path, jobs={"home": str(home), "batch_size": 4, "min_free_mb": 1, "lease_s": 120.0})
    daemon = Daemon(tmp_path, cfg).start()
    filler = tmpfs / "filler"
    try:
        book = tmp_path / "book.txt"
        book.write_text(book_text(40))
        job_id, err = DaemonClient(daemon.socket).submit_file(
            book, JobSpec(voice="ryan", format="flac", sampling={"max_new_tokens": 12}))
        assert err is None
        _until(lambda: daemon.get(f"/v1/jobs/{job_id}")[1]["progress"]["done"] >= 2, "2 segments done", daemon)
        _fill(filler)
        line = _until(lambda: [x for x in daemon.log_text().splitlines() if "disk full" in x], "the disk full line",
                      daemon)
        assert " ERROR " in line[0] and str(home) in line[0] and "needs about" in line[0], line
        status, health, _ = daemon.get("/health")
        assert status == 200 and health["status"] == "degraded" and health["disk"]["ok"] is False, health
        assert "disk full" in health["disk"]["error"] and str(home) in health["disk"]["error"]
        gauges = _disk_gauges(daemon)  # what /health shows (the tmpfs is full: its free bytes stay put)
        assert gauges == {"tts_disk_ok": 0, "tts_disk_free_bytes": daemon.get("/health")[1]["disk"]["free_bytes"]}
        s = daemon.get(f"/v1/jobs/{job_id}")[1]
        assert s["state"] == "running" and s["progress"]["failed"] == 0, s

        filler.unlink()  # space returns
        s = daemon.wait_job(job_id, timeout=600)
        assert s["state"] == "done" and s["progress"]["done"] == s["progress"]["total"] == 40, s
        status, health, _ = daemon.get("/health")
        assert health["status"] == "ok" and health["disk"]["ok"] is True
        assert _disk_gauges(daemon)["tts_disk_ok"] == 1
        assert all(p["restarts"] == 0 for p in health["parts"].values()), health["parts"]
    finally:
        filler.unlink(missing_ok=True)
        daemon.stop()
    log = daemon.log_text()
    errors = [x for x in log.splitlines() if " ERROR " in x or "Traceback" in x or "LibsndfileError" in x]
    assert len(errors) == 1 and "disk full" in errors[0], errors
    assert "room again" in log
    db = sqlite3.connect(home / "queue.db")
    twice = db.execute("SELECT segment_id, COUNT(*) FROM synth_log GROUP BY segment_id HAVING COUNT(*) > 1").fetchall()
    assert twice == [], f"segments synthesized more than once: {twice}"
    assert db.execute("SELECT COUNT(DISTINCT segment_id) FROM synth_log").fetchone()[0] == 40
    db.close()
