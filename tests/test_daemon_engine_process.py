"""The daemon's engine in a process of its own: killed mid-book, it is started again by the daemon,
/health says it was down, the segments it had in flight go back to the queue without counting an attempt,
and the book comes out complete with every segment synthesized to the end exactly once."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import soundfile as sf

from jobs.document import Chapter, Document
from jobs.queue import Queue
from jobs.settings import JobSpec, resolve_home
from jobs.submit import document_chapters, submit_document

from daemon_util import Daemon, base_config, needs_daemon

pytestmark = needs_daemon
SPEC = dict(voice="ryan", language="english", format="flac", seed=3, sampling={"max_new_tokens": 30})


def _book(n: int) -> Document:
    lines = [f"Paragraph {i} of the long book is read aloud now." for i in range(n)]
    return Document(chapters=[Chapter("One", lines[: n // 2]), Chapter("Two", lines[n // 2:])], title="Kill book")


def _engine_pid(d: Daemon) -> int:
    _, h, _ = d.get("/health")
    return h["engine"]["engines"][0]["pid"]


def test_a_killed_engine_process_loses_nothing_and_does_nothing_twice(tmp_path):
    cfg = base_config(tmp_path, runtime={"max_slots": 2, "max_queue": 8}, jobs={"batch_size": 2})
    d = Daemon(tmp_path, cfg).start()
    try:
        paths = resolve_home(cfg["jobs"]["home"])
        q = Queue(paths.db)
        doc = _book(16)
        job = submit_document(q, paths, doc, JobSpec(**SPEC, model=str(Path(cfg["model"]["path"]).resolve())),
                              ["kill.txt"], document_chapters(doc, JobSpec(**SPEC)))
        total = sum(q.counts(job).values())
        first_pid = _engine_pid(d)
        deadline = time.monotonic() + 240
        while q.counts(job)["done"] < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        counts = q.counts(job)
        assert 3 <= counts["done"] < total, counts
        os.kill(first_pid, signal.SIGKILL)

        seen_down = False
        while time.monotonic() < deadline:
            status, h, _ = d.get("/health")
            if status == 503 and "engine cpu" in h.get("down", {}):
                seen_down = True
            if seen_down and status == 200:
                break
            time.sleep(0.05)
        assert seen_down, "the dead engine never showed on /health"
        # one death, one restart: the time its new process takes to load is not counted as more deaths
        assert h["parts"]["engine cpu"]["restarts"] == 1 and _engine_pid(d) != first_pid, h["parts"]
        assert d.log_text().count("restarting engine cpu") == 1, d.log_text()[-3000:]

        s = d.wait_job(job, timeout=300)
        assert s["state"] == "done", s
        segs = q.segments(job)
        assert all(x["state"] == "done" and x["attempts"] == 1 for x in segs), [(x["idx"], x["attempts"]) for x in segs]
        rows = q.conn.execute("SELECT key, COUNT(finished_at) FROM synth_log GROUP BY key").fetchall()
        assert {r[0] for r in rows} == {x["key"] for x in segs} and all(r[1] == 1 for r in rows), rows
        manifest = json.loads((Path(q.job(job)["output_dir"]) / "manifest.json").read_text())
        data, sr = sf.read(manifest["output"]["book"])
        assert data.shape[0] / sr == pytest.approx(manifest["chapters"][-1]["book_end_s"], abs=0.01)
        log = d.log_text()
        assert "ended (killed by SIGKILL)" in log and "back to the queue" in log
        q.close()
    finally:
        d.stop()


def test_an_engine_that_cannot_start_ends_the_daemon_start_with_one_line(tmp_path):
    """A checkpoint whose config reads but whose weights are broken: the front starts, the engine process
    cannot load, and the daemon's start ends with status 78 (the unit's RestartPreventExitStatus: no restart can
    load it) and one line naming the engine, why and what to do."""
    import shutil

    model = tmp_path / "broken"
    shutil.copytree(Path(base_config(tmp_path)["model"]["path"]), model)
    (model / "model.safetensors").write_bytes(b"not a safetensors file")
    d = Daemon(tmp_path, base_config(tmp_path, model={"path": str(model)})).start(wait=False)
    code = d.proc.wait(120)
    d.logf.close()
    log = d.log_text()
    assert code == 78, log
    [line] = [x for x in log.splitlines() if "cannot start" in x]
    assert "tts_appliance.daemon: cannot start, and a restart would not help" in line, log
    assert "engine on cpu cannot start" in line and "model.safetensors" in line and "systemctl start" in line, log
