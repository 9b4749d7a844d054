"""GET /v1/audio/speech/live over the daemon's real Unix socket: text arriving in pieces is spoken
sentence by sentence (first audio before the text ends), and bad input ends one session with an error
event while others go on."""
from __future__ import annotations

import asyncio
import json

import pytest

from daemon_util import Daemon, base_config, needs_daemon

pytestmark = needs_daemon
LIMIT = 300


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("live")
    cfg = base_config(tmp, model={"max_frames": 4}, jobs={"watch": False},
                      http={"max_text_chars": LIMIT, "read_timeout_s": 1.5})
    d = Daemon(tmp, cfg).start()
    yield d
    assert d.stop() == 0


async def session(daemon, steps, timeout=60.0):
    """Run `steps(ws, events)` against the live route; returns the list of events (dicts, and bytes for
    audio) the server sent until it closed."""
    import aiohttp

    events: list = []
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=daemon.socket)) as http:
        async with http.ws_connect("http://localhost/v1/audio/speech/live") as ws:

            async def collect():
                async for msg in ws:
                    if msg.type == aiohttp.WSMsgType.BINARY:
                        events.append(msg.data)
                    elif msg.type == aiohttp.WSMsgType.TEXT:
                        events.append(json.loads(msg.data))

            reader = asyncio.create_task(collect())
            await steps(ws, events)
            await asyncio.wait_for(reader, timeout)
    return events


async def wait_for(events, pred, timeout=60.0):
    for _ in range(int(timeout / 0.05)):
        if any(pred(e) for e in events):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"nothing matched in {timeout} s: {events}")


def test_text_in_pieces_is_spoken_sentence_by_sentence(daemon):
    first_audio_before_end = []

    async def steps(ws, events):
        await ws.send_json({"type": "session.update", "voice": "ryan", "language": "english", "seed": 1})
        await ws.send_json({"type": "input_text.append", "text": "Hello there. The sec"})
        await wait_for(events, lambda e: isinstance(e, bytes))  # the first sentence is complete: spoken now
        first_audio_before_end.append(True)
        await asyncio.sleep(0.3)
        await ws.send_json({"type": "input_text.append", "text": "ond one is here. And"})
        await asyncio.sleep(0.3)
        await ws.send_json({"type": "input_text.append", "text": " the end"})
        await ws.send_json({"type": "input_text.end"})

    events = asyncio.run(session(daemon, steps))
    assert first_audio_before_end
    kinds = [e["type"] if isinstance(e, dict) else "pcm" for e in events]
    assert kinds[0] == "audio.start" and kinds[1] == "pcm" and kinds[-1] == "done", kinds
    assert events[0] == {"type": "audio.start", "sample_rate": 24000, "format": "pcm_s16le"}
    done = [e["text"] for e in events if isinstance(e, dict) and e["type"] == "sentence.done"]
    assert done == ["Hello there.", "The second one is here.", "And the end"]
    # every sentence has audio before its sentence.done
    for i, k in enumerate(kinds):
        if k == "sentence.done":
            assert kinds[i - 1] == "pcm", kinds
    pcm = b"".join(e for e in events if isinstance(e, bytes))
    assert len(pcm) % 2 == 0 and len(pcm) > 0
    assert events[-1]["audio_seconds"] == pytest.approx(len(pcm) / 2 / 24000, abs=1e-3)


def run_bad(daemon, messages):
    async def steps(ws, events):
        for m in messages:
            await (ws.send_str(m) if isinstance(m, str) else ws.send_json(m))

    events = asyncio.run(session(daemon, steps, timeout=20.0))
    assert events and events[-1]["type"] == "error", events
    return events[-1]["message"]


def test_unknown_voice_is_an_error_event(daemon):
    assert "unknown voice 'bob'" in run_bad(daemon, [{"type": "session.update", "voice": "bob"}])


def test_flood_is_an_error_event(daemon):
    msg = run_bad(daemon, [{"type": "input_text.append", "text": "word " * 40},
                           {"type": "input_text.append", "text": "word " * 40}])
    assert f"the limit is {LIMIT}" in msg


@pytest.mark.parametrize("message,needle", [("{nope", "not valid JSON"),
                                            (json.dumps({"type": "speak"}), "unknown message type 'speak'")])
def test_bad_messages_are_error_events(daemon, message, needle):
    assert needle in run_bad(daemon, [message])


def test_silent_client_is_dropped_and_others_go_on(daemon):
    async def silent(ws, events):
        await wait_for(events, lambda e: e.get("type") == "error", timeout=10.0)

    async def both():
        async def talker(ws, events):
            await ws.send_json({"type": "input_text.append", "text": "Still here."})
            await ws.send_json({"type": "input_text.end"})

        return await asyncio.gather(session(daemon, silent), session(daemon, talker))

    quiet, ok = asyncio.run(both())
    assert quiet[-1]["type"] == "error" and "no message for 1.5 s" in quiet[-1]["message"]
    assert ok[-1]["type"] == "done" and any(isinstance(e, bytes) for e in ok)
