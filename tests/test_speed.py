"""Speaking speed: time-stretch with the pitch kept, whole or streamed in chunks; jobs (book, subtitles)
and the speech API (chunked stream, 400 out of range)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf

from audio.speed import StreamStretcher, check_speed, stretch
from daemon_util import Daemon, base_config, needs_daemon
from jobs.assemble import write_segment_audio
from jobs.book import assemble_job
from jobs.queue import Queue
from jobs.settings import JobSpec, Paths
from jobs.submit import submit_file

SR = 24000


def tone(seconds=2.0, freq=220.0):
    t = np.arange(int(SR * seconds)) / SR
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def peak_hz(audio) -> float:
    return float(np.fft.rfftfreq(audio.size, 1 / SR)[np.argmax(np.abs(np.fft.rfft(audio)))])


def test_range_is_checked():
    assert check_speed(None) == 1.0 and check_speed(2) == 2.0
    assert check_speed(0.25) == 0.25 and check_speed(4) == 4.0  # OpenAI's and vllm-omni's range
    for bad in (0.2, 4.5, "fast", True):
        with pytest.raises(ValueError, match="from 0.25 to 4.0"):
            check_speed(bad)
    with pytest.raises(ValueError, match="speed"):
        JobSpec.parse({"speed": 5})


@pytest.mark.parametrize("speed", [0.25, 0.5, 1.5, 2.0, 4.0])
def test_stretch_changes_length_not_pitch(speed):
    a = tone()
    whole = stretch(a, SR, speed)
    assert abs(whole.size - a.size / speed) <= 0.01 * a.size
    assert abs(peak_hz(whole) - 220) < 3
    s = StreamStretcher(SR, speed)
    outs = [s.push(a[i:i + 1920]) for i in range(0, a.size, 1920)] + [s.finish()]
    streamed = np.concatenate(outs)
    assert sum(1 for o in outs[:-1] if o.size) >= 3, "stretched audio must come out while input arrives"
    assert abs(streamed.size - a.size / speed) <= 0.01 * a.size
    assert abs(peak_hz(streamed) - 220) < 3
    assert np.abs(np.diff(streamed)).max() < 0.05, "a click where blocks meet"
    assert stretch(a, SR, 1.0) is not None and np.array_equal(stretch(a, SR, 1.0), a)


def test_job_speed_stretches_the_book_and_its_subtitles(tmp_path):
    paths = Paths(tmp_path / "home").ensure()
    q = Queue(paths.db)
    src = tmp_path / "b.txt"
    src.write_text("One short sentence here.\n\nAnother short sentence there.\n")
    job_id, err = submit_file(q, paths, src, JobSpec(voice="ryan", format="wav", title="S", speed=2.0))
    assert err is None
    for r in q.claim("w", 10, 60):
        path = paths.audio / f"{r['idx']}.wav"
        write_segment_audio(path, tone(1.0 + r["idx"]), SR)
        q.complete(r["id"], f"k{r['idx']}", str(path), SR, SR, r["seed"])
    assert assemble_job(q, paths, job_id) == "done"
    m = json.loads((paths.output / job_id / "manifest.json").read_text())
    segs = [s for c in m["chapters"] for s in c["segments"]]
    for s in segs:  # each segment at half its length, the pauses as they were
        assert s["end_s"] - s["start_s"] == pytest.approx((1.0 + s["index"]) / 2, abs=0.02)
    book = sf.read(m["output"]["book"])[0]
    speech = sum(1.0 + s["index"] for s in segs) / 2
    assert len(book) / SR == pytest.approx(speech + sum(s["pause_after_ms"] for s in segs) / 1000, abs=0.05)
    assert abs(peak_hz(book[:int(segs[0]["end_s"] * SR)]) - 220) < 5


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("speed")
    d = Daemon(tmp, base_config(tmp, jobs={"watch": False})).start()
    yield d
    assert d.stop() == 0


def _stream(daemon, **kw):
    body = {"model": "tts-1", "input": "Hello there.", "voice": "ryan", "max_frames": 24, "seed": 1,
            "response_format": "pcm", "stream": True, **kw}
    c = daemon.conn()
    c.request("POST", "/v1/audio/speech", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r, data


@needs_daemon
def test_speech_api_speed(daemon):
    r1, normal = _stream(daemon)
    assert r1.status == 200 and len(normal) > 0
    for speed in (2.0, 4.0, 0.25):  # the whole range of OpenAI's and vllm-omni's speech APIs, streamed
        r2, stretched = _stream(daemon, speed=speed)
        assert r2.status == 200 and r2.getheader("Transfer-Encoding") == "chunked", stretched[:300]
        assert len(stretched) / len(normal) == pytest.approx(1 / speed, rel=0.06), speed
    r3, whole = _stream(daemon, speed=0.25, stream=False)  # one complete file, stretched whole
    assert r3.status == 200 and len(whole) / len(normal) == pytest.approx(4, rel=0.06)
    status, body, _ = daemon.request("POST", "/v1/audio/speech", json.dumps(
        {"input": "Hi.", "voice": "ryan", "speed": 4.5}).encode(), {"Content-Type": "application/json"})
    assert status == 400 and "from 0.25 to 4.0" in json.dumps(body)
