"""Assembly memory does not grow with the book: a process whose data size is capped (RLIMIT_DATA) a
couple of hundred MB above what it uses once imported assembles a one-chapter book whose audio is about
twice that cap, and the files come out whole (frames, chapter boundaries, segment spans)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from jobs.assemble import write_segment_audio
from jobs.document import SegmentText
from jobs.queue import Queue
from jobs.settings import JobSpec, Paths

ROOT = Path(__file__).resolve().parents[1]
SR = 24000
LIMIT_MB = 160  # data the assembling process may add to what it holds after its imports
SEGMENT_S = 60.0
PAUSE_MS = 250

# the child: cap its data size, then assemble the job as the worker does
CHILD = """
import resource, sys
from jobs.book import assemble_job
from jobs.queue import Queue
from jobs.settings import Paths

def data_bytes():
    for line in open("/proc/self/status"):
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024

home, job_id, limit_mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
cap = data_bytes() + limit_mb * 2**20
resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
paths = Paths(__import__("pathlib").Path(home))
print(assemble_job(Queue(paths.db), paths, job_id))
"""


def _segment_files(paths: Paths) -> list[Path]:
    """A few distinct one-minute segments (reused: the book is long, the disk need not be)."""
    out = []
    t = np.arange(int(SR * SEGMENT_S), dtype=np.float32) / SR
    for i in range(3):
        path = paths.audio / f"long{i}.wav"
        write_segment_audio(path, (0.1 * (i + 1) * np.sin(2 * np.pi * (200 + 50 * i) * t)).astype(np.float32), SR)
        out.append(path)
    return out


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads VmData from /proc (Linux)")
def test_a_book_larger_than_the_memory_cap_is_assembled(tmp_path):
    paths = Paths(tmp_path / "home").ensure()
    q = Queue(paths.db)
    n_long = int(2 * LIMIT_MB * 2**20 / (SR * SEGMENT_S * 4)) + 1  # float32 audio of chapter 1: ~2x the cap
    chapters = [("Long", [SegmentText(f"long {i}", f"long {i}", PAUSE_MS) for i in range(n_long)]),
                ("Short", [SegmentText(f"short {i}", f"short {i}", PAUSE_MS) for i in range(2)])]
    job_id = q.add_job(JobSpec(format="wav", title="Long"), chapters)
    files = _segment_files(paths)
    for r in q.claim("w", 1000, 600):
        path = files[r["idx"] % len(files)]
        assert q.complete(r["id"], f"k{r['idx'] % len(files)}", str(path), SR, int(SR * SEGMENT_S), r["seed"])
    assert n_long * SEGMENT_S * SR * 4 > 2 * LIMIT_MB * 2**20

    run = subprocess.run([sys.executable, "-c", CHILD, str(paths.home), job_id, str(LIMIT_MB)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("done"), run.stdout + run.stderr[-3000:]

    m = json.loads((paths.output / job_id / "manifest.json").read_text())
    seg_frames = int(SR * SEGMENT_S) + int(SR * PAUSE_MS / 1000)
    book = sf.info(m["output"]["book"])
    assert book.frames == (n_long + 2) * seg_frames and book.samplerate == SR
    long_ch, short_ch = m["chapters"]
    assert sf.info(long_ch["file"]).frames == n_long * seg_frames
    assert sf.info(short_ch["file"]).frames == 2 * seg_frames
    assert short_ch["book_start_s"] == pytest.approx(n_long * seg_frames / SR, abs=1e-3)
    assert [s["start_s"] for s in long_ch["segments"]] == pytest.approx([i * seg_frames / SR for i in range(n_long)],
                                                                        abs=1e-3)
    # the book is its chapters in order: the samples around the boundary match the chapter files
    edge = n_long * seg_frames
    around = sf.read(m["output"]["book"], start=edge - SR, stop=edge + SR, dtype="int16")[0]
    tail = sf.read(long_ch["file"], start=edge - SR, dtype="int16")[0]
    head = sf.read(short_ch["file"], stop=SR, dtype="int16")[0]
    assert np.array_equal(around, np.concatenate([tail, head])) and np.abs(head).max() > 1000
    assert not list((paths.output / job_id).glob(".*")), "temp files left behind"


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads VmData from /proc (Linux)")
def test_an_assembly_that_runs_out_of_memory_fails_its_job_with_the_reason(tmp_path):
    """A segment too large for the cap: MemoryError ends the job `failed` saying so, not the process."""
    paths = Paths(tmp_path / "home").ensure()
    q = Queue(paths.db)
    job_id = q.add_job(JobSpec(format="wav", title="Big"), [("One", [SegmentText("a", "a", 0)])])
    big = paths.audio / "big.wav"
    write_segment_audio(big, np.full(SR * 600, 0.1, np.float32), SR)  # 55 MiB as float32
    for r in q.claim("w", 10, 60):
        q.complete(r["id"], "k", str(big), SR, SR * 600, r["seed"])
    run = subprocess.run([sys.executable, "-c", CHILD, str(paths.home), job_id, "40"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("failed"), run.stdout + run.stderr[-3000:]
    job = Queue(paths.db).job(job_id)
    assert job["state"] == "failed" and job["error"].startswith("assembly failed: MemoryError")
    assert f"tts-appliance retry {job_id}" in job["error"]
    assert json.loads((paths.output / job_id / "manifest.json").read_text())["job"]["state"] == "failed"
