"""Voice cloning as vllm-omni's Qwen3-TTS clients ask for it, against the real daemon on a Base checkpoint:
`ref_audio` as a data URL, as a file in the voices folder (by name, absolute, file:// URI) or in
jobs.allowed_dirs; refused as an internet URL (the appliance is offline) or a file elsewhere;
`x_vector_only_mode` clones from the speaker embedding alone; saved voices listed as `uploaded_voices`."""
from __future__ import annotations

import base64
import shutil

import pytest

from daemon_util import ROOT, Daemon, base_config, needs_daemon

pytestmark = needs_daemon
BASE = ROOT / "tests" / "data" / "tiny" / "base_small"
REF = ROOT / "tests" / "data" / "tiny" / "audio" / "ref_a_24k.wav"
DATA_URL = "data:audio/wav;base64," + base64.b64encode(REF.read_bytes()).decode()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("clone")
    allowed, elsewhere = tmp / "allowed", tmp / "elsewhere"
    for folder in (allowed, elsewhere, tmp / "home" / "voices"):
        folder.mkdir(parents=True)
        shutil.copy(REF, folder / "ref.wav")
    cfg = base_config(tmp, model={"path": str(BASE), "max_frames": 6},
                      jobs={"enabled": False, "watch": False, "allowed_dirs": [str(allowed)]},
                      wyoming={"enabled": False})
    d = Daemon(tmp, cfg).start()
    d.allowed, d.elsewhere = allowed, elsewhere
    yield d
    assert d.stop() == 0


def clone(daemon, ref_audio, **kw):
    body = {"input": "Hello, this is a cloned voice", "task_type": "Base", "ref_audio": ref_audio,
            "ref_text": "A reference sentence.", "response_format": "pcm", "seed": 4, **kw}
    return daemon.post("/v1/audio/speech", body)


def test_a_data_url_clones(daemon):
    status, pcm, headers = clone(daemon, DATA_URL)
    assert status == 200 and headers["Content-Type"] == "audio/pcm" and 0 < len(pcm) <= 6 * 3840, pcm[:300]


def test_files_in_the_allowed_folders_clone_like_the_data_url(daemon):
    same = clone(daemon, DATA_URL)[1]
    voices = daemon.home / "voices"
    for ref in ("ref.wav", str(voices / "ref.wav"), (voices / "ref.wav").as_uri(), str(daemon.allowed / "ref.wav")):
        status, pcm, _ = clone(daemon, ref)
        assert status == 200 and pcm == same, (ref, pcm[:300])


@pytest.mark.parametrize("where,status,needle", [
    ("elsewhere", 403, "outside the voices folder"),
    ("../elsewhere/ref.wav", 403, "outside the voices folder"),
    ("missing.wav", 400, "no file 'missing.wav'"),
    ("http://example.com/reference.wav", 400, "the appliance is offline"),
    ("https://example.com/reference.wav", 400, "put the file in the voices folder"),
    ("data:audio/wav,notbase64", 400, "a data URL must carry base64 audio"),
])
def test_refused_references_say_why(daemon, where, status, needle):
    ref = str(daemon.elsewhere / "ref.wav") if where == "elsewhere" else where
    got, err, _ = clone(daemon, ref)
    assert got == status and needle in err["error"]["message"], err


def test_x_vector_only_mode_leaves_the_transcript_out(daemon):
    icl = clone(daemon, DATA_URL)[1]
    xvec = clone(daemon, DATA_URL, x_vector_only_mode=True)[1]
    assert xvec == clone(daemon, DATA_URL, ref_text=None)[1] and xvec != icl


def test_saved_clones_are_uploaded_voices(daemon):
    status, _, _ = daemon.post("/v1/voices", {"name": "clara", "ref_audio": DATA_URL, "ref_text": "A reference."})
    assert status == 201
    status, listed, _ = daemon.get("/v1/audio/voices")
    assert status == 200 and "clara" in listed["voices"]
    assert [v["name"] for v in listed["uploaded_voices"]] == listed["voices"]
    assert all(v["file_size"] > 0 and v["created_at"] > 0 for v in listed["uploaded_voices"])
