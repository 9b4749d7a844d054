"""Wyoming server of the daemon, driven by the `wyoming` package's own client classes over the
real Unix socket: describe -> info, synthesize -> audio, streaming text in -> audio per sentence."""
from __future__ import annotations

import asyncio
import time

import pytest

from daemon_util import Daemon, base_config, endless_model, needs_daemon

pytestmark = [needs_daemon, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wy")
    d = Daemon(tmp, base_config(tmp, model={"max_frames": 6}, jobs={"enabled": False, "watch": False})).start()
    yield d
    assert d.stop() == 0


async def collect(client, until: str, timeout: float = 30.0) -> list:
    events = []
    while True:
        ev = await asyncio.wait_for(client.read_event(), timeout)
        assert ev is not None, f"connection closed after {[e.type for e in events]}"
        events.append(ev)
        if ev.type == until:
            return events


def run(coro):
    return asyncio.run(coro)


def test_describe_lists_voices_and_languages(daemon):
    from wyoming.client import AsyncUnixClient
    from wyoming.info import Describe, Info

    async def go():
        async with AsyncUnixClient(daemon.wyoming) as c:
            await c.write_event(Describe().event())
            return Info.from_event((await collect(c, "info"))[-1])

    info = run(go())
    [prog] = info.tts
    assert prog.supports_synthesize_streaming
    names = {v.name for v in prog.voices}
    assert {"ryan", "vivian"} <= names
    # BCP-47 tags, as Home Assistant matches a pipeline's language (en-US) against them; names score no match
    for voice in prog.voices:
        assert {"en", "de", "zh", "fr"} <= set(voice.languages) and "english" not in voice.languages, voice


@pytest.mark.parametrize("language", ["en", "en-US", "de-DE", "German"])
def test_synthesize_takes_the_language_tags_home_assistant_sends(daemon, language):
    """Home Assistant names a language (no voice): the tag is the model's language, spoken by the default voice."""
    from wyoming.client import AsyncUnixClient
    from wyoming.tts import Synthesize, SynthesizeVoice

    async def go():
        async with AsyncUnixClient(daemon.wyoming) as c:
            await c.write_event(Synthesize(text="Hello there.", voice=SynthesizeVoice(language=language)).event())
            return await collect(c, "audio-stop")

    types = [e.type for e in run(go())]
    assert types[0] == "audio-start" and "audio-chunk" in types


def test_a_language_the_model_lacks_is_an_error_event(daemon):
    """The language is used, not ignored: one the checkpoint lacks is refused, naming those it has."""
    from wyoming.client import AsyncUnixClient
    from wyoming.error import Error
    from wyoming.tts import SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

    async def go():
        async with AsyncUnixClient(daemon.wyoming) as c:
            await c.write_event(SynthesizeStart(voice=SynthesizeVoice(language="sw-KE")).event())
            await c.write_event(SynthesizeChunk(text="Habari. ").event())
            try:  # the server may have answered the chunk's sentence with the error and closed already
                await c.write_event(SynthesizeStop().event())
            except (ConnectionError, BrokenPipeError):
                pass
            return await collect(c, "error")

    err = Error.from_event(run(go())[-1])
    assert err.code == "LanguageNotSupported" and "'sw-KE'" in err.text and "english" in err.text, err


def test_synthesize_gives_audio_start_chunks_stop(daemon):
    from wyoming.audio import AudioChunk, AudioStart
    from wyoming.client import AsyncUnixClient
    from wyoming.tts import Synthesize, SynthesizeVoice

    async def go():
        async with AsyncUnixClient(daemon.wyoming) as c:
            await c.write_event(Synthesize(text="Hello from Wyoming.", voice=SynthesizeVoice(name="ryan")).event())
            return await collect(c, "audio-stop")

    events = run(go())
    types = [e.type for e in events]
    assert types[0] == "audio-start" and types[-1] == "audio-stop" and "audio-chunk" in types
    start = AudioStart.from_event(events[0])
    assert (start.rate, start.width, start.channels) == (24000, 2, 1)
    chunk = AudioChunk.from_event(events[1])
    assert chunk.rate == 24000 and len(chunk.audio) > 0


def test_streaming_text_in_audio_out_per_sentence(daemon):
    from wyoming.client import AsyncUnixClient
    from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

    async def go():
        async with AsyncUnixClient(daemon.wyoming) as c:
            await c.write_event(SynthesizeStart(voice=SynthesizeVoice(name="vivian")).event())
            await c.write_event(SynthesizeChunk(text="First sentence. Sec").event())
            # audio for the first sentence comes before the rest of the text is sent
            first = await collect(c, "audio-chunk")
            await c.write_event(SynthesizeChunk(text="ond one! And a third").event())
            await c.write_event(Synthesize(text="First sentence. Second one! And a third").event())  # compat copy
            await c.write_event(SynthesizeStop().event())
            rest = await collect(c, "synthesize-stopped")
            return first, rest

    first, rest = run(go())
    assert [e.type for e in first][0] == "audio-start"
    types = [e.type for e in rest]
    assert types[-2:] == ["audio-stop", "synthesize-stopped"]
    assert types.count("audio-start") == 0 and types.count("audio-stop") == 1 and "audio-chunk" in types
    metrics = daemon.get("/metrics")[1].decode()
    # three sentences -> three engine requests (the compat `synthesize` copy is ignored)
    line = [ln for ln in metrics.splitlines() if ln.startswith('tts_requests_total{api="wyoming",outcome="ok"}')]
    assert line and float(line[0].split()[1]) >= 3


async def until_end(client, stop: str, timeout: float = 20.0) -> tuple[list, bool]:
    """Read as Home Assistant's Wyoming TTS client does: until `stop` (audio-stop; synthesize-stopped when it
    streams text) or the connection's end, ignoring `error` -> (events, whether the connection ended)."""
    events = []

    async def read():
        while True:
            ev = await client.read_event()
            if ev is None:
                return True
            events.append(ev)
            if ev.type == stop:
                return False

    try:
        return events, await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"still waiting for {stop} or the connection's end after {timeout} s: "
                             f"{[e.type for e in events]}") from None


def assert_error_then_end(events, ended, code):
    """An error event, then the connection's end: nothing else after the error (no audio-stop)."""
    from wyoming.error import Error

    types = [e.type for e in events]
    assert ended and types and types[-1] == "error", types
    err = Error.from_event(events[-1])
    assert err.code == code, err
    return err


def test_unknown_voice_is_an_error_event_and_the_connection_ends(daemon):
    """Home Assistant's client reads until audio-stop or the connection's end and ignores `error`: after the
    error the server closes the connection, so that client returns (it waited forever before)."""
    from wyoming.client import AsyncUnixClient
    from wyoming.tts import Synthesize, SynthesizeVoice

    async def go():
        async with AsyncUnixClient(daemon.wyoming) as c:
            await c.write_event(Synthesize(text="Hi.", voice=SynthesizeVoice(name="nobody")).event())
            return await until_end(c, "audio-stop")

    err = assert_error_then_end(*run(go()), "VoiceNotFound")
    assert "unknown voice 'nobody'" in err.text
    test_describe_lists_voices_and_languages(daemon)  # the daemon still serves


def test_an_error_in_a_text_stream_ends_the_connection(daemon):
    """Streaming text as Home Assistant sends it (start, chunks, the compat synthesize, stop): the first failing
    sentence's error ends the exchange; no audio-stop or synthesize-stopped dresses it up as a short clip."""
    from wyoming.client import AsyncUnixClient
    from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

    async def go():
        async with AsyncUnixClient(daemon.wyoming) as c:
            voice = SynthesizeVoice(name="nobody")
            events = [SynthesizeStart(voice=voice), *(SynthesizeChunk(text=t) for t in ("First one. ", "Second one. ",
                                                                                      "Third")),
                      Synthesize(text="First one. Second one. Third", voice=voice), SynthesizeStop()]
            try:  # the server answers the first sentence with the error and closes, maybe before all is sent
                for e in events:
                    await c.write_event(e.event())
            except (ConnectionError, BrokenPipeError):
                pass
            return await until_end(c, "synthesize-stopped")

    events, ended = run(go())
    assert_error_then_end(events, ended, "VoiceNotFound")
    assert [e.type for e in events].count("error") == 1


def test_text_still_arriving_after_the_error_does_not_reset_the_connection(daemon):
    """A client that is still writing its text stream when the error comes (here: a megabyte of chunks sent
    at once behind a start with an unknown voice) reads the error and a clean end: the server shuts its side,
    reads and drops the rest, then closes. Closing with the rest unread reset the connection, and the client
    met "connection reset by peer" instead of the error (CI saw it on a loaded machine)."""
    import io
    import socket

    from wyoming.event import read_event, write_event
    from wyoming.tts import SynthesizeChunk, SynthesizeStart, SynthesizeVoice

    out = io.BytesIO()
    write_event(SynthesizeStart(voice=SynthesizeVoice(name="nobody")).event(), out)
    chunk = SynthesizeChunk(text="More words arrive while the server answers. " * 20).event()
    while out.tell() < 2**20:
        write_event(chunk, out)
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(20)
        s.connect(str(daemon.wyoming))
        s.sendall(out.getvalue())
        s.shutdown(socket.SHUT_WR)
        received = b""
        while True:
            part = s.recv(65536)  # ConnectionResetError here is the defect
            if not part:
                break
            received += part
    inp = io.BytesIO(received)
    events = []
    while (ev := read_event(inp)) is not None:
        events.append(ev)
    assert_error_then_end(events, True, "VoiceNotFound")


def test_a_chunk_without_a_start_is_an_error_and_the_end(daemon):
    from wyoming.client import AsyncUnixClient
    from wyoming.tts import SynthesizeChunk

    async def go():
        async with AsyncUnixClient(daemon.wyoming) as c:
            await c.write_event(SynthesizeChunk(text="Hello. ").event())
            return await until_end(c, "audio-stop")

    assert_error_then_end(*run(go()), "protocol")


def test_a_busy_engine_is_an_error_and_the_end(tmp_path):
    """Every slot and queue place taken (max_slots 1, max_queue 1): a Wyoming request gets a `busy` error
    saying when to try again, then the connection ends."""
    from wyoming.client import AsyncUnixClient
    from wyoming.tts import Synthesize, SynthesizeVoice

    from test_daemon_slots import engine, open_stream, read_some, wait_for

    cfg = base_config(tmp_path, runtime={"max_slots": 1, "max_queue": 1, "retry_after_s": 3},
                      model={"path": endless_model(tmp_path), "max_frames": 2000},
                      jobs={"enabled": False, "watch": False})
    d = Daemon(tmp_path, cfg).start()
    held = []
    try:
        held.append(open_stream(d))
        read_some(held[0])  # it plays: its slot is taken
        assert wait_for(lambda: engine(d)["active_slots"] == 1, 30.0)
        held.append(open_stream(d))  # waits in the admission queue
        assert wait_for(lambda: engine(d)["queued"] == 1, 30.0)

        async def go():
            async with AsyncUnixClient(d.wyoming) as c:
                await c.write_event(Synthesize(text="Hi.", voice=SynthesizeVoice(name="ryan")).event())
                return await until_end(c, "audio-stop")

        err = assert_error_then_end(*run(go()), "busy")
        assert "try again in 3 s" in err.text, err
    finally:
        for s in held:
            s.close()
        assert d.stop() == 0


def test_a_client_closing_mid_event_is_one_info_line(daemon):
    import json
    import socket

    data = json.dumps({"text": "Hello there."}).encode()
    s = socket.socket(socket.AF_UNIX)
    s.connect(daemon.wyoming)
    s.sendall(json.dumps({"type": "synthesize", "data_length": len(data)}).encode() + b"\n" + data[:5])
    s.close()  # gone before the event's data
    deadline = time.monotonic() + 300  # (a failure guard)
    while "closed the connection mid-event" not in daemon.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = daemon.log_text()
    assert "INFO appliance.wyoming_server: wyoming client closed the connection mid-event (5 of" in log, log[-2000:]
    assert "wyoming connection failed" not in log and "IncompleteReadError" not in log
    test_describe_lists_voices_and_languages(daemon)  # still serving


def test_text_is_spoken_with_the_config_lexicon(tmp_path):
    """jobs.lexicon's file applies to Wyoming's text too (what reaches the engine is the replaced text)."""
    from types import SimpleNamespace

    from appliance.wyoming_server import TtsHandler

    (tmp_path / "words.yaml").write_text("Qwen: chwen\n")
    asked, sent = [], []
    host = SimpleNamespace(engine=SimpleNamespace(voices=["ryan"], languages=["auto", "english"]),
                           default_voice=lambda: "ryan", request=lambda text, **kw: asked.append(text))  # None: refused
    cfg = SimpleNamespace(wyoming=SimpleNamespace(default_voice=None, default_language="auto"),
                          jobs=SimpleNamespace(lexicon=str(tmp_path / "words.yaml")))
    handler = TtsHandler(SimpleNamespace(cfg=cfg, host=host), None, None)

    async def write_event(event):
        sent.append(event)

    handler.write_event = write_event
    assert run(handler.speak("Qwen speaks.", "ryan", "english")) is False
    assert asked == ["chwen speaks."] and sent[0].type == "error"


def test_listeners_open_to_the_network_are_warned_about(tmp_path):
    """Wyoming has no authentication and the HTTP API none without http.api_key: a daemon listening beyond
    loopback says so in its log (Home Assistant on another machine is a reason to; the admin should know)."""
    cfg = base_config(tmp_path, jobs={"enabled": False, "watch": False},
                      http={"tcp": True, "tcp_host": "0.0.0.0", "tcp_port": 0},
                      wyoming={"tcp_host": "0.0.0.0", "tcp_port": 0})
    d = Daemon(tmp_path, cfg).start()
    try:
        log = d.log_text()
    finally:
        assert d.stop() == 0
    assert "HTTP API on http://0.0.0.0:" in log and "without an API key" in log, log[-2000:]
    assert "Wyoming on tcp://0.0.0.0:" in log and "no authentication" in log, log[-2000:]


def test_an_idle_connection_is_closed_after_wyoming_idle_timeout_s(tmp_path):
    """With the `wyoming` package's own client: a connection that sends nothing more, between requests or in an
    open text stream, gets an `error` event (code timeout, naming the key) and its end; one that keeps sending
    is served (wyoming.idle_timeout_s 1 s here; the default is 60 s)."""
    from wyoming.client import AsyncUnixClient
    from wyoming.info import Describe
    from wyoming.tts import SynthesizeChunk, SynthesizeStart, SynthesizeVoice

    d = Daemon(tmp_path, base_config(tmp_path, model={"max_frames": 4}, jobs={"enabled": False, "watch": False},
                                     wyoming={"idle_timeout_s": 1.0})).start()
    try:
        async def idle_after(first_events, until):
            async with AsyncUnixClient(d.wyoming) as c:
                for ev in first_events:
                    await c.write_event(ev.event())
                served = await collect(c, until)
                return served, *await until_end(c, "never", timeout=30)

        served, events, ended = run(idle_after([Describe()], "info"))
        err = assert_error_then_end(events, ended, "timeout")
        assert "no event for 1 s" in err.text and "wyoming.idle_timeout_s" in err.text, err
        assert served[-1].type == "info"

        stream = [SynthesizeStart(voice=SynthesizeVoice(name="ryan")), SynthesizeChunk(text="Hello there. ")]
        served, events, ended = run(idle_after(stream, "audio-start"))
        assert_error_then_end(events, ended, "timeout")
    finally:
        assert d.stop() == 0


def test_a_client_that_stops_reading_is_closed_after_wyoming_write_timeout_s(tmp_path):
    """A client that asks for speech and then reads nothing (a stalled Home Assistant, a dead network path that
    still holds the socket): once the daemon's buffers are full its write waits, and after wyoming.write_timeout_s
    (1 s here; 60 by default) the connection is closed and the request cancelled, not held for ever. The test
    waits for the close itself (the socket's hang-up, seen without reading), not for a time."""
    import json
    import select
    import socket

    model = {"path": endless_model(tmp_path), "max_frames": 2000}  # (the audio outgrows the socket's buffers)
    d = Daemon(tmp_path, base_config(tmp_path, model=model, jobs={"enabled": False, "watch": False},
                                     wyoming={"write_timeout_s": 1.0})).start()
    try:
        data = json.dumps({"text": "A long text to read. " * 5, "voice": {"name": "ryan"}}).encode()
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(d.wyoming)
            s.sendall(json.dumps({"type": "synthesize", "data_length": len(data)}).encode() + b"\n" + data)
            hangup = select.poll()
            hangup.register(s, select.POLLRDHUP | select.POLLHUP)  # not POLLIN: what came stays unread
            assert hangup.poll(300_000), f"a client that stopped reading was never closed:\n{d.log_text()[-3000:]}"
        deadline = time.monotonic() + 300  # (a failure guard)
        while (engine := d.get("/health")[1]["engine"])["active_slots"] or engine["streams"]:
            assert time.monotonic() < deadline, engine
            time.sleep(0.05)
        assert engine["frames"] < 2000, "the request must be cancelled, not run to its 2000-frame end"
        log = d.log_text()
        assert "wyoming client read nothing for 1 s (wyoming.write_timeout_s)" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        assert 'tts_requests_total{api="wyoming",outcome="slow_client"} 1.0' in d.get("/metrics")[1].decode()
        from wyoming.client import AsyncUnixClient
        from wyoming.info import Describe

        async def describe():
            async with AsyncUnixClient(d.wyoming) as c:
                await c.write_event(Describe().event())
                return (await collect(c, "info"))[-1].type

        assert run(describe()) == "info"  # the server goes on
    finally:
        assert d.stop() == 0
