"""Reference-audio loading for voice cloning: decode, mix to mono, resample to 24 kHz.

Mirrors the official package: soundfile decodes as float32, channels are averaged, and the result
is resampled with soxr's high-quality mode and fixed to `resampled_length` samples (what
librosa.resample's default `soxr_hq` does). soxr is a dependency; if it is missing we fall back to
scipy's polyphase resampler, which is close but not sample-identical (a warning is logged).
"""
from __future__ import annotations

import io
import logging
import math
import os
from pathlib import Path
from typing import BinaryIO, Tuple, Union

import numpy as np

from engines.model.errors import BadInput

log = logging.getLogger(__name__)

AudioSource = Union[str, os.PathLike, bytes, bytearray, BinaryIO, Tuple[np.ndarray, int]]

MIN_SECONDS = 0.5  # shorter references cannot give a usable speaker embedding
_HINT = "use a WAV, FLAC or OGG file with at least a few seconds of clear speech"


def _describe(src) -> str:
    if isinstance(src, (str, os.PathLike)):
        return str(src)
    if isinstance(src, (bytes, bytearray)):
        return f"<{len(src)} bytes of uploaded audio>"
    return f"<{type(src).__name__}>"


def _unreadable_container(src) -> str:
    """The name of a container libsndfile cannot read that `src` starts with (WebM, MP4), or ""."""
    try:
        if isinstance(src, (bytes, bytearray)):
            head = bytes(src[:12])
        elif isinstance(src, (str, os.PathLike)):
            with open(src, "rb") as f:
                head = f.read(12)
        else:
            return ""
    except OSError:
        return ""
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "WebM/Matroska"
    return "MP4/M4A" if head[4:8] == b"ftyp" else ""


def read_audio(src: AudioSource) -> tuple[np.ndarray, int]:
    """Decode `src` to (mono float32 samples [S], sample rate) without resampling."""
    import soundfile as sf

    name = _describe(src)
    if isinstance(src, tuple):
        audio, sr = np.asarray(src[0], dtype=np.float32), int(src[1])
    else:
        if isinstance(src, (str, os.PathLike)) and not Path(src).is_file():
            raise BadInput(f"reference audio file not found: {name}; check the path")
        data = io.BytesIO(bytes(src)) if isinstance(src, (bytes, bytearray)) else src
        if isinstance(data, (bytes, bytearray, io.BytesIO)) and len(data.getbuffer()) == 0:
            raise BadInput(f"reference audio {name} is empty; {_HINT}")
        try:
            audio, sr = sf.read(data, dtype="float32", always_2d=False)
        except Exception as exc:  # soundfile raises LibsndfileError, RuntimeError, TypeError...
            kind = _unreadable_container(src)
            if kind:
                raise BadInput(f"cannot decode reference audio {name}: it is {kind} (what browsers record), which "
                               f"this server does not read; convert it to WAV, FLAC or OGG first (e.g. "
                               f"`ffmpeg -i in.webm out.wav`)") from exc
            raise BadInput(f"cannot decode reference audio {name} ({exc}); {_HINT}") from exc
    if audio.ndim > 1:
        audio = np.mean(audio, axis=-1)  # [S, C] -> [S], as the official loaders do
    return np.ascontiguousarray(audio, dtype=np.float32), sr


def resampled_length(n: int, orig_sr: int, target_sr: int) -> int:
    """Samples of `n` resampled from `orig_sr` to `target_sr`, as librosa.resample (the official package's
    resampler) sizes its output: ceil(n * ratio) with the ratio rounded to a float first. The exact
    ceil(n * target / orig) is one sample shorter for about 0.5% of lengths at 22.05, 11.025 and 44.1 kHz
    (where n * ratio lands a hair above a whole number), which changes a reference's last codec frame."""
    ratio = float(target_sr) / orig_sr
    return int(math.ceil(n * ratio))


def resample(audio: np.ndarray, orig_sr: int, target_sr: int) -> np.ndarray:
    """Resample mono float32 audio like librosa.resample(res_type='soxr_hq', fix=True)."""
    if orig_sr == target_sr:
        return audio
    n_out = resampled_length(audio.shape[-1], orig_sr, target_sr)
    try:
        import soxr

        out = soxr.resample(audio, orig_sr, target_sr, quality="soxr_hq")
    except ImportError:
        from scipy.signal import resample_poly

        log.warning("soxr is not installed: resampling with scipy (not sample-identical to the official)")
        g = math.gcd(int(orig_sr), int(target_sr))
        out = resample_poly(audio, int(target_sr) // g, int(orig_sr) // g)
    out = out[:n_out] if out.shape[-1] >= n_out else np.pad(out, (0, n_out - out.shape[-1]))
    return np.asarray(out, dtype=audio.dtype)


def load_audio(src: AudioSource, target_sr: int = 24000, min_seconds: float = MIN_SECONDS) -> np.ndarray:
    """Mono float32 samples [S] at `target_sr` from a path, encoded bytes, a file object or (array, sr).

    Raises BadInput, naming the source, for a missing, empty, undecodable, non-finite or too short clip.
    """
    audio, sr = read_audio(src)
    name = _describe(src)
    if sr <= 0:
        raise BadInput(f"reference audio {name} has an invalid sample rate {sr}; {_HINT}")
    if audio.size == 0:
        raise BadInput(f"reference audio {name} contains no samples; {_HINT}")
    if not np.all(np.isfinite(audio)):
        raise BadInput(f"reference audio {name} contains NaN or infinite samples; re-export it")
    if audio.shape[0] < min_seconds * sr:
        raise BadInput(f"reference audio {name} is too short ({audio.shape[0] / sr:.2f} s, "
                       f"need at least {min_seconds:g} s); {_HINT}")
    peak = float(np.abs(audio).max())
    if peak == 0.0:
        raise BadInput(f"reference audio {name} is pure silence; {_HINT}")
    if peak > 1.0:
        log.warning("reference audio %s exceeds [-1, 1] (peak %.3f); using it unchanged", name, peak)
    return resample(audio, sr, target_sr)


def write_wav(path, audio: np.ndarray, sample_rate: int) -> None:
    """Write mono float audio as 16-bit PCM WAV (written to a temp name, then renamed into place)."""
    import soundfile as sf

    path = str(path)
    tmp = f"{path}.part"
    sf.write(tmp, np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0), sample_rate, subtype="PCM_16", format="WAV")
    os.replace(tmp, path)
