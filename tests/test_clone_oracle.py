"""Voice cloning from references at other rates than 24 kHz, against the official package run live (marker
`oracle`: the interpreter of tests/test_official_baseline.py, the checkout's .venv-oracle): the resampled
reference (librosa.resample, soxr_hq) sample for sample, and an in-context clone's reference codes and speaker
embedding from 22.05, 11.025 and 44.1 kHz recordings whose length the official sizes one sample longer than the
exact ceil(n * 24000 / sr) (it was one sample short here: a different last reference frame and embedding)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from engines.codec.encoder import load_codec_encoder
from engines.model.audio import load_audio, resample
from engines.model.config import ModelConfig
from engines.model.speaker_encoder import load_speaker_encoder
from engines.model.voice import make_cloned_voice
from test_official_baseline import _oracle, needs_qwen_tts

BASE = Path(__file__).parent / "data" / "tiny" / "base_small"
REF_TEXT = "A reference recorded at a rate of its own."
RATES = (22050, 11025, 44100)
# the official package's side: librosa.resample of each input, and create_voice_clone_prompt of each reference
ORACLE = """
import json, sys
import numpy as np
import benchmarks.official_baseline as b
Qwen3TTSModel = b.import_official()
import librosa
job = json.loads(sys.argv[1])
out = {}
with np.load(job["inputs"]) as z:
    for i, sr in enumerate(job["rates"]):
        out[f"resampled.{i}"] = librosa.resample(y=z[f"x.{i}"], orig_sr=sr, target_sr=24000)
tts = Qwen3TTSModel.from_pretrained(job["checkpoint"])
for sr, path in job["refs"].items():
    [item] = tts.create_voice_clone_prompt(ref_audio=path, ref_text=job["ref_text"], x_vector_only_mode=False)
    out[f"ref_code.{sr}"] = item.ref_code.cpu().numpy()
    out[f"spk.{sr}"] = item.ref_spk_embedding.float().cpu().numpy()
np.savez(job["out"], **out)
"""


def rule_parts(n: int, sr: int) -> bool:
    """Whether the official length of n samples at sr differs from the exact ceil(n * 24000 / sr)."""
    return int(np.ceil(n * (24000 / sr))) != math.ceil(n * 24000 / sr)


def reference(sr: int, seconds: float = 2.0) -> np.ndarray:
    """A voiced-ish signal (harmonics with a slow vibrato, a little noise) whose length the two rules size apart."""
    n = int(sr * seconds)
    while not rule_parts(n, sr):
        n += 1
    t = np.arange(n) / sr
    rng = np.random.default_rng(sr)
    f0 = 140 + 20 * np.sin(2 * np.pi * 3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    x = sum(0.2 / k * np.sin(k * phase) for k in range(1, 8)) * (0.6 + 0.4 * np.sin(2 * np.pi * 1.5 * t))
    return (x + 0.01 * rng.standard_normal(n)).astype(np.float32)


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    """The official package's results for the inputs `inputs()` makes (one oracle run for the module)."""
    if not (BASE / "model.safetensors").is_file():
        pytest.skip(f"tiny checkpoint missing: {BASE} (tests/fixtures/build_fixtures.py)")
    tmp = tmp_path_factory.mktemp("clone_oracle")
    xs, rates = inputs()
    np.savez(tmp / "inputs.npz", **{f"x.{i}": x for i, x in enumerate(xs)})
    refs = {}
    for sr in RATES:
        refs[sr] = str(tmp / f"ref_{sr}.wav")
        sf.write(refs[sr], reference(sr), sr, subtype="PCM_16")
    job = {"inputs": str(tmp / "inputs.npz"), "rates": rates, "checkpoint": str(BASE), "refs": refs,
           "ref_text": REF_TEXT, "out": str(tmp / "official.npz")}
    r = _oracle(["-c", ORACLE, json.dumps(job)])
    assert r.returncode == 0, r.stderr[-3000:]
    with np.load(tmp / "official.npz") as z:
        return {k: z[k] for k in z.files}, refs


def inputs() -> tuple[list[np.ndarray], list[int]]:
    """Signals at 22.05, 11.025, 44.1, 16 and 48 kHz of many lengths, among them lengths where the rules part."""
    rng = np.random.default_rng(7)
    xs, rates = [], []
    for sr in (22050, 11025, 44100, 16000, 48000):
        step = sr // math.gcd(sr, 24000)
        for n in [step * k for k in (1, 2, 3, 5, 8, 13, 40, 75)] + rng.integers(100, 2 * sr, 8).tolist():
            xs.append(rng.standard_normal(n).astype(np.float32) * 0.1)
            rates.append(sr)
    return xs, rates


@needs_qwen_tts
def test_resampling_equals_librosa(official):
    results, _ = official
    xs, rates = inputs()
    parted = 0
    for i, (x, sr) in enumerate(zip(xs, rates)):
        ref = results[f"resampled.{i}"]
        parted += rule_parts(len(x), sr)
        ours = resample(x, sr, 24000)
        assert ours.shape == ref.shape, (len(x), sr)
        assert np.array_equal(ours, ref), (len(x), sr)
    assert parted >= 5  # the inputs include lengths the exact rule sizes one sample short


@needs_qwen_tts
@pytest.mark.parametrize("sr", RATES)
def test_icl_clone_of_a_reference_at_another_rate_equals_official(official, sr):
    results, refs = official
    cfg = ModelConfig.from_dir(BASE)
    voice = make_cloned_voice(load_speaker_encoder(BASE), load_codec_encoder(BASE / "speech_tokenizer"), refs[sr],
                              ref_text=REF_TEXT, x_vector_only=False, model_config=cfg)
    assert len(load_audio(refs[sr])) == int(np.ceil(sf.info(refs[sr]).frames * (24000 / sr)))
    assert np.array_equal(voice.ref_codes.numpy(), results[f"ref_code.{sr}"])
    assert np.abs(voice.spk_embedding.numpy() - results[f"spk.{sr}"]).max() <= 1e-4
