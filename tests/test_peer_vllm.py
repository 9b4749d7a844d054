"""vllm-omni's documented Qwen3-TTS requests replayed unmodified against the real daemon (a CustomVoice
checkpoint, over its Unix socket): the bodies of its docs and example clients for POST /v1/audio/speech
(their fields meaning what they mean there), GET /v1/audio/voices as its clients read it, and its WebSocket
/v1/audio/speech/stream (session.config, input.text, input.done, session.close). Written from vllm-omni's
documentation, not from its code."""
from __future__ import annotations

import asyncio
import io
import json

import pytest
import soundfile as sf

from daemon_util import Daemon, base_config, needs_daemon

pytestmark = needs_daemon
CAP = 12  # model.max_frames: what a request gets when it names no cap
FRAME_BYTES = 1920 * 2  # one 80 ms frame of 16-bit PCM at 24 kHz


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm")
    cfg = base_config(tmp, model={"max_frames": CAP}, jobs={"enabled": False, "watch": False},
                      wyoming={"enabled": False}, http={"response_format": "wav"})
    d = Daemon(tmp, cfg).start()
    yield d
    assert d.stop() == 0


def speak(daemon, body):
    status, data, headers = daemon.post("/v1/audio/speech", body)
    assert status == 200, data
    return data, headers


def test_the_quick_start_body_saved_as_wav(daemon):
    """The docs' curl body (no response_format; their examples save it as output.wav): with http.response_format
    wav the daemon answers WAV; a capitalised voice and the language by its English name are understood."""
    data, headers = speak(daemon, {"input": "Hello, how are you?", "voice": "Vivian", "language": "English"})
    assert headers["Content-Type"] == "audio/wav" and data[:4] == b"RIFF"
    audio, sr = sf.read(io.BytesIO(data))
    assert sr == 24000 and 0 < len(audio) <= CAP * 1920 and len(audio) % 1920 == 0


def test_the_documented_request_body(daemon):
    """The README's request body with every Qwen3-TTS field it lists (but instructions: a 0.6B checkpoint
    takes none); max_new_tokens caps the audio frames."""
    body = {"input": "Text to synthesize", "voice": "vivian", "response_format": "wav", "task_type": "CustomVoice",
            "language": "Auto", "x_vector_only_mode": False, "max_new_tokens": 5, "seed": 3}
    audio, _ = sf.read(io.BytesIO(speak(daemon, body)[0]))
    assert len(audio) == 5 * 1920


def test_max_new_tokens_caps_frames(daemon):
    body = {"input": "Hello there, this is a longer sentence.", "voice": "ryan", "response_format": "pcm", "seed": 1}
    assert len(speak(daemon, body)[0]) > 4 * FRAME_BYTES  # uncapped: until the end of speech or model.max_frames
    assert len(speak(daemon, {**body, "max_new_tokens": 3})[0]) == 3 * FRAME_BYTES
    assert len(speak(daemon, {**body, "max_new_tokens": 4, "max_frames": 2})[0]) == 2 * FRAME_BYTES  # the smaller
    status, err, _ = daemon.post("/v1/audio/speech", {**body, "max_new_tokens": 0})
    assert status == 400 and "max_new_tokens" in err["error"]["message"]


@pytest.mark.parametrize("extra", [
    {"stream": True},  # the README's streaming body
    {"stream": True, "non_streaming_mode": False, "stream_format": "audio"},  # tts-bench's vllm-omni contract
    {"stream": True, "non_streaming_mode": False, "initial_codec_chunk_frames": 1},  # Nari's, and a TTFA knob
])
def test_streamed_pcm_bodies(daemon, extra):
    body = {"input": "Hello, how are you?", "voice": "vivian", "language": "English", "response_format": "pcm",
            **extra}
    c = daemon.conn()
    c.request("POST", "/v1/audio/speech", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    assert r.status == 200 and r.getheader("Transfer-Encoding") == "chunked", data[:300]
    assert r.getheader("Content-Type") == "audio/pcm" and 0 < len(data) <= CAP * FRAME_BYTES


def test_sse_stream(daemon):
    body = {"input": "Hi there.", "voice": "vivian", "response_format": "pcm", "stream_format": "sse"}
    data, headers = speak(daemon, body)
    events = [json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: ")]
    assert headers["Content-Type"].startswith("text/event-stream")
    assert events[-1]["type"] == "speech.audio.done" and events[0]["type"] == "speech.audio.delta"


@pytest.mark.parametrize("speed", [0.25, 4.0])
def test_speed_over_their_range(daemon, speed):
    body = {"input": "Hello there.", "voice": "vivian", "response_format": "wav", "seed": 2}
    normal, _ = sf.read(io.BytesIO(speak(daemon, body)[0]))
    audio, _ = sf.read(io.BytesIO(speak(daemon, {**body, "speed": speed})[0]))
    assert len(normal) > 0 and len(audio) == pytest.approx(len(normal) / speed, rel=0.03)


@pytest.mark.parametrize("body,status,needle", [
    ({"task_type": "Base"}, 400, "this is a CustomVoice checkpoint"),
    ({"task_type": "Cloning"}, 400, "choose one of CustomVoice, VoiceDesign, Base"),
    ({"sample_rate": 16000}, 400, "24000 Hz only"),
    ({"ref_audio": "https://example.com/reference.wav"}, 400,
     "the appliance is offline: send the audio as base64 or a data URL, or put the file in the voices folder"),
    ({"ref_audio": "/etc/hostname"}, 403, "outside the voices folder"),
])
def test_refusals_say_why(daemon, body, status, needle):
    got, err, _ = daemon.post("/v1/audio/speech", {"input": "Hi.", "voice": "vivian", **body})
    assert got == status and needle in err["error"]["message"], err


def test_task_type_of_the_checkpoint_and_speaker_alias(daemon):
    body = {"input": "Hi.", "speaker": "Ryan", "task_type": "CustomVoice", "sample_rate": 24000,
            "response_format": "pcm", "seed": 5}
    assert speak(daemon, body)[0] == speak(daemon, {**body, "speaker": None, "voice": "ryan"})[0]


def test_voices_as_their_clients_read_them(daemon):
    status, listed, _ = daemon.get("/v1/audio/voices")
    assert status == 200 and "vivian" in listed["voices"] and listed["uploaded_voices"] == []
    assert {v["id"] for v in listed["data"]} == set(listed["voices"])  # the OpenAI-style list stays


# -- the WebSocket ---------------------------------------------------------------------------------
async def exchange(daemon, messages, until="session.done", count=1):
    """Send `messages` over /v1/audio/speech/stream, then read events (dicts; audio as bytes) until `count`
    events of type `until`; returns them."""
    from websockets.asyncio.client import unix_connect

    events = []
    async with unix_connect(daemon.socket, "ws://localhost/v1/audio/speech/stream", open_timeout=30) as ws:
        for m in messages:
            await ws.send(json.dumps(m))
        while sum(1 for e in events if isinstance(e, dict) and e["type"] == until) < count:
            m = await asyncio.wait_for(ws.recv(), 60)
            events.append(m if isinstance(m, bytes) else json.loads(m))
    return events


def test_stream_one_file_per_flush(daemon):
    """Their client's defaults: session.config (voice Vivian, CustomVoice, Auto, wav), the text at once,
    input.done: audio.start, one binary frame holding a WAV file, audio.done, session.done."""
    config = {"type": "session.config", "voice": "Vivian", "task_type": "CustomVoice", "language": "Auto",
              "response_format": "wav", "speed": 1.0}
    text = "Hello world. How are you? I am fine."
    events = asyncio.run(exchange(daemon, [config, {"type": "input.text", "text": text}, {"type": "input.done"}]))
    assert [e["type"] if isinstance(e, dict) else "audio" for e in events] == [
        "audio.start", "audio", "audio.done", "session.done"]
    start, audio, done, end = events
    assert start["sentence_text"] == text and start["format"] == "wav" and start["sentence_index"] == 0
    assert audio[:4] == b"RIFF" and 0 < sf.read(io.BytesIO(audio))[0].size <= CAP * 1920
    assert done == {"type": "audio.done", "utterance_index": 0, "sentence_index": 0, "total_bytes": len(audio),
                    "error": False}
    assert end == {"type": "session.done", "utterance_index": 0, "total_sentences": 1}


def test_stream_sentences_as_they_complete_and_a_second_utterance(daemon):
    """split_granularity sentence with stream_audio (pcm chunks), text word by word as from a speech
    recogniser; then a new session.config on the same connection and a second flush; session.close ends it."""
    from websockets.asyncio.client import unix_connect

    async def run():
        out = []
        async with unix_connect(daemon.socket, "ws://localhost/v1/audio/speech/stream") as ws:
            await ws.send(json.dumps({"type": "session.config", "voice": "vivian", "response_format": "pcm",
                                      "stream_audio": True, "split_granularity": "sentence", "max_new_tokens": 4,
                                      "seed": 1}))
            for word in "Hello world. How are you? I am fine.".split(" "):
                await ws.send(json.dumps({"type": "input.text", "text": word + " "}))
            first = json.loads(await asyncio.wait_for(ws.recv(), 60))  # before input.done: a sentence is complete
            out.append(first)
            await ws.send(json.dumps({"type": "input.done"}))
            await ws.send(json.dumps({"type": "session.config", "voice": "ryan", "response_format": "pcm",
                                      "max_new_tokens": 2, "seed": 1}))
            await ws.send(json.dumps({"type": "input.text", "text": "Again."}))
            await ws.send(json.dumps({"type": "input.done"}))
            await ws.send(json.dumps({"type": "session.close"}))
            async for m in ws:  # until the server's close
                out.append(m if isinstance(m, bytes) else json.loads(m))
            out.append(ws.close_code)
        return out

    events = asyncio.run(run())
    assert events[0]["type"] == "audio.start" and events[0]["sentence_text"] == "Hello world."
    assert events[-1] == 1000
    done = [e for e in events if isinstance(e, dict) and e["type"] == "session.done"]
    assert done == [{"type": "session.done", "utterance_index": 0, "total_sentences": 3},
                    {"type": "session.done", "utterance_index": 1, "total_sentences": 1}]
    starts = [e for e in events if isinstance(e, dict) and e["type"] == "audio.start"]
    assert [s["sentence_text"] for s in starts] == ["Hello world.", "How are you?", "I am fine.", "Again."]
    sizes = [e["total_bytes"] for e in events if isinstance(e, dict) and e["type"] == "audio.done"]
    assert sizes == [4 * FRAME_BYTES] * 3 + [2 * FRAME_BYTES]  # max_new_tokens per request, from each config
    assert sum(sizes) == len(b"".join(e for e in events if isinstance(e, bytes)))


def test_stream_errors(daemon):
    """A bad message after the config is reported and the session goes on; anything but session.config
    first ends the session with 1008."""
    config = {"type": "session.config", "voice": "vivian", "response_format": "pcm", "stream_audio": True,
              "max_new_tokens": 2}
    events = asyncio.run(exchange(daemon, [config, {"type": "speak"}, {"type": "input.text", "text": "Hi."},
                                           {"type": "input.done"}]))
    assert events[0]["type"] == "error" and "unknown message type 'speak'" in events[0]["message"]
    assert events[-1]["type"] == "session.done"

    from websockets.asyncio.client import unix_connect

    async def first(message):
        async with unix_connect(daemon.socket, "ws://localhost/v1/audio/speech/stream") as ws:
            await ws.send(json.dumps(message))
            event = json.loads(await asyncio.wait_for(ws.recv(), 60))
            await asyncio.wait_for(ws.wait_closed(), 60)
            return event, ws.close_code

    event, code = asyncio.run(first({"type": "input.text", "text": "Hi."}))
    assert code == 1008 and "must be session.config" in event["message"]
    event, code = asyncio.run(first({**config, "response_format": "wav"}))
    assert code == 1008 and "set response_format to pcm" in event["message"]


@pytest.mark.parametrize("configured", [True, False])
def test_pings_do_not_keep_an_idle_session(daemon, configured):
    """The `websockets` client's keepalive pings (every 20 s by default; 0.2 s here, more often than the daemon's
    http.read_timeout_s of 2 s) are answered but are not messages: a session that sends nothing more is closed
    with an error event and 1008. (aiohttp's automatic pong used to restart the receive timer at each ping.)"""
    from ws_util import only_pings_after

    first = [{"type": "session.config", "voice": "vivian"}] if configured else []
    events, code, _, latency = asyncio.run(only_pings_after(daemon.socket, "/v1/audio/speech/stream", first))
    assert latency > 0, "the client's pings were never answered"
    what = "message" if configured else "session.config"
    assert events == [{"type": "error", "message": f"no {what} for 2 s; the session is closed"}], events
    assert code == 1008


def test_their_multipart_voice_upload_is_pointed_to_post_v1_voices(daemon, tmp_path):
    """vllm-omni's clients upload a voice as multipart form data to POST /v1/audio/voices (audio_sample, consent,
    name, ref_text); here voices are added by POST /v1/voices: a one-line JSON error (400, as their server
    answers a bad upload) names it, not a bare 405. Sent by aiohttp's client, nothing saved."""
    import aiohttp

    async def upload():
        form = aiohttp.FormData()
        form.add_field("audio_sample", b"RIFF" + bytes(4000), filename="ref.wav", content_type="audio/wav")
        for key, value in (("consent", "consent-1"), ("name", "alice"), ("ref_text", "Hello there.")):
            form.add_field(key, value)
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=daemon.socket)) as s:
            async with s.post("http://localhost/v1/audio/voices", data=form) as r:
                return r.status, r.headers["Content-Type"], await r.json()

    status, ctype, body = asyncio.run(upload())
    assert status == 400 and ctype.startswith("application/json"), (status, ctype, body)
    message = body["error"]["message"]
    assert "POST /v1/voices" in message and '"ref_audio"' in message and "\n" not in message, message
    assert body["error"]["code"] == 400 and "alice" not in daemon.get("/v1/audio/voices")[1]["voices"]
