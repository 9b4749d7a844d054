"""Voice-cloning parts: mel, speaker encoder, codec encoder, reference-audio loading, voice files.

Parity tests compare against golden outputs of the official qwen-tts 0.1.1 package stored under
tests/data/tiny/ (tiny random checkpoints); they skip while those fixtures are absent.
"""
from __future__ import annotations

import io
import math
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from engines.model.audio import load_audio, read_audio, resample
from engines.codec.encoder import MimiEncoderConfig, load_codec_encoder
from engines.model.config import ModelConfig, SpeakerEncoderConfig
from engines.model.errors import BadInput, UnsupportedMode
from engines.model.speaker_encoder import MEL_ARGS, SpeakerEncoder, load_speaker_encoder, mel_filterbank, mel_spectrogram
from engines.model.voice import ClonedVoice, make_cloned_voice

TINY = Path(os.environ.get("TTS_TINY_DIR") or Path(__file__).parent / "data" / "tiny")  # env: test a rebuilt copy
GOLDEN = TINY / "golden"
CODEC_DIR = TINY / "cv_small" / "speech_tokenizer"  # the same tiny codec sits in every checkpoint
BASES = ["base_small", "base_proj"]
CLIPS = ["ref_a_24k", "ref_b_24k", "ref_c_16k"]

needs_codec = pytest.mark.skipif(not (GOLDEN / "codec.npz").is_file() or not CODEC_DIR.is_dir(),
                                 reason="tiny codec goldens not built (tests/fixtures/build_fixtures.py)")


def _npz(name: str) -> dict:
    path = GOLDEN / f"{name}.npz"
    if not path.is_file():
        pytest.skip(f"golden {path.name} not built (tests/fixtures/build_fixtures.py)")
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def codec_golden() -> dict:
    return _npz("codec")


@pytest.fixture(scope="module")
def codec_encoder():
    if not CODEC_DIR.is_dir():
        pytest.skip("tiny codec not built")
    return load_codec_encoder(CODEC_DIR)


def _tone(sr: int, seconds: float, freq: float = 220.0, channels: int = 1) -> np.ndarray:
    t = np.arange(int(sr * seconds)) / sr
    rng = np.random.default_rng(int(freq))
    mono = 0.3 * np.sin(2 * np.pi * freq * t) * (1 + 0.5 * np.sin(2 * np.pi * 2.5 * t)) + 0.02 * rng.standard_normal(t.size)
    if channels == 1:
        return mono.astype(np.float32)
    return np.stack([mono * (0.5 + 0.5 * c / channels) for c in range(channels)], 1).astype(np.float32)


def _wav_bytes(audio: np.ndarray, sr: int, subtype: str = "FLOAT") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, sr, format="WAV", subtype=subtype)
    return buf.getvalue()


def _tiny_speaker_encoder(enc_dim: int = 24, seed: int = 0) -> SpeakerEncoder:
    cfg = SpeakerEncoderConfig(enc_dim=enc_dim, enc_channels=(16, 16, 16, 16, 48), enc_attention_channels=8,
                               enc_se_channels=8, enc_res2net_scale=4)
    torch.manual_seed(seed)
    return SpeakerEncoder(cfg).eval()


# ---------------------------------------------------------------- mel spectrogram ---------------
def test_mel_filterbank_is_slaney_triangles():
    fb = mel_filterbank(24000, 1024, 128, 0, 12000)
    assert fb.shape == (128, 513) and fb.dtype == np.float32
    assert (fb >= 0).all() and (fb.max(axis=1) > 0).all()
    # Slaney normalisation: each triangle has area ~1 over the Hz axis (2 / width scaling)
    df = 24000 / 1024
    areas = fb.sum(axis=1) * df
    assert np.allclose(areas[64:], 1.0, rtol=0.1) and abs(areas[64:].mean() - 1) < 0.01
    assert (np.diff(fb.argmax(axis=1)) >= 0).all()
    # anchors recorded from librosa.filters.mel(sr=24000, n_fft=1024, n_mels=128, fmin=0, fmax=12000)
    assert float(fb.sum(dtype=np.float64)) == pytest.approx(5.459415810865721, abs=1e-6)
    assert float(fb[100].max()) == pytest.approx(0.006238921079784632, abs=1e-9) and fb[100].argmax() == 239
    assert float(fb[3, 4]) == pytest.approx(0.02069680392742157, abs=1e-9)
    assert float(fb[127].sum(dtype=np.float64)) == pytest.approx(0.04264144804983516, abs=1e-8)


def test_mel_spectrogram_shape_and_floor():
    wav = torch.zeros(2, 24000)
    mel = mel_spectrogram(wav, **MEL_ARGS)
    assert mel.shape == (2, 128, 24000 // 256)
    assert torch.allclose(mel, torch.full_like(mel, math.log(1e-5)))  # silence hits the clamp floor


@needs_codec
@pytest.mark.parametrize("clip", CLIPS)
def test_mel_parity(codec_golden, clip):
    wav = load_audio(TINY / "audio" / f"{clip}.wav")
    ours = mel_spectrogram(torch.from_numpy(wav)[None], **MEL_ARGS)[0].numpy()  # [128, frames]
    ref = codec_golden[f"mel.{clip}"]
    assert ours.shape == ref.shape
    # fp32 FFT/GEMM sums in a CPU-dependent order; where the mel power is tiny, the log amplifies that
    # rounding (1.6e-4 on one machine; the golden itself is 1.3e-4 from an fp64 computation). So: the
    # power tightly relative to its peak (a wrong window or filterbank is off by > 1e-2), the log loosely.
    assert np.abs(np.exp(ours) - np.exp(ref)).max() / np.exp(ref).max() <= 1e-5
    assert np.abs(ours - ref).mean() <= 1e-5
    assert np.abs(ours - ref).max() <= 1e-3


# ---------------------------------------------------------------- speaker encoder --------------
@pytest.mark.parametrize("base", BASES)
def test_speaker_embedding_parity(base):
    if not (TINY / base / "model.safetensors").is_file():
        pytest.skip(f"tiny checkpoint {base} not built")
    golden = _npz(base)
    enc = load_speaker_encoder(TINY / base)
    assert enc.cfg.enc_dim == ModelConfig.from_dir(TINY / base).talker.hidden_size
    for clip in CLIPS:
        emb = enc.extract_speaker_embedding(load_audio(TINY / "audio" / f"{clip}.wav"))
        ref = golden[f"spk_embedding.{clip}"]
        assert emb.shape == ref.shape
        assert np.abs(emb.numpy() - ref).max() <= 1e-4, clip


def test_speaker_encoder_rejects_tiny_clip():
    with pytest.raises(BadInput, match="too short"):
        _tiny_speaker_encoder().extract_speaker_embedding(np.zeros(500, np.float32))


def test_speaker_encoder_wrong_weights_is_checkpoint_error(tmp_path):
    from safetensors.torch import save_file

    from engines.model.errors import CheckpointError

    (tmp_path / "config.json").write_text('{"model_type": "qwen3_tts", "tts_model_type": "base"}')
    save_file({"speaker_encoder.fc.weight": torch.zeros(3, 3, 1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="speaker encoder weights"):
        load_speaker_encoder(tmp_path)


# ---------------------------------------------------------------- codec encoder ----------------
def test_mimi_config_defaults():
    cfg = MimiEncoderConfig.from_dict({"hidden_size": 32, "upsampling_ratios": [8, 6, 5, 4], "frame_rate": 12.5})
    assert cfg.hidden_size == 32 and cfg.num_quantizers == 32 and cfg.codebook_dim == 256
    assert cfg.hop_length == 960 and cfg.downsample_kernel == 4 and cfg.head_size == 4


@needs_codec
@pytest.mark.parametrize("clip", CLIPS)
def test_encoder_codes_parity(codec_golden, codec_encoder, clip):
    wav = load_audio(TINY / "audio" / f"{clip}.wav")
    codes = codec_encoder.encode_one(torch.from_numpy(wav))  # [T, 16]
    ref = codec_golden[f"encode.{clip}"]
    assert codes.dtype == torch.int64 and codes.shape == ref.shape == (math.ceil(len(wav) / 1920), 16)
    assert np.array_equal(codes.numpy(), ref)


@needs_codec
def test_encoder_batch_matches_single(codec_golden, codec_encoder):
    """Zero-padded batch: like the official batched encode, only a shorter clip's LAST frame may differ
    (alone, the 25->12.5 Hz conv replicate-pads an odd tail; in a batch it sees the zero padding)."""
    wavs = [torch.from_numpy(load_audio(TINY / "audio" / f"{c}.wav")) for c in CLIPS]
    lengths = [len(w) for w in wavs]
    batch = torch.zeros(len(wavs), max(lengths))
    for i, w in enumerate(wavs):
        batch[i, : len(w)] = w
    codes = codec_encoder.encode(batch, lengths)  # [B, 16, F], -1 past each clip's end
    for i, clip in enumerate(CLIPS):
        ref = codec_golden[f"encode.{clip}"]
        n = ref.shape[0]
        ours = codes[i, :, :n].T.numpy()
        assert np.array_equal(ours[:-1], ref[:-1]) and (ours[-1] >= 0).all()
        if lengths[i] == max(lengths):
            assert np.array_equal(ours, ref)
        assert (codes[i, :, n:] == -1).all()


# ---------------------------------------------------------------- audio loading ----------------
@needs_codec
@pytest.mark.parametrize("clip", CLIPS)
def test_loaded_audio_matches_official_input(codec_golden, clip):
    ours = load_audio(TINY / "audio" / f"{clip}.wav")
    ref = codec_golden[f"encode_input_24k.{clip}"]
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    assert np.array_equal(ours, ref)  # soxr_hq, as librosa.resample uses: sample-identical


@needs_codec
def test_scipy_fallback_resampling_is_close(codec_golden, codec_encoder, monkeypatch):
    import sys

    import scipy.signal  # noqa: F401  (a test dependency: pyproject.toml's test extra)
    ref = codec_golden["encode_input_24k.ref_c_16k"]
    monkeypatch.setitem(sys.modules, "soxr", None)  # import soxr -> ImportError
    ours = load_audio(TINY / "audio" / "ref_c_16k.wav")
    assert ours.shape == ref.shape
    err = np.sqrt(np.mean((ours - ref) ** 2)) / np.sqrt(np.mean(ref ** 2))
    assert err < 0.05
    codes = codec_encoder.encode_one(torch.from_numpy(ours)).numpy()
    assert (codes[:, 0] == codec_golden["encode.ref_c_16k"][:, 0]).mean() >= 0.5


def test_resample_length_and_content():
    x = _tone(16000, 1.0001)
    y = resample(x, 16000, 24000)
    assert y.dtype == np.float32 and len(y) == math.ceil(len(x) * 1.5)
    # a 220 Hz tone stays a 220 Hz tone
    spec = np.abs(np.fft.rfft(y[:24000]))
    assert abs(np.argmax(spec) - 220) <= 1
    assert resample(x, 16000, 16000) is x


def test_resampled_lengths_follow_the_official_rule():
    """librosa.resample (the official package's resampler) makes ceil(n * ratio) samples, the ratio rounded to a
    float first: at 22.05, 11.025 and 44.1 kHz that is one sample more than the exact ceil(n * 24000 / sr) for
    about 0.5% of lengths (tests/test_clone_oracle.py checks against librosa itself)."""
    rng = np.random.default_rng(0)
    differs = 0
    for sr in (22050, 11025, 44100, 16000, 48000, 8000, 32000):
        x = _tone(sr, 3.0)
        step = sr // math.gcd(sr, 24000)  # lengths where n * 24000 / sr is whole: where the float may land above
        for n in sorted({*range(step, 40 * step, step), *rng.integers(sr // 2, 3 * sr, 30).tolist()}):
            official = int(np.ceil(n * (float(24000) / sr)))
            differs += official != math.ceil(n * 24000 / sr)
            assert len(resample(x[:n], sr, 24000)) == official, (n, sr)
    assert differs >= 10  # the lengths tried include those where the two rules part


def test_load_audio_sources_and_stereo(tmp_path):
    st = _tone(24000, 1.0, channels=2)
    path = tmp_path / "st.wav"
    sf.write(path, st, 24000, subtype="FLOAT")
    mono = np.mean(st, axis=-1)
    for src in (path, str(path), path.read_bytes(), io.BytesIO(path.read_bytes()), (st, 24000)):
        out = load_audio(src)
        assert out.shape == (24000,) and np.array_equal(out, mono.astype(np.float32))
    assert read_audio(_wav_bytes(_tone(16000, 1.0), 16000))[1] == 16000
    assert load_audio(_wav_bytes(_tone(16000, 1.0), 16000)).shape == (24000,)


def test_bad_audio_errors(tmp_path):
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    garbage = tmp_path / "garbage.wav"
    garbage.write_bytes(b"this is not audio at all" * 50)
    no_samples = tmp_path / "nosamples.wav"
    sf.write(no_samples, np.zeros(0, np.float32), 24000)
    short = tmp_path / "short.wav"
    sf.write(short, _tone(24000, 0.1), 24000)
    silent = tmp_path / "silent.wav"
    sf.write(silent, np.zeros(24000, np.float32), 24000)
    cases = [(tmp_path / "missing.wav", "not found"), (empty, "empty"), (garbage, "cannot decode"),
             (no_samples, "no samples"), (short, "too short"), (silent, "silence"),
             (b"", "empty"), (b"\x00\x01garbage" * 10, "cannot decode"),
             ((np.array([0.1, np.nan] * 20000, np.float32), 24000), "NaN")]
    for src, msg in cases:
        with pytest.raises(BadInput, match=msg) as info:
            load_audio(src)
        if isinstance(src, Path):
            assert src.name in str(info.value)  # the message names the file


# ---------------------------------------------------------------- cloned voices ----------------
def _voice(icl: bool = True, hidden: int = 24) -> ClonedVoice:
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 2048, (17, 16), generator=g) if icl else None
    return ClonedVoice(spk_embedding=torch.randn(hidden, generator=g), ref_codes=codes,
                       ref_text="Hello there, ünïcödé 你好." if icl else None, x_vector_only=not icl,
                       model_type="base", model_size="0b6", extra={"name": "alice"})


@pytest.mark.parametrize("icl", [True, False])
def test_voice_round_trip(tmp_path, icl):
    v = _voice(icl)
    path = v.save(tmp_path / "sub" / "alice.voice")
    w = ClonedVoice.load(path)
    assert torch.equal(w.spk_embedding, v.spk_embedding) and w.spk_embedding.dtype == v.spk_embedding.dtype
    if icl:
        assert torch.equal(w.ref_codes, v.ref_codes) and w.ref_codes.dtype == torch.int64
    else:
        assert w.ref_codes is None
    for k in ("ref_text", "x_vector_only", "model_type", "model_size", "hidden_size", "format_version", "extra"):
        assert getattr(w, k) == getattr(v, k), k
    assert w.icl_mode == icl
    assert path.stat().st_size < 4096 and not list(path.parent.glob("*.tmp"))
    bf = ClonedVoice(spk_embedding=v.spk_embedding.bfloat16(), x_vector_only=True)
    assert torch.equal(ClonedVoice.load(bf.save(tmp_path / "bf.voice")).spk_embedding, bf.spk_embedding)


def test_voice_mismatched_model(tmp_path):
    v = ClonedVoice.load(_voice().save(tmp_path / "v.voice"))
    v.check_fits(24)
    with pytest.raises(BadInput, match="hidden size 24.*hidden size 32.*re-create"):
        v.check_fits(32, model_size="1b7", name="alice")
    with pytest.raises(UnsupportedMode, match="Base"):
        v.check_fits(24, model_type="custom_voice")


def test_voice_file_errors(tmp_path):
    with pytest.raises(BadInput, match="not found"):
        ClonedVoice.load(tmp_path / "nope.voice")
    bad = tmp_path / "bad.voice"
    bad.write_bytes(b"garbage")
    with pytest.raises(BadInput, match="cannot read voice file .*bad.voice"):
        ClonedVoice.load(bad)
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "other.voice"))
    with pytest.raises(BadInput, match="not a tts-appliance voice"):
        ClonedVoice.load(tmp_path / "other.voice")
    with pytest.raises(BadInput, match="reference"):
        ClonedVoice(spk_embedding=torch.zeros(4), x_vector_only=False)


def test_make_cloned_voice_modes(tmp_path):
    spk = _tiny_speaker_encoder()
    path = tmp_path / "ref.wav"
    sf.write(path, _tone(16000, 1.5), 16000)
    with pytest.raises(BadInput, match="ref_text"):
        make_cloned_voice(spk, None, path, ref_text=None, x_vector_only=False)
    v = make_cloned_voice(spk, None, path, x_vector_only=True)
    assert v.x_vector_only and v.ref_codes is None and v.spk_embedding.shape == (24,)
    assert torch.equal(v.spk_embedding, spk.extract_speaker_embedding(load_audio(path)))


@pytest.mark.parametrize("base", BASES)
def test_make_cloned_voice_matches_official_prompt(base, codec_encoder):
    if not (GOLDEN / f"{base}.json").is_file():
        pytest.skip(f"golden {base}.json not built")
    import json

    doc = json.loads((GOLDEN / f"{base}.json").read_text())
    golden = _npz(base)
    cfg = ModelConfig.from_dir(TINY / base)
    spk = load_speaker_encoder(TINY / base)
    enc = load_codec_encoder(TINY / base / "speech_tokenizer")
    checked, made = 0, {}
    for case in doc["cases"]:
        if not case.get("ref_audio") or case.get("batch"):  # batch cases are covered by tests/test_parity.py
            continue
        key = (case["ref_audio"], case.get("ref_text"), bool(case.get("x_vector_only_mode")))
        if key not in made:  # several cases share one prompt
            made[key] = make_cloned_voice(spk, enc, TINY / key[0], ref_text=key[1], x_vector_only=key[2],
                                          model_config=cfg)
        v = made[key]
        cid = case["id"]
        assert np.abs(v.spk_embedding.numpy() - golden[f"{cid}.ref_spk_embedding"]).max() <= 1e-4, cid
        assert v.icl_mode == case["icl_mode"]
        if v.icl_mode:
            assert np.array_equal(v.ref_codes.numpy(), golden[f"{cid}.ref_code"]), cid
        else:
            assert v.ref_codes is None and f"{cid}.ref_code" not in golden
        checked += 1
    assert checked >= 4
    v.check_fits(cfg.talker.hidden_size, cfg.tts_model_type, cfg.talker.num_code_groups)
