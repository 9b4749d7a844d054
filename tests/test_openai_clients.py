"""The `openai` Python SDK against the real daemon, as people use it: over TCP with an API key
(http.api_key) and over the Unix socket (an httpx transport with `uds=`, no key). Its defaults send no
`stream`: the answer is one complete file whose length readers trust; models, voices, SSE and aac."""
from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
import urllib.error
import urllib.request

import numpy as np
import pytest
import soundfile as sf

from daemon_util import Daemon, base_config, needs_daemon

pytestmark = needs_daemon
KEY = "test-key-123"
FRAMES = 6
SAMPLES = FRAMES * 1920
EXTRA = {"max_frames": FRAMES, "seed": 1}  # extensions of this API, through the SDK's extra_body


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("openai")
    cfg = base_config(tmp, jobs={"enabled": False, "watch": False},
                      http={"tcp": True, "tcp_port": 0, "api_key": KEY}, wyoming={"enabled": False})
    d = Daemon(tmp, cfg).start()
    d.tcp_url = json.loads((d.home / "daemon.json").read_text())["tcp"]
    yield d
    assert d.stop() == 0


def tcp_client(daemon, key=KEY):
    import openai

    return openai.OpenAI(api_key=key, base_url=daemon.tcp_url + "/v1", max_retries=0)


def unix_client(daemon):
    import httpx2
    import openai

    http = httpx2.Client(transport=httpx2.HTTPTransport(uds=daemon.socket))
    return openai.OpenAI(api_key="not-needed-on-the-socket", base_url="http://localhost/v1", http_client=http,
                         max_retries=0)


@pytest.mark.parametrize("fmt", ["mp3", "flac", "wav"])
def test_sdk_defaults_get_a_whole_file_with_its_length(daemon, fmt):
    """`speech.create` sends no `stream`: one file with Content-Length that soundfile reads in full (a
    streamed mp3 read as half its length, a streamed flac was refused)."""
    raw = tcp_client(daemon).audio.speech.with_raw_response.create(
        model="tts-1", voice="ryan", input="Hello there.", response_format=fmt, extra_body=EXTRA)
    body = raw.content
    assert raw.headers["content-length"] == str(len(body)) and "transfer-encoding" not in raw.headers
    audio, sr = sf.read(io.BytesIO(body))
    assert sr == 24000
    assert len(audio) == SAMPLES if fmt != "mp3" else abs(len(audio) - SAMPLES) < 1152, len(audio)


def test_sdk_over_the_unix_socket_needs_no_key(daemon):
    client = unix_client(daemon)
    pcm = client.audio.speech.create(model="tts-1", voice={"id": "ryan"}, input="Hello there.", response_format="pcm",
                                     extra_body={**EXTRA, "language": "en-US"}).content
    assert len(pcm) == 2 * SAMPLES
    assert {m.id for m in client.models.list()} >= {"cv_small", "tts-1"}


def test_tcp_needs_the_key(daemon):
    import openai

    with pytest.raises(openai.AuthenticationError) as err:
        tcp_client(daemon, "wrong").models.list()
    assert err.value.status_code == 401 and "http.api_key" in err.value.message
    with pytest.raises(urllib.error.HTTPError) as err:  # every route over TCP, not only the OpenAI ones
        urllib.request.urlopen(daemon.tcp_url + "/health", timeout=30)
    assert err.value.code == 401 and err.value.headers["WWW-Authenticate"].startswith("Bearer")
    req = urllib.request.Request(daemon.tcp_url + "/health", headers={"Authorization": f"Bearer {KEY}"})
    assert json.loads(urllib.request.urlopen(req, timeout=30).read())["status"] == "ok"


def test_models_and_voices(daemon):
    client = tcp_client(daemon)
    ids = [m.id for m in client.models.list()]
    assert ids[0] == "cv_small" and "tts-1" in ids and "gpt-4o-mini-tts" in ids
    assert client.models.retrieve("tts-1").object == "model"
    voices = client.get("/audio/voices", cast_to=object)
    assert voices["object"] == "list" and {v["id"] for v in voices["data"]} >= {"ryan", "vivian"}
    assert all(v["object"] == "audio.voice" and v["type"] == "builtin" for v in voices["data"])
    assert "english" in voices["languages"]


def test_sse_deltas_add_up_to_the_audio(daemon):
    """stream_format "sse": speech.audio.delta events with base64 audio, then speech.audio.done."""
    client = tcp_client(daemon)
    whole = client.audio.speech.create(model="tts-1", voice="ryan", input="Hello there.", response_format="pcm",
                                       extra_body=EXTRA).content
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="ryan", input="Hello there.", response_format="pcm", stream_format="sse",
            extra_body=EXTRA) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in resp.iter_lines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "speech.audio.done" and set(kinds[:-1]) == {"speech.audio.delta"}, kinds
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == whole  # same seed: same audio
    assert events[-1]["usage"]["output_tokens"] == FRAMES


def test_aac(daemon):
    """aac (ADTS) through ffmpeg; without ffmpeg the request says to install it."""
    import openai

    client = tcp_client(daemon)
    if shutil.which("ffmpeg") is None:
        with pytest.raises(openai.BadRequestError, match="ffmpeg"):
            client.audio.speech.create(model="tts-1", voice="ryan", input="Hi.", response_format="aac")
        return
    for extra in (EXTRA, {**EXTRA, "stream": True}):
        raw = client.audio.speech.with_raw_response.create(model="tts-1", voice="ryan", input="Hello there.",
                                                           response_format="aac", extra_body=extra)
        body = raw.content
        assert raw.headers["content-type"] == "audio/aac" and body[:2] == b"\xff\xf1"  # ADTS sync, MPEG-4
        out = subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-f", "aac", "-i", "pipe:0", "-f", "s16le",
                              "-ac", "1", "-ar", "24000", "pipe:1"], input=body, capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr
        decoded = np.frombuffer(out.stdout, "<i2")
        assert 0 <= len(decoded) - SAMPLES <= 2048 + 1024, len(decoded)  # AAC priming and the last frame's padding
