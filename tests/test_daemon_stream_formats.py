"""Streamed speech in every format over the daemon's real Unix socket: with "stream": true the encoded
audio arrives chunk by chunk while the engine is still synthesizing, the joined bytes decode to the same
length as the PCM answer (within codec padding), and a client leaving mid-stream frees its slot."""
from __future__ import annotations

import json
import shutil
import subprocess
import time

import numpy as np
import pytest

from daemon_util import Daemon, base_config, needs_daemon

pytestmark = needs_daemon
FRAMES = 30  # 2.4 s of audio; the tiny model on one CPU thread takes about a second for it
SR = 24000
DEMUXER = {"flac": "flac", "mp3": "mp3", "opus": "ogg"}
# decoded length - PCM length allowed: MP3 streams carry no gapless tag, so the encoder delay
# (576 + 529 samples) and the padding of the last frame stay; Opus trims through its granule positions
PAD = {"pcm": (0, 0), "wav": (0, 0), "flac": (0, 0), "mp3": (0, 3 * 576), "opus": (0, 0)}
needs_ffmpeg = pytest.mark.skipif(shutil.which("ffmpeg") is None,
                                  reason="ffmpeg not on PATH: it decodes the streamed flac/mp3/opus (libsndfile "
                                         "cannot read FLAC of unknown length); apt install ffmpeg")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stream")
    cfg = base_config(tmp, runtime={"max_slots": 2, "max_queue": 4}, model={"max_frames": 2000},
                      jobs={"watch": False, "enabled": False})
    d = Daemon(tmp, cfg).start()
    yield d
    assert d.stop() == 0


def body(**kw) -> dict:
    return {"model": "tts-1", "input": "Streaming speech, piece by piece.", "voice": "ryan", "seed": 3,
            "max_frames": FRAMES, "stream": True, **kw}


def engine(d):
    return d.get("/health")[1]["engine"]


def timed_stream(d: Daemon, payload: dict, on_first=None):
    """POST and read the body piece by piece as it arrives: (response, [(seconds since sent, bytes)])."""
    c = d.conn()
    c.request("POST", "/v1/audio/speech", body=json.dumps(payload), headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    r = c.getresponse()
    pieces = []
    try:
        while True:
            data = r.read1(65536)
            if not data:
                break
            pieces.append((time.monotonic() - t0, data))
            if len(pieces) == 1 and on_first:
                on_first()
    finally:
        c.close()
    return r, pieces


def decode(data: bytes, fmt: str) -> np.ndarray:
    """int16 samples of a streamed answer."""
    if fmt == "pcm":
        return np.frombuffer(data, "<i2")
    if fmt == "wav":
        assert data[:4] == b"RIFF" and data[4:8] == b"\xff\xff\xff\xff" and data[40:44] == b"\xff\xff\xff\xff"
        return np.frombuffer(data[44:], "<i2")
    p = subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-f", DEMUXER[fmt], "-i", "pipe:0", "-f", "s16le",
                        "-ac", "1", "-ar", str(SR), "pipe:1"], input=data, capture_output=True, timeout=60)
    assert p.returncode == 0 and not p.stderr, p.stderr.decode(errors="replace")
    return np.frombuffer(p.stdout, "<i2")


@pytest.fixture(scope="module")
def reference(daemon):
    """The PCM of the request every format test makes (same seed: same audio)."""
    status, pcm, _ = daemon.post("/v1/audio/speech", body(response_format="pcm"))
    assert status == 200 and len(pcm) == 2 * 1920 * FRAMES
    return np.frombuffer(pcm, "<i2")


@pytest.mark.parametrize("fmt", ["pcm", "wav", pytest.param("flac", marks=needs_ffmpeg),
                                 pytest.param("mp3", marks=needs_ffmpeg), pytest.param("opus", marks=needs_ffmpeg)])
def test_format_streams_while_synthesizing_and_decodes(daemon, reference, fmt):
    """The first encoded bytes of a 2000-frame request (minutes of synthesis on the CPU) come while the engine
    still works on it; a short one decodes to the reference. (Not the short one's first bytes against its end:
    a loaded machine may read them only after the engine has finished it.)"""
    first_while_busy(daemon, fmt)
    r, pieces = timed_stream(daemon, body(response_format=fmt))
    assert r.status == 200 and r.getheader("Transfer-Encoding") == "chunked"
    assert len(pieces) >= 3, [(round(t, 3), len(b)) for t, b in pieces]
    assert pieces[0][0] < pieces[-1][0]
    audio = decode(b"".join(b for _, b in pieces), fmt)
    lo, hi = PAD[fmt]
    assert lo <= len(audio) - len(reference) <= hi, (len(audio), len(reference))
    if fmt in ("pcm", "wav", "flac"):  # lossless
        assert np.array_equal(audio[:len(reference)], reference)
    else:  # lossy: the same signal level
        rms = lambda a: float(np.sqrt(np.mean(a.astype(np.float64) ** 2)))  # noqa: E731
        assert 0.5 < rms(audio) / rms(reference) < 2.0


def until_idle(daemon) -> dict:
    """Wait until the engine holds no request (a failure guard of minutes); its figures."""
    deadline = time.monotonic() + 300
    while (e := engine(daemon))["active_slots"] or e["streams"]:
        assert time.monotonic() < deadline, e
        time.sleep(0.05)
    return e


def first_while_busy(daemon, fmt: str) -> None:
    """A 2000-frame request in `fmt`: its first bytes come while the engine holds it (its figures every 0.25 s,
    so the check waits for them); then the client leaves."""
    c = daemon.conn()
    long = body(response_format=fmt, input="A long text to read. " * 5, max_frames=2000)
    c.request("POST", "/v1/audio/speech", body=json.dumps(long), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    try:
        assert r.status == 200 and r.read1(65536)
        deadline = time.monotonic() + 60
        while engine(daemon)["active_slots"] != 1:
            assert time.monotonic() < deadline, "the first encoded bytes came after the engine had finished"
            time.sleep(0.05)
    finally:
        c.close()
        r.close()
    until_idle(daemon)


def test_first_bytes_of_a_coded_stream_come_with_the_first_chunk(daemon):
    """mp3 and opus put audio in the very first piece (Ogg pages are flushed every ~60 ms)."""
    for fmt, magic in (("mp3", b"\xff"), ("opus", b"OggS")):
        _, pieces = timed_stream(daemon, body(response_format=fmt))
        first = pieces[0][1]
        assert first.startswith(magic) and len(first) > 200, (fmt, len(first))


@pytest.mark.parametrize("fmt", ["mp3", "opus"])
def test_disconnect_mid_stream_frees_the_slot(daemon, fmt):
    c = daemon.conn()
    long = body(response_format=fmt, input="A long text to read. " * 5, max_frames=2000)
    c.request("POST", "/v1/audio/speech", body=json.dumps(long), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.read1(65536)
    assert engine(daemon)["active_slots"] == 1
    frames_before = engine(daemon)["frames"]
    c.close()  # the client goes away mid-stream
    r.close()
    e = until_idle(daemon)
    assert e["frames"] - frames_before < 400, "the request must be cancelled, not run to its 2000-frame end"
    status, data, _ = daemon.post("/v1/audio/speech", body(response_format=fmt, max_frames=4))
    assert status == 200 and len(data) > 0
    assert 'outcome="cancelled"' in daemon.get("/metrics")[1].decode()


def test_null_fields_mean_the_defaults(daemon):
    """No stream (as the OpenAI SDK sends): one complete mp3 with its length."""
    r, pieces = timed_stream(daemon, body(response_format=None, stream=None, stream_format=None, max_frames=4))
    assert r.status == 200 and r.getheader("Content-Type") == "audio/mpeg"
    assert r.getheader("Transfer-Encoding") is None
    assert int(r.getheader("Content-Length")) == sum(len(b) for _, b in pieces) > 0
