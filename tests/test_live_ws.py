"""GET /v1/audio/speech/live over the daemon's real Unix socket: text arriving in pieces is spoken as its
words come (the model's streaming-text mode) or sentence by sentence (first audio before the text ends),
and bad input ends one session with an error event while others go on.

Two daemons: one whose idle limit (http.read_timeout_s) no session of a loaded machine reaches while it waits for
audio between its messages, and an impatient one for the sessions that must be dropped."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

from daemon_util import Daemon, base_config, needs_daemon

pytestmark = needs_daemon
LIMIT = 300


IDLE_S = 3.0  # the impatient daemon's http.read_timeout_s


def _daemon(tmp_path_factory, read_timeout_s: float):
    tmp = tmp_path_factory.mktemp("live")
    cfg = base_config(tmp, model={"max_frames": 4}, jobs={"watch": False},
                      http={"max_text_chars": LIMIT, "read_timeout_s": read_timeout_s})
    return Daemon(tmp, cfg).start()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = _daemon(tmp_path_factory, 300.0)  # (a failure guard: a session here never idles on purpose)
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def impatient(tmp_path_factory):
    d = _daemon(tmp_path_factory, IDLE_S)
    yield d
    assert d.stop() == 0


async def session(daemon, steps, timeout=300.0, closed=None):
    """Run `steps(ws, events)` against the live route; returns the list of events (dicts, and bytes for
    audio) the server sent until it closed (`closed`, a dict: gets the close `code` and `reason`)."""
    import aiohttp

    events: list = []
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=daemon.socket)) as http:
        async with http.ws_connect("http://localhost/v1/audio/speech/live") as ws:

            async def collect():
                while True:
                    msg = await ws.receive()
                    if msg.type == aiohttp.WSMsgType.BINARY:
                        events.append(msg.data)
                    elif msg.type == aiohttp.WSMsgType.TEXT:
                        events.append(json.loads(msg.data))
                    else:  # the server's close frame (then CLOSED), or the connection's end
                        if msg.type == aiohttp.WSMsgType.CLOSE and closed is not None:
                            closed.update(code=msg.data, reason=msg.extra)
                        return

            reader = asyncio.create_task(collect())
            await steps(ws, events)
            await asyncio.wait_for(reader, timeout)
    return events


async def wait_for(events, pred, timeout=300.0):  # (a failure guard)
    for _ in range(int(timeout / 0.05)):
        if any(pred(e) for e in events):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"nothing matched in {timeout} s: {events}")


def kinds_of(events):
    return [e["type"] if isinstance(e, dict) else "pcm" for e in events]


def pcm_of(events):
    pcm = b"".join(e for e in events if isinstance(e, bytes))
    assert len(pcm) % 2 == 0 and len(pcm) > 0
    assert events[-1]["audio_seconds"] == pytest.approx(len(pcm) / 2 / 24000, abs=1e-3)
    return pcm


def test_words_are_spoken_before_the_sentence_ends(daemon):
    """Words mode (the default): audio comes after the first complete word, long before any sentence ends."""
    first_audio_before_end = []

    async def steps(ws, events):
        await ws.send_json({"type": "session.update", "voice": "ryan", "language": "english", "seed": 1})
        await ws.send_json({"type": "input_text.append", "text": "Hello there and"})
        await wait_for(events, lambda e: isinstance(e, bytes))  # "Hello there" is complete: spoken now
        first_audio_before_end.append(True)
        await asyncio.sleep(0.3)
        await ws.send_json({"type": "input_text.append", "text": " good morning. The sec"})
        await asyncio.sleep(0.3)
        await ws.send_json({"type": "input_text.append", "text": "ond one"})
        await ws.send_json({"type": "input_text.end"})

    events = asyncio.run(session(daemon, steps))
    assert first_audio_before_end
    kinds = kinds_of(events)
    assert kinds[0] == "audio.start" and kinds[1] == "pcm" and kinds[-2:] == ["text.done", "done"], kinds
    # model.max_frames (4) ends each request early: the words it did not take are spoken next, none lost
    spoken = [e["text"] for e in events if isinstance(e, dict) and e["type"] == "text.done"]
    assert " ".join(spoken).split() == "Hello there and good morning. The second one".split()
    pcm_of(events)


def test_text_in_pieces_is_spoken_sentence_by_sentence(daemon):
    first_audio_before_end = []

    async def steps(ws, events):
        await ws.send_json({"type": "session.update", "voice": "ryan", "language": "english", "seed": 1,
                            "text_mode": "sentences"})
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
    kinds = kinds_of(events)
    assert kinds[0] == "audio.start" and kinds[1] == "pcm" and kinds[-1] == "done", kinds
    assert events[0] == {"type": "audio.start", "sample_rate": 24000, "format": "pcm_s16le"}
    done = [e["text"] for e in events if isinstance(e, dict) and e["type"] == "text.done"]
    assert done == ["Hello there.", "The second one is here.", "And the end"]
    # every sentence has audio before its text.done
    for i, k in enumerate(kinds):
        if k == "text.done":
            assert kinds[i - 1] == "pcm", kinds
    pcm_of(events)


def test_a_language_tag_is_the_model_language(daemon):
    async def steps(ws, events):
        await ws.send_json({"type": "session.update", "voice": "ryan", "language": "de-DE"})
        await ws.send_json({"type": "input_text.append", "text": "Guten Tag."})
        await ws.send_json({"type": "input_text.end"})

    events = asyncio.run(session(daemon, steps))
    assert kinds_of(events)[-1] == "done", events[-1]
    pcm_of(events)


def test_the_session_lexicon_replaces_whole_words(daemon):
    """session.update's lexicon: a word split over appends is replaced whole; the same seed speaks the replaced
    text (sentences mode: one request per sentence, so the audio compares)."""
    async def speak(pieces, **update):
        async def steps(ws, events):
            await ws.send_json({"type": "session.update", "voice": "ryan", "seed": 1, **update})
            for piece in pieces:
                await ws.send_json({"type": "input_text.append", "text": piece})
            await ws.send_json({"type": "input_text.end"})
        return await session(daemon, steps)

    lex = {"lexicon": {"Alpha": "Bravo"}}
    words = asyncio.run(speak(["Alp", "ha the", "re"], **lex))
    spoken = [e["text"] for e in words if isinstance(e, dict) and e["type"] == "text.done"]
    assert " ".join(spoken).split() == ["Bravo", "there"], spoken
    sentences = {"text_mode": "sentences"}
    replaced = pcm_of(asyncio.run(speak(["Alpha there."], **sentences, **lex)))
    assert replaced == pcm_of(asyncio.run(speak(["Bravo there."], **sentences)))
    assert replaced != pcm_of(asyncio.run(speak(["Alpha there."], **sentences)))


def test_speed_shortens_the_audio(daemon):
    async def speak(speed):
        async def steps(ws, events):
            await ws.send_json({"type": "session.update", "voice": "ryan", "seed": 1, "speed": speed})
            await ws.send_json({"type": "input_text.append", "text": "Hello there, quick words."})
            await ws.send_json({"type": "input_text.end"})
        return await session(daemon, steps)

    normal, fast = (len(pcm_of(asyncio.run(speak(x)))) for x in (1.0, 2.0))
    assert normal == 4 * 1920 * 2  # model.max_frames = 4 frames of 1920 samples
    assert fast == pytest.approx(normal / 2, rel=0.15)


def run_bad(daemon, messages, close_code=1008):
    """Send `messages`: the session must end with an error event, then a close with `close_code` and the
    error's message as its reason; returns the message."""
    async def steps(ws, events):
        for m in messages:
            await (ws.send_str(m) if isinstance(m, str) else ws.send_json(m))

    closed = {}
    events = asyncio.run(session(daemon, steps, closed=closed))
    assert events and events[-1]["type"] == "error", events
    assert closed["code"] == close_code and closed["reason"] == events[-1]["message"][:123], closed
    return events[-1]["message"]


def test_unknown_voice_is_an_error_event(daemon):
    assert "unknown voice 'bob'" in run_bad(daemon, [{"type": "session.update", "voice": "bob"}])


def test_flood_is_an_error_event(daemon):
    msg = run_bad(daemon, [{"type": "input_text.append", "text": "word " * 40},
                           {"type": "input_text.append", "text": "word " * 40}])
    assert f"the limit is {LIMIT}" in msg


@pytest.mark.parametrize("message,needle", [
    ("{nope", "not valid JSON"), (json.dumps({"type": "speak"}), "unknown message type 'speak'"),
    (json.dumps({"type": "session.update", "speed": 5}), "'speed'"),
    (json.dumps({"type": "session.update", "text_mode": "letters"}), "'text_mode' must be one of words, sentences"),
    (json.dumps({"type": "session.update", "lexicon": {"a": 1}}), "'lexicon' must map words")])
def test_bad_messages_are_error_events(daemon, message, needle):
    assert needle in run_bad(daemon, [message])


def test_text_held_for_the_lexicon_is_capped(daemon):
    msg = run_bad(daemon, [{"type": "session.update", "lexicon": {"a": "b"}},
                           {"type": "input_text.append", "text": "x" * (LIMIT + 1)}])
    assert f"{LIMIT + 1} characters without a space or punctuation mark; the limit is {LIMIT}" in msg


def test_text_after_the_end_is_an_error_event(daemon):
    msg = run_bad(daemon, [{"type": "input_text.append", "text": "Hi."}, {"type": "input_text.end"},
                           {"type": "input_text.append", "text": "More."}])
    assert "'input_text.append' after input_text.end" in msg


def test_default_keepalive_survives_a_long_session(daemon):
    """The `websockets` client pings (every 20 s by default; 0.25 s here, so that the speech outlasts it):
    the server answers while it speaks the text sent before input_text.end, and the session ends with `done`
    and 1000. (The server used to stop reading at input_text.end: the client then closed with 1011.)"""
    from websockets.asyncio.client import unix_connect

    sentences = " ".join(f"Part {i}." for i in range(30))  # one request each, capped at model.max_frames (4)

    async def go():
        events = []
        async with unix_connect(daemon.socket, "ws://localhost/v1/audio/speech/live", ping_interval=0.25,
                                ping_timeout=300.0) as ws:  # (the pong's limit: a failure guard)
            await ws.send(json.dumps({"type": "session.update", "voice": "ryan", "seed": 1, "text_mode": "sentences"}))
            await ws.send(json.dumps({"type": "input_text.append", "text": sentences}))
            await ws.send(json.dumps({"type": "input_text.end"}))

            async def collect():  # ends at the server's close; ConnectionClosedError if it was not 1000
                async for msg in ws:
                    events.append(json.loads(msg) if isinstance(msg, str) else msg)

            reader = asyncio.create_task(collect())
            await asyncio.wait_for(await ws.ping(), 300)  # answered while the server still speaks
            spoken_at_pong = kinds_of(events).count("text.done")
            await asyncio.wait_for(reader, 300)
            return events, spoken_at_pong, ws.close_code

    events, spoken_at_pong, code = asyncio.run(go())
    assert kinds_of(events)[-1] == "done" and code == 1000, (kinds_of(events), code)
    assert kinds_of(events).count("text.done") == 30
    assert spoken_at_pong < 30, "the pong must come while the server speaks, not after it"
    pcm_of(events)


def test_session_close_stops_the_speech(daemon):
    """session.close, also while the last text is spoken: the server stops (its request is cancelled) and
    closes with 1000, without `done`."""
    closed = {}

    async def steps(ws, events):
        await ws.send_json({"type": "session.update", "voice": "ryan", "seed": 1})
        await ws.send_json({"type": "input_text.append", "text": "word " * 50})
        await ws.send_json({"type": "input_text.end"})
        await wait_for(events, lambda e: isinstance(e, bytes))
        await ws.send_json({"type": "session.close"})

    events = asyncio.run(session(daemon, steps, closed=closed))
    assert closed["code"] == 1000 and "done" not in kinds_of(events), (closed, kinds_of(events))
    assert_slots_freed(daemon)


def assert_slots_freed(daemon, limit: float = 300.0) -> None:
    """The session's slot goes back after its end (`limit`: a failure guard)."""
    deadline = time.monotonic() + limit
    while (health := daemon.get("/health")[1])["engine"]["active_slots"]:
        assert time.monotonic() < deadline, f"a slot is still taken: {health}"
        time.sleep(0.05)


def test_silent_client_is_dropped_and_others_go_on(impatient):
    daemon = impatient

    async def silent(ws, events):
        await wait_for(events, lambda e: e.get("type") == "error")

    async def both():
        async def talker(ws, events):
            await ws.send_json({"type": "input_text.append", "text": "Still here."})
            await ws.send_json({"type": "input_text.end"})

        return await asyncio.gather(session(daemon, silent), session(daemon, talker))

    quiet, ok = asyncio.run(both())
    assert quiet[-1]["type"] == "error" and f"no message for {IDLE_S:g} s" in quiet[-1]["message"]
    assert ok[-1]["type"] == "done" and any(isinstance(e, bytes) for e in ok)


def test_a_client_that_stops_mid_utterance_is_dropped(impatient):
    """Words mode: an utterance waiting for words holds a slot; a client that stops sending is dropped after
    http.read_timeout_s (its request is cancelled), not kept forever."""
    async def stalls(ws, events):
        await ws.send_json({"type": "input_text.append", "text": "Hello there and then "})
        await wait_for(events, lambda e: isinstance(e, dict) and e.get("type") == "error")

    events = asyncio.run(session(impatient, stalls))
    assert events[-1]["type"] == "error" and f"no message for {IDLE_S:g} s" in events[-1]["message"]
    assert_slots_freed(impatient)  # the cancelled request leaves its slot at the runner's next iteration


def test_pings_do_not_keep_a_silent_client(impatient):
    """A client whose library pings more often than http.read_timeout_s (3 s here; the `websockets`
    package's default keepalive pings every 20 s, the daemon's default timeout is 30 s) but sends no text
    after its first piece is still dropped: its pings are answered, but only messages count. The session
    ends with the timeout's error event and a 1008 close, and its slot is freed. (Each answered ping used to
    restart the server's receive timer: such a client held its slot for as long as it stayed connected.)"""
    from ws_util import only_pings_after

    first = [{"type": "session.update", "voice": "ryan", "seed": 1},
             {"type": "input_text.append", "text": "Hello there and then "}]
    nothing = {"type": "input_text.append", "text": ""}  # a message that adds no word, until audio came
    events, code, reason, latency = asyncio.run(only_pings_after(impatient.socket, "/v1/audio/speech/live", first,
                                                                 until_audio=nothing))
    assert latency > 0, "the client's pings were never answered"
    assert any(isinstance(e, bytes) for e in events), kinds_of(events)  # its first words were spoken
    assert events[-1]["type"] == "error" and f"no message for {IDLE_S:g} s" in events[-1]["message"], kinds_of(events)
    assert code == 1008 and reason == events[-1]["message"][:123], (code, reason)
    assert_slots_freed(impatient)


def test_words_arriving_while_an_utterance_ends_go_to_the_next_one():
    """An utterance whose request ends early (frame cap) is ended and replaced; words the client sends while the
    session reports `text.done` for it must go to the replacement, never to the ended feed (seen as
    "text appended after the feed was ended" under CPU load)."""
    from types import SimpleNamespace

    from appliance.http_live import LiveSession

    sent = []

    class Session(LiveSession):
        async def _speak_one(self, item):  # the request took the first word only, then ended
            item.take()
            item.taken = len("one ")

        async def _send(self, event):  # the reader runs while the speaker awaits this send
            sent.append(event)
            if event["type"] == "text.done":
                self.text.add("four ")

    cfg = SimpleNamespace(http=SimpleNamespace(max_text_chars=10_000, write_timeout_s=5.0))
    host = SimpleNamespace(engine=SimpleNamespace(sample_rate=24000, streams_text=lambda voice: True),
                           default_voice=lambda: "vivian")
    live = Session(SimpleNamespace(cfg=cfg, host=host), ws=None)
    live.text.add("one two three ")
    first = live.text.feed
    more = asyncio.run(live._speak_item(first))
    assert first.ended and first.text == "one two three "
    assert more is live.text.feed and not more.ended and more.text == "two three four "
    assert sent == [{"type": "text.done", "text": "one"}]


def test_a_server_error_closes_with_1011():
    """A bug while speaking ends that session with an error event and close code 1011 (not 1000)."""
    from types import SimpleNamespace

    from aiohttp import WSMsgType

    from appliance.http_live import LiveSession

    class FakeSocket:
        def __init__(self, messages):
            self.messages, self.sent = list(messages), []

        async def receive(self, timeout=None):
            if self.messages:
                return SimpleNamespace(type=WSMsgType.TEXT, data=json.dumps(self.messages.pop(0)))
            await asyncio.sleep(3600)

        async def send_json(self, event):
            self.sent.append(event)

    class Session(LiveSession):
        async def _speak_one(self, item):
            raise RuntimeError("a bug")

    cfg = SimpleNamespace(http=SimpleNamespace(max_text_chars=10_000, write_timeout_s=5.0, read_timeout_s=5.0),
                          jobs=SimpleNamespace(lexicon=None))
    host = SimpleNamespace(engine=SimpleNamespace(sample_rate=24000, streams_text=lambda voice: False),
                           default_voice=lambda: "vivian")
    ws = FakeSocket([{"type": "input_text.append", "text": "Hello there."}, {"type": "input_text.end"}])
    live = Session(SimpleNamespace(cfg=cfg, host=host, metrics=SimpleNamespace(error=lambda kind: None)), ws)
    asyncio.run(live.run())
    assert ws.sent == [{"type": "error", "message": "internal error: RuntimeError", "code": "internal_error"}]
    assert (live.close_code, live.close_reason) == (1011, "internal error: RuntimeError")
