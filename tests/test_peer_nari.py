"""The Nari Qwen3-TTS server's WebSocket protocol (`nari.speech.v1`, GET /v1/audio/speech/ws) against the real
daemon, with the `websockets` client library, in the order tts-bench's WebSocket transport sends it: the
subprotocol, session.created with the audio format, request.start -> request.configured, one word per
input_text.append with its sequence and each input_text.ack awaited, input_text.end, response.started before
any binary PCM, response.done counting the binary frames, a 1000 close; response.cancel; errors. Also the
TCP guards (API key, cross-site refusal) on both peers' WebSockets. Written from tts-bench's public client
and our notes on the protocol, not from its code."""
from __future__ import annotations

import asyncio
import json

import pytest

from daemon_util import Daemon, base_config, free_port, needs_daemon

pytestmark = needs_daemon
AUDIO = {"encoding": "pcm_s16le", "sample_rate": 24000, "channels": 1}
START = {"type": "request.start", "model": "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice", "voice": "Ryan",
         "language": "English", "response_format": "pcm"}
KEY = "peer-key-1"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nari")
    cfg = base_config(tmp, model={"max_frames": 8}, jobs={"enabled": False, "watch": False},
                      wyoming={"enabled": False}, http={"tcp": True, "tcp_port": free_port(), "api_key": KEY})
    d = Daemon(tmp, cfg).start()
    yield d
    assert d.stop() == 0


def connect(daemon, **kw):
    from websockets.asyncio.client import unix_connect

    return unix_connect(daemon.socket, "ws://localhost/v1/audio/speech/ws", subprotocols=["nari.speech.v1"],
                        open_timeout=30, **kw)


async def recv_json(ws):
    m = await asyncio.wait_for(ws.recv(), 60)
    assert isinstance(m, str), f"expected a JSON event, got {len(m)} bytes of audio"
    return json.loads(m)


def words(text):
    """The text as one chunk per word, each with the whitespace after it (the whole text when joined)."""
    out = [w + " " for w in text.split(" ")]
    out[-1] = out[-1][:-1]
    return out


async def session(daemon, text, start=START, wait_audio_before_end=False):
    """One request as tts-bench's transport makes it; returns (events after request.configured: dicts, audio as
    bytes, the close code)."""
    import websockets

    events = []
    async with connect(daemon) as ws:
        assert ws.subprotocol == "nari.speech.v1"
        assert await recv_json(ws) == {"type": "session.created", "protocol": "nari.speech.v1", "audio": AUDIO}
        await ws.send(json.dumps(start))
        configured = await recv_json(ws)
        assert configured["type"] == "request.configured", configured
        chunks = words(text)
        for seq, chunk in enumerate(chunks):
            await ws.send(json.dumps({"type": "input_text.append", "sequence": seq, "text": chunk}))
            while True:  # audio may come before the ack
                m = await asyncio.wait_for(ws.recv(), 60)
                events.append(m if isinstance(m, bytes) else json.loads(m))
                if isinstance(m, str) and events[-1]["type"] == "input_text.ack":
                    assert events[-1] == {"type": "input_text.ack", "event": "input_text.append", "sequence": seq}
                    break
            await asyncio.sleep(0.01)  # tts-bench's 10 ms cadence
        while wait_audio_before_end and not any(isinstance(e, bytes) for e in events):
            m = await asyncio.wait_for(ws.recv(), 60)  # the words so far are spoken before the text ends
            events.append(m if isinstance(m, bytes) else json.loads(m))
        await ws.send(json.dumps({"type": "input_text.end", "sequence": len(chunks)}))
        try:
            async for m in ws:
                events.append(m if isinstance(m, bytes) else json.loads(m))
        except websockets.ConnectionClosed:
            pass
        return events, ws.close_code


def test_a_request_as_tts_bench_sends_it(daemon):
    events, code = asyncio.run(session(daemon, "Hello there and good morning. The second one is here.",
                                       wait_audio_before_end=True))
    kinds = [e["type"] if isinstance(e, dict) else "pcm" for e in events]
    assert code == 1000 and kinds[-1] == "response.done", kinds
    started, end_ack = kinds.index("response.started"), events.index(
        {"type": "input_text.ack", "event": "input_text.end", "sequence": 10})
    assert started < kinds.index("pcm") < end_ack  # audio before the text has ended, after response.started
    assert events[started]["audio"] == AUDIO and events[started]["request_id"]
    done = events[-1]
    pcm = [e for e in events if isinstance(e, bytes)]
    assert done["request_id"] == events[started]["request_id"] and done["stop_reason"] == "stop"
    assert done["audio_chunks"] == len(pcm) and len(b"".join(pcm)) % 2 == 0
    assert done["audio_seconds"] == pytest.approx(len(b"".join(pcm)) / 2 / 24000, abs=1e-3)


def test_request_start_takes_max_new_tokens(daemon):
    events, code = asyncio.run(session(daemon, "Hello there and good morning.",
                                       start={**START, "max_new_tokens": 2, "seed": 1}))
    assert code == 1000 and events[-1]["type"] == "response.done"
    # each request makes at most 2 frames (the words it did not take go on in the next one), so no chunk of
    # audio is longer; uncapped, the codec's doubling chunks reach 3 frames and more (model.max_frames 8)
    pcm = [e for e in events if isinstance(e, bytes)]
    assert pcm and max(map(len, pcm)) <= 2 * 3840, [len(p) for p in pcm]


def test_response_cancel_stops_at_once(daemon):
    async def run():
        async with connect(daemon) as ws:
            await recv_json(ws)
            await ws.send(json.dumps(START))
            await recv_json(ws)
            await ws.send(json.dumps({"type": "input_text.append", "sequence": 0, "text": "Hello there "}))
            assert (await recv_json(ws))["type"] == "input_text.ack"
            await ws.send(json.dumps({"type": "response.cancel"}))
            rest = [m async for m in ws]
            return rest, ws.close_code

    rest, code = asyncio.run(run())
    assert code == 1000 and not any(isinstance(m, str) and '"response.done"' in m for m in rest)


@pytest.mark.parametrize("messages,needle", [
    ([{"type": "input_text.append", "sequence": 0, "text": "Hi "}], "before request.start"),
    ([START, {"type": "input_text.append", "sequence": 1, "text": "Hi "},
      {"type": "input_text.append", "sequence": 1, "text": "there "}], "sequences must increase"),
    ([START, {"type": "input_text.append", "text": "Hi "}], "'sequence' is required"),
    ([{**START, "response_format": "mp3"}], "pcm only"),
    ([{**START, "voice": "nobody"}], "unknown voice 'nobody'"),
])
def test_errors_end_the_session(daemon, messages, needle):
    import websockets

    async def run():
        got = []
        async with connect(daemon) as ws:
            await recv_json(ws)
            for m in messages:
                await ws.send(json.dumps(m))
            try:
                async for m in ws:
                    got.append(json.loads(m))
            except websockets.ConnectionClosedError:  # (a close other than 1000)
                pass
            return got, ws.close_code

    got, code = asyncio.run(run())
    assert code == 1008 and got[-1]["type"] == "error" and needle in got[-1]["error"]["message"], got


@pytest.mark.parametrize("path,protocols", [("/v1/audio/speech/ws", ["nari.speech.v1"]),
                                            ("/v1/audio/speech/stream", None)])
def test_tcp_guards_hold_on_the_peer_websockets(daemon, path, protocols):
    """Over TCP with http.api_key: no key is 401, a browser's cross-site request 403, the key opens it."""
    from websockets.asyncio.client import connect as tcp_connect
    from websockets.exceptions import InvalidStatus

    url = f"ws://127.0.0.1:{daemon.cfg['http']['tcp_port']}{path}"

    async def status(**headers):
        try:
            async with tcp_connect(url, subprotocols=protocols, additional_headers=headers, open_timeout=30):
                return 101
        except InvalidStatus as exc:
            return exc.response.status_code

    assert asyncio.run(status()) == 401
    assert asyncio.run(status(Authorization=f"Bearer {KEY}", Origin="http://evil.example")) == 403
    assert asyncio.run(status(Authorization=f"Bearer {KEY}")) == 101
