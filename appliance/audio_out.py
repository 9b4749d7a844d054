"""Encoding synthesized audio for HTTP responses (OpenAI `response_format` values), whole files.

pcm   raw signed 16-bit little-endian mono at the engine rate (24 kHz)
wav   RIFF/WAVE 16-bit with exact sizes (`wav_header()` without a size: "unknown length", for streams)
flac, mp3, opus (Ogg)  encoded with libsndfile once the audio is complete
Streamed responses are encoded chunk by chunk by `appliance.audio_stream.StreamEncoder`.
"""
from __future__ import annotations

import io
import struct

import numpy as np

FORMATS = {"pcm": "audio/pcm", "wav": "audio/wav", "flac": "audio/flac", "mp3": "audio/mpeg", "opus": "audio/ogg"}
_SF = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS"), "wav": ("WAV", "PCM_16")}


def pcm16(chunk: np.ndarray) -> bytes:
    """float32 [-1, 1] -> s16le bytes."""
    a = np.clip(np.asarray(chunk, dtype=np.float32), -1.0, 1.0)
    return (a * 32767.0).round().astype("<i2").tobytes()


def wav_header(sample_rate: int, data_bytes: int = 0xFFFFFFFF) -> bytes:
    """44-byte header of a 16-bit mono WAV; the default sizes mean "length unknown" (streaming)."""
    riff = 0xFFFFFFFF if data_bytes == 0xFFFFFFFF else 36 + data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate,
            sample_rate * 2, 2, 16) + b"data" + struct.pack("<I", data_bytes))


def encode(audio: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """Whole-file encoding in `fmt`."""
    if fmt == "pcm":
        return pcm16(audio)
    import soundfile as sf

    major, sub = _SF[fmt]
    buf = io.BytesIO()
    lossless = sub == "PCM_16"  # the very samples pcm sends (libsndfile would round differently)
    sf.write(buf, np.frombuffer(pcm16(audio), "<i2") if lossless else np.asarray(audio, dtype=np.float32),
             sample_rate, format=major, subtype=sub)
    return buf.getvalue()
