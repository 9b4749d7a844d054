"""`tts-appliance say` end to end on the tiny checkpoints: every mode writes a 24 kHz WAV; bad input exits 2
with a message that names the problem."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import soundfile as sf

from appliance.cli import main

TINY = Path(__file__).parent / "data" / "tiny"
REF = str(TINY / "audio" / "ref_a_24k.wav")


def run(monkeypatch, capsys, *args) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["tts-appliance", "say", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize("model,extra", [
    ("cv_small", ["--voice", "vivian", "--language", "english"]),
    ("cv_proj", ["--voice", "ryan", "--instruct", "Speak slowly."]),
    ("vd_proj", ["--instruct", "A calm, low voice."]),
    ("base_small", ["--ref-audio", REF, "--ref-text", "A reference sentence."]),
    ("base_small", ["--ref-audio", REF]),  # no transcript: x-vector only
])
def test_say_writes_24k_wav_in_every_mode(monkeypatch, capsys, tmp_path, model, extra):
    out = tmp_path / "out.wav"
    code, text = run(monkeypatch, capsys, "Hello there.", "--model", str(TINY / model), *extra,
                     "--max-frames", "6", "--seed", "1", "-o", str(out))
    assert code == 0, text
    audio, sr = sf.read(out)
    assert sr == 24000 and audio.ndim == 1 and 0 < len(audio) <= 6 * 1920


def test_saved_voice_is_reusable_without_reference_audio(monkeypatch, capsys, tmp_path):
    voice = tmp_path / "me.voice"
    args = ["--model", str(TINY / "base_small"), "--max-frames", "4", "--seed", "3", "--greedy"]
    code, text = run(monkeypatch, capsys, "Hi.", *args, "--ref-audio", REF, "--ref-text", "A reference sentence.",
                     "--save-voice", str(voice), "-o", str(tmp_path / "a.wav"))
    assert code == 0 and voice.is_file(), text
    code, text = run(monkeypatch, capsys, "Hi.", *args, "--voice", str(voice), "-o", str(tmp_path / "b.wav"))
    assert code == 0, text
    a, _ = sf.read(tmp_path / "a.wav")
    b, _ = sf.read(tmp_path / "b.wav")
    assert a.shape == b.shape and abs(a - b).max() < 1e-3  # same voice, same seed: same audio


def broken_copy(tmp_path, name="cv_small") -> Path:
    dst = tmp_path / name
    shutil.copytree(TINY / name, dst, symlinks=False)
    return dst


@pytest.mark.parametrize("case,expect", [
    ("missing_dir", "model folder not found"),
    ("missing_weights", "model.safetensors"),
    ("corrupt_weights", "corrupt checkpoint file"),
    ("corrupt_config", "config.json"),
    ("missing_vocab", "vocab.json"),
])
def test_bad_checkpoints_name_the_file(monkeypatch, capsys, tmp_path, case, expect):
    model = tmp_path / "nothing"
    if case != "missing_dir":
        model = broken_copy(tmp_path)
        if case == "missing_weights":
            (model / "model.safetensors").unlink()
        elif case == "corrupt_weights":
            (model / "model.safetensors").write_bytes(b"\x00garbage" * 10)
        elif case == "corrupt_config":
            (model / "config.json").write_text("{not json")
        else:
            (model / "vocab.json").unlink()
    code, text = run(monkeypatch, capsys, "Hello.", "--model", str(model), "--voice", "vivian",
                     "-o", str(tmp_path / "x.wav"))
    assert code == 2 and expect in text, text


@pytest.mark.parametrize("model,args,expect", [
    ("cv_small", ["--voice", "bob"], "unknown voice 'bob'; available: dylan, eric, ryan, vivian"),
    ("cv_small", ["--voice", "vivian", "--language", "klingon"], "unknown language 'klingon'; available: auto"),
    ("cv_small", ["--voice", "vivian", "--instruct", "Whisper."], "does not take instructions"),
    ("cv_small", ["--voice", "vivian", "--ref-audio", REF], "reference audio needs a Base checkpoint"),
    ("base_small", ["--instruct", "Whisper.", "--ref-audio", REF], "does not take instructions"),
    ("base_small", [], "give reference audio"),
    ("vd_proj", ["--voice", "vivian", "--instruct", "Calm."], "no named voices"),
])
def test_unsupported_requests_get_clear_errors(monkeypatch, capsys, tmp_path, model, args, expect):
    code, text = run(monkeypatch, capsys, "Hello.", "--model", str(TINY / model), *args, "-o", str(tmp_path / "x.wav"))
    assert code == 2 and expect in text, text
    assert not (tmp_path / "x.wav").exists()


def test_empty_text_and_unreadable_reference_audio(monkeypatch, capsys, tmp_path):
    code, text = run(monkeypatch, capsys, "   ", "--model", str(TINY / "cv_small"), "--voice", "vivian")
    assert code == 2 and "text is empty" in text
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF nonsense")
    code, text = run(monkeypatch, capsys, "Hi.", "--model", str(TINY / "base_small"), "--ref-audio", str(bad))
    assert code == 2 and "bad.wav" in text, text


def test_say_goes_through_the_engine_runner(monkeypatch, capsys, tmp_path):
    """One request path: `say` runs the continuous-batching EngineRunner (one slot), never the eager loop."""
    from engines.engine import TTSEngine
    from engines.runtime.runner import EngineRunner

    calls = []
    real = EngineRunner.synthesize

    def spy(self, requests, *args, **kw):
        calls.append((self.cfg.max_slots, len(requests)))
        out = real(self, requests, *args, **kw)
        calls.append(self.steps)
        return out

    def eager(*_a, **_k):
        raise AssertionError("say must not use the eager reference loop")

    monkeypatch.setattr(EngineRunner, "synthesize", spy)
    monkeypatch.setattr(TTSEngine, "synthesize", eager)
    out = tmp_path / "r.wav"
    code, text = run(monkeypatch, capsys, "Hello there.", "--model", str(TINY / "cv_small"), "--voice", "vivian",
                     "--max-frames", "5", "--seed", "2", "-o", str(out))
    assert code == 0 and f"wrote {out}:" in text and "Hz" in text, text
    assert calls[0] == (1, 1) and calls[1] >= 5, calls  # one slot, one request, a decode step per frame
    assert sf.read(out)[0].size > 0


def test_save_voice_clones_once(monkeypatch, capsys, tmp_path):
    from engines.engine import TTSEngine

    clones = []
    real = TTSEngine.make_voice
    monkeypatch.setattr(TTSEngine, "make_voice", lambda self, *a, **k: clones.append(a) or real(self, *a, **k))
    voice = tmp_path / "me.voice"
    code, text = run(monkeypatch, capsys, "Hi.", "--model", str(TINY / "base_small"), "--max-frames", "3",
                     "--ref-audio", REF, "--ref-text", "A reference sentence.", "--save-voice", str(voice),
                     "-o", str(tmp_path / "c.wav"))
    assert code == 0 and voice.is_file(), text
    assert len(clones) == 1, clones


def test_the_engine_loader_applies_the_decided_cpu_threads(monkeypatch, capsys, tmp_path, caplog):
    """model.threads auto is decided by the config (on 4 cores: 2 for the loop, 1 for the codec's thread, 1 left
    to the rest) and given to torch when the engine loads."""
    import logging

    import torch

    import engines.device.detect as detect

    monkeypatch.setattr(detect, "cpu_cores", lambda: 4)
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with caplog.at_level(logging.INFO, logger="engines.load"):
            code, text = run(monkeypatch, capsys, "Hi.", "--model", str(TINY / "cv_small"), "--voice", "ryan",
                             "--max-frames", "2", "-o", str(tmp_path / "a.wav"))
        assert code == 0, text
        assert torch.get_num_threads() == 2
        assert "torch CPU threads: 2" in caplog.text
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("where", ["step", "load"])
def test_an_engine_error_is_one_line_and_exit_2(monkeypatch, capsys, caplog, tmp_path, where):
    """An internal engine error (here injected into the decode loop, or into loading a checkpoint of
    shapes the engine cannot run) ends `say` like bad input: a one-line error, exit status 2, no traceback
    on the terminal; the traceback goes to the log at debug level (-vv)."""
    import logging

    from engines.engine import TTSEngine
    from engines.runtime.runner import EngineRunner

    def broken(*_a, **_k):
        raise IndexError("index out of range in self")

    monkeypatch.setattr(*((EngineRunner, "step_once", broken) if where == "step" else (TTSEngine, "load", broken)))
    out = tmp_path / "x.wav"
    with caplog.at_level(logging.DEBUG, logger="tts_appliance"):
        code, text = run(monkeypatch, capsys, "Hello.", "--model", str(TINY / "cv_small"), "--voice", "vivian",
                         "-o", str(out))
    assert code == 2, text
    assert text.strip().splitlines() == ["error: internal engine error (IndexError: index out of range in self); "
                                         "run again with -vv for the traceback and report it"], text
    assert not out.exists()
    assert any(r.exc_info and r.levelno == logging.DEBUG for r in caplog.records)
