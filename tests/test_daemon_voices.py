"""Saved cloned voices on a Base checkpoint, over the daemon's real Unix socket: a name is taken once
(409 unless "overwrite"), and the OpenAI-style list shows them."""
from __future__ import annotations

import base64

import pytest

from daemon_util import ROOT, Daemon, base_config, needs_daemon

pytestmark = needs_daemon
BASE = ROOT / "tests" / "data" / "tiny" / "base_small"
REF = ROOT / "tests" / "data" / "tiny" / "audio"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("voices")
    cfg = base_config(tmp, model={"path": str(BASE)}, jobs={"enabled": False, "watch": False},
                      wyoming={"enabled": False})
    d = Daemon(tmp, cfg).start()
    yield d
    assert d.stop() == 0


def voice(name, ref="ref_a_24k.wav", **kw):
    return {"name": name, "ref_audio": base64.b64encode((REF / ref).read_bytes()).decode(),
            "ref_text": "A reference sentence.", **kw}


def test_a_taken_name_is_409_unless_overwrite(daemon):
    status, body, _ = daemon.post("/v1/voices", voice("anna"))
    assert status == 201 and body == {"name": "anna", "replaced": False}, body
    saved = (daemon.home / "voices" / "anna.voice").read_bytes()
    status, err, _ = daemon.post("/v1/voices", voice("anna", "ref_b_24k.wav"))
    assert status == 409 and "overwrite" in err["error"]["message"], err
    assert (daemon.home / "voices" / "anna.voice").read_bytes() == saved  # the first one is kept
    status, body, _ = daemon.post("/v1/voices", voice("anna", "ref_b_24k.wav", overwrite=True))
    assert status == 200 and body["replaced"] is True, body
    assert (daemon.home / "voices" / "anna.voice").read_bytes() != saved


def test_saved_voices_in_the_openai_list(daemon):
    assert daemon.post("/v1/voices", voice("bert"))[0] in (200, 201)
    status, listed, _ = daemon.get("/v1/audio/voices")
    assert status == 200
    bert = [v for v in listed["data"] if v["id"] == "bert"]
    assert bert and bert[0]["type"] == "audio_sample" and bert[0]["created_at"] > 0, listed


def test_their_delete_route_deletes_the_saved_voice(daemon):
    """vllm-omni's clients delete an uploaded voice with DELETE /v1/audio/voices/{name}: the same as DELETE
    /v1/voices/{name} here (a saved clone, by name), with their `success` field; an unknown name is a 404 with a
    one-line JSON error. Sent by aiohttp's client over the daemon's socket."""
    import asyncio

    import aiohttp

    async def delete(name):
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=daemon.socket)) as http:
            async with http.delete(f"http://localhost/v1/audio/voices/{name}") as r:
                return r.status, await r.json()

    assert daemon.post("/v1/voices", voice("carl"))[0] in (200, 201)
    status, body = asyncio.run(delete("carl"))
    assert status == 200 and body["success"] is True and body["deleted"] is True and body["name"] == "carl", body
    assert not (daemon.home / "voices" / "carl.voice").exists()
    assert "carl" not in daemon.get("/v1/audio/voices")[1]["voices"]
    status, body = asyncio.run(delete("carl"))
    assert status == 404 and "no saved voice 'carl'" in body["error"]["message"], body
    assert "\n" not in body["error"]["message"]
