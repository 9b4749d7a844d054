"""Audio encoding by format: the one home for files (chapters, books) and bytes (HTTP responses).

    encode(target, audio, sample_rate, fmt, meta=BookMeta(), title=None, chapters=()) -> codec name
        target: a path, or a binary file object (every format but m4b)
    encode_bytes(audio, sample_rate, fmt) -> bytes      also "pcm": raw signed 16-bit little-endian
    pcm16(audio) -> s16le bytes; wav_header(sample_rate, data_bytes) -> a 44-byte WAV header

wav, flac: 16-bit, the very samples `pcm16` gives (libsndfile would round differently). ogg: Opus
when this libsndfile writes it at the rate, else Vorbis; opus: Ogg Opus. mp3: when this libsndfile
can write MP3. m4b (files only): AAC with chapter marks, title/author/cover, through ffmpeg.
Writes are not atomic: durable files go through `jobs.assemble.write_encoded`.
"""
from __future__ import annotations

import io
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import soundfile as sf

# libsndfile (major format, subtype) per format; ogg's subtype depends on the machine (ogg_codec)
SOUNDFILE = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"),
             "opus": ("OGG", "OPUS"), "ogg": ("OGG", None)}
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
FFMPEG_MISSING = "ffmpeg not found: install it (apt install ffmpeg) or choose flac/mp3"


class EncodeError(Exception):
    """Audio cannot be written as asked (the message says what to install or choose)."""


@dataclass
class BookMeta:
    title: Optional[str] = None
    author: Optional[str] = None
    cover: Optional[bytes] = None
    cover_mime: Optional[str] = None


def pcm16(chunk: np.ndarray) -> bytes:
    """float32 [-1, 1] -> s16le bytes."""
    a = np.clip(np.asarray(chunk, dtype=np.float32), -1.0, 1.0)
    return (a * 32767.0).round().astype("<i2").tobytes()


def wav_header(sample_rate: int, data_bytes: int = 0xFFFFFFFF) -> bytes:
    """44-byte header of a 16-bit mono WAV; the default sizes mean "length unknown" (streaming)."""
    riff = 0xFFFFFFFF if data_bytes == 0xFFFFFFFF else 36 + data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate,
            sample_rate * 2, 2, 16) + b"data" + struct.pack("<I", data_bytes))


def ogg_codec(sample_rate: int) -> str:
    """'OPUS' when this libsndfile writes Opus at this rate, else 'VORBIS'."""
    return "OPUS" if "OPUS" in sf.available_subtypes("OGG") and sample_rate in OPUS_RATES else "VORBIS"


def soundfile_format(fmt: str, sample_rate: int) -> tuple[str, str]:
    """libsndfile's (major format, subtype) for `fmt`; EncodeError when this machine cannot write it."""
    if fmt not in SOUNDFILE:
        raise EncodeError(f"unknown format {fmt!r}: choose one of {', '.join([*SOUNDFILE, 'm4b'])}")
    if fmt == "mp3" and "MP3" not in sf.available_formats():
        raise EncodeError(f"this libsndfile ({sf.__libsndfile_version__}) cannot write MP3: upgrade "
                          "soundfile (pip install -U soundfile, libsndfile >= 1.1) or choose flac/ogg/m4b")
    major, subtype = SOUNDFILE[fmt]
    return major, subtype or ogg_codec(sample_rate)


def _open_soundfile(target, sr: int, fmt: str, tags: dict) -> sf.SoundFile:
    major, subtype = soundfile_format(fmt, sr)
    f = sf.SoundFile(str(target) if isinstance(target, (str, Path)) else target, "w", samplerate=sr, channels=1,
                     format=major, subtype=subtype)
    for attr, value in tags.items():
        if value:
            try:
                setattr(f, attr, value)
            except Exception:  # some containers take no tags; the audio matters more
                pass
    return f


def write_chunk(f: sf.SoundFile, audio: np.ndarray) -> None:
    """Append audio to an encoder from `open_encoder` (16-bit formats get the same rounding as `pcm16`)."""
    f.write(np.frombuffer(pcm16(audio), "<i2") if f.subtype == "PCM_16" else np.asarray(audio, dtype=np.float32))


def _soundfile(target, audio: np.ndarray, sr: int, fmt: str, tags: dict) -> str:
    with _open_soundfile(target, sr, fmt, tags) as f:
        write_chunk(f, audio)
        return f.subtype


def open_encoder(target, sample_rate: int, fmt: str, meta: BookMeta = BookMeta()) -> sf.SoundFile:
    """An open file to append a book's audio to chunk by chunk (`write_chunk`; close it at the end): the
    formats libsndfile writes (wav, flac, ogg, mp3), tagged as `encode` tags a book."""
    if fmt == "m4b":
        raise EncodeError("m4b is written whole by ffmpeg, not chunk by chunk")
    return _open_soundfile(target, sample_rate, fmt, {"title": meta.title, "artist": meta.author, "album": meta.title})


def _ffmeta_escape(text: str) -> str:
    return re.sub(r"([=;#\\\n])", r"\\\1", text)


def _ffmeta(meta: BookMeta, chapters: Sequence[tuple[str, float, float]]) -> str:
    lines = [";FFMETADATA1"]
    if meta.title:
        lines += [f"title={_ffmeta_escape(meta.title)}", f"album={_ffmeta_escape(meta.title)}"]
    if meta.author:
        lines += [f"artist={_ffmeta_escape(meta.author)}", f"album_artist={_ffmeta_escape(meta.author)}"]
    lines.append("genre=Audiobook")
    for title, start, end in chapters:
        lines += ["[CHAPTER]", "TIMEBASE=1/1000", f"START={int(start * 1000)}", f"END={int(end * 1000)}",
                  f"title={_ffmeta_escape(title)}"]
    return "\n".join(lines) + "\n"


def _m4b(path: Path, audio: np.ndarray, sr: int, meta: BookMeta, chapters: Sequence[tuple[str, float, float]]) -> str:
    ffmpeg = shutil.which("ffmpeg")
    if not ffmpeg:
        raise EncodeError(FFMPEG_MISSING)
    with tempfile.TemporaryDirectory(prefix="tts-m4b-") as td:
        wav, txt = Path(td) / "in.wav", Path(td) / "meta.txt"
        _soundfile(wav, audio, sr, "wav", {})
        txt.write_text(_ffmeta(meta, chapters), encoding="utf-8")
        cmd = [ffmpeg, "-nostdin", "-y", "-v", "error", "-i", str(wav), "-i", str(txt)]
        maps = ["-map", "0:a", "-map_metadata", "1", "-map_chapters", "1"]
        if meta.cover:
            cover = Path(td) / ("cover.png" if (meta.cover_mime or "").endswith("png") else "cover.jpg")
            cover.write_bytes(meta.cover)
            cmd += ["-i", str(cover)]
            maps += ["-map", "2:v", "-c:v", "copy", "-disposition:v:0", "attached_pic"]
        proc = subprocess.run(cmd + maps + ["-c:a", "aac", "-b:a", "64k", "-f", "ipod", str(path)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise EncodeError(f"ffmpeg failed writing {path.name}: {proc.stderr.strip()[-500:]}")
    return "AAC"


def encode(target, audio: np.ndarray, sample_rate: int, fmt: str, meta: BookMeta = BookMeta(),
           title: Optional[str] = None, chapters: Sequence[tuple[str, float, float]] = ()) -> str:
    """Write `audio` to `target` (a path or a binary file object) as `fmt`; returns the codec used
    (e.g. 'OPUS'). Tags: title (`title` or the book's), artist and album from `meta`."""
    if fmt == "m4b":
        marks = chapters or [(title or meta.title or "Chapter 1", 0.0, audio.size / sample_rate)]
        return _m4b(Path(target), audio, sample_rate, meta, marks)
    tags = {"title": title or meta.title, "artist": meta.author, "album": meta.title}
    return _soundfile(target, audio, sample_rate, fmt, tags)


def encode_bytes(audio: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """A whole file in `fmt` as bytes ("pcm": raw s16le samples)."""
    if fmt == "pcm":
        return pcm16(audio)
    buf = io.BytesIO()
    encode(buf, audio, sample_rate, fmt)
    return buf.getvalue()
