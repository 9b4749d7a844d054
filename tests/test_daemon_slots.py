"""Admission control and slots: a full engine answers 503 with Retry-After; a streaming client that
disconnects mid-stream cancels its request and frees its slot at once."""
from __future__ import annotations

import json
import socket
import time

import pytest

from daemon_util import Daemon, base_config, endless_model, needs_daemon

pytestmark = needs_daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("slots")
    cfg = base_config(tmp, runtime={"max_slots": 1, "max_queue": 1, "retry_after_s": 3},
                      model={"path": endless_model(tmp), "max_frames": 2000}, jobs={"watch": False, "enabled": False})
    d = Daemon(tmp, cfg).start()
    yield d
    assert d.stop() == 0


def open_stream(d: Daemon, max_frames: int = 2000) -> socket.socket:
    """Start a long pcm stream on a raw socket and return it once audio arrived."""
    body = json.dumps({"input": "A long text to read. " * 5, "voice": "ryan", "response_format": "pcm",
                       "stream": True, "max_frames": max_frames}).encode()
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(300)  # (a failure guard)
    s.connect(d.socket)
    s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return s


def read_some(s: socket.socket, n: int = 4000) -> bytes:
    got = b""
    while len(got) < n:
        chunk = s.recv(65536)
        assert chunk, "stream ended early"
        got += chunk
    return got


def engine(d):
    return d.get("/health")[1]["engine"]


def wait_for(pred, timeout=300.0):  # (a failure guard)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_disconnect_frees_slot_and_busy_gets_503(daemon):
    a = open_stream(daemon)
    head = read_some(a)
    assert head.startswith(b"HTTP/1.1 200")
    assert wait_for(lambda: engine(daemon)["active_slots"] == 1)  # the engine's figures come every 0.25 s
    b = open_stream(daemon)  # waits in the admission queue (max_queue 1)
    assert wait_for(lambda: engine(daemon)["queued"] == 1)
    status, err, headers = daemon.post("/v1/audio/speech", {"input": "Hi.", "voice": "ryan", "max_frames": 4})
    assert status == 503 and headers["Retry-After"] == "3" and err["error"]["type"] == "busy"
    frames_before = engine(daemon)["frames"]
    a.close()  # client goes away mid-stream
    # b gets the slot once a's request is cancelled (not run to its 2000-frame end: the frames say which)
    b.settimeout(300)
    assert read_some(b).startswith(b"HTTP/1.1 200")
    assert engine(daemon)["frames"] - frames_before < 400
    b.close()
    assert wait_for(lambda: engine(daemon)["active_slots"] == 0 and engine(daemon)["streams"] == 0)
    metrics = daemon.get("/metrics")[1].decode()
    assert 'tts_requests_total{api="speech",outcome="busy"} 1' in metrics
    assert 'outcome="cancelled"' in metrics


def test_slot_is_free_again_after_disconnect(daemon):
    s = open_stream(daemon)
    read_some(s)
    s.close()
    assert wait_for(lambda: engine(daemon)["active_slots"] == 0)
    status, body, _ = daemon.post("/v1/audio/speech", {"input": "Hi.", "voice": "ryan", "max_frames": 4,
                                                        "response_format": "pcm"})
    assert status == 200 and len(body) > 0
