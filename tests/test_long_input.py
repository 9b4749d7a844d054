"""Any input up to the documented limit is spoken whole: text longer than one request's context (prompt plus
frames within runtime.max_context) goes as pieces at sentence ends into the same stream, on the speech API
(streamed and whole file) and Wyoming; over the limit, 413 naming it and the jobs API."""
from __future__ import annotations

import asyncio

import pytest

from appliance.streams import PIECE_CHARS, split_request
from engines.api import SynthesisRequest
from text.split import pieces

from daemon_util import Daemon, base_config, endless_model, needs_daemon

pytestmark = [needs_daemon, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
FRAMES = 3  # frames per piece: every request of the fixed-length checkpoint makes exactly this many
SPF = 1920
# about 4,700 characters: the prompt alone is past one request's 2,048 positions (the tiny tokenizer is
# byte-level: about a token a character), and where the old code answered 400 or cut the audio short
TEXT = " ".join(f"Sentence {i} of the long input is read out loud, every word of it." for i in range(72))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("long")
    model = endless_model(tmp, FRAMES)  # EOS masked: exactly FRAMES frames with max_frames FRAMES
    cfg = base_config(tmp, model={"path": model, "max_frames": FRAMES}, runtime={"max_context": 2048},
                      jobs={"enabled": False, "watch": False})
    d = Daemon(tmp, cfg).start()
    yield d
    assert d.stop() == 0


def test_pieces_end_at_sentences_and_keep_every_word():
    parts = pieces(TEXT, "en", PIECE_CHARS)
    assert len(TEXT) > 4500 and len(parts) > 10 and all(len(p) <= PIECE_CHARS for p in parts)
    assert " ".join(parts) == TEXT and all(p.endswith(".") for p in parts)
    reqs = split_request(SynthesisRequest(text=TEXT, voice="ryan"))
    assert [r.text for r in reqs] == parts and all(r.voice == "ryan" for r in reqs)
    assert [r.text for r in split_request(SynthesisRequest(text="Short."))] == ["Short."]


@pytest.mark.parametrize("stream", [False, True])
def test_long_input_is_spoken_whole_on_the_speech_api(daemon, stream):
    n = len(split_request(SynthesisRequest(text=TEXT)))
    status, audio, headers = daemon.post("/v1/audio/speech", {"input": TEXT, "voice": "ryan", "response_format": "pcm",
                                                              "stream": stream, "seed": 1})
    assert status == 200, audio
    assert len(audio) == n * FRAMES * SPF * 2  # 16-bit PCM: every piece, each its FRAMES frames


@pytest.mark.parametrize("stream", [False, True])
def test_a_clients_max_frames_caps_the_whole_answer(daemon, stream):
    """`max_frames` of a speech request caps what the client gets over all pieces of a long input (each piece
    makes FRAMES here), not each piece: 5 frames are the first piece and 2 of the second."""
    status, audio, _ = daemon.post("/v1/audio/speech", {"input": TEXT, "voice": "ryan", "response_format": "pcm",
                                                        "stream": stream, "seed": 1, "max_frames": 5})
    assert status == 200, audio
    assert len(audio) == 5 * SPF * 2


def test_long_input_is_spoken_whole_on_wyoming(daemon):
    from wyoming.client import AsyncUnixClient
    from wyoming.tts import Synthesize, SynthesizeVoice

    async def go():
        got = 0
        async with AsyncUnixClient(daemon.wyoming) as c:
            await c.write_event(Synthesize(text=TEXT, voice=SynthesizeVoice(name="ryan")).event())
            while True:
                ev = await asyncio.wait_for(c.read_event(), 60)
                assert ev is not None and ev.type != "error", ev
                if ev.type == "audio-chunk":
                    got += len(ev.payload)
                if ev.type == "audio-stop":
                    return got

    n = len(split_request(SynthesisRequest(text=TEXT)))
    assert asyncio.run(go()) == n * FRAMES * SPF * 2


def test_over_the_limit_is_413_naming_it_and_the_jobs_api(daemon):
    status, err, _ = daemon.post("/v1/audio/speech", {"input": "word " * 5000, "voice": "ryan"})
    assert status == 413 and "20000" in err["error"]["message"] and "/v1/jobs" in err["error"]["message"]
