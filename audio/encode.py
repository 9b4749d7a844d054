"""Audio encoding by format: the one home for files (chapters, books) and bytes (HTTP responses).

    encode(target, audio, sample_rate, fmt, meta=BookMeta(), title=None, chapters=()) -> codec name
        target: a path, or a binary file object (every format but m4b)
    open_encoder(target, sample_rate, fmt, meta, title) -> Encoder: `write(audio)` chunk by chunk, then
        `close(chapters)` -> codec name (or `abort()`); what `encode` does with one chunk
    encode_bytes(audio, sample_rate, fmt) -> bytes      also "pcm": raw signed 16-bit little-endian
    pcm16(audio) -> s16le bytes; wav_header(sample_rate, data_bytes) -> a 44-byte WAV header

wav, flac: 16-bit, the very samples `pcm16` gives (libsndfile would round differently). ogg: Opus
when this libsndfile writes it at the rate, else Vorbis; opus: Ogg Opus. mp3: when this libsndfile
can write MP3; its tags and chapter marks (an ID3v2.4 tag, `audio.id3`) go in front of the audio when
the file is closed, so a file object gets none. m4b (files only): AAC with chapter marks, title/author/cover, through ffmpeg; its audio
is spooled to an unnamed file beside the target as it comes (a book's length costs disk, not memory).
Writes are not atomic: durable files go through `jobs.assemble.StreamedFile`.
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
from typing import Optional, Sequence, Union

import numpy as np
import soundfile as sf

from audio.id3 import write_id3

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


class SoundFileEncoder:
    """The formats libsndfile writes (wav, flac, ogg, opus, mp3), chunk by chunk. An mp3 file's tags are
    not libsndfile's (an ID3v1 tag: Latin-1, 30 bytes a field): `close` writes them, with the chapter marks."""

    def __init__(self, target, sample_rate: int, fmt: str, tags: dict):
        self.id3 = (Path(target), tags) if fmt == "mp3" and isinstance(target, (str, Path)) else None
        self.f = _open_soundfile(target, sample_rate, fmt, {} if fmt == "mp3" else tags)
        self.codec = self.f.subtype

    def write(self, audio: np.ndarray) -> None:
        """Append audio (16-bit formats get the same rounding as `pcm16`)."""
        f = self.f
        f.write(np.frombuffer(pcm16(audio), "<i2") if f.subtype == "PCM_16" else np.asarray(audio, dtype=np.float32))

    def close(self, chapters: Sequence[tuple[str, float, float]] = ()) -> str:
        """Finish the file -> the codec; an mp3 file gets its ID3v2 tag (tags and `chapters`) now."""
        self.f.close()
        if self.id3 is not None:
            write_id3(self.id3[0], self.id3[1], chapters)
        return self.codec

    def abort(self) -> None:
        self.f.close()


def _ffmeta_escape(text: str) -> str:
    return re.sub(r"([=;#\\\n])", r"\\\1", text)


def _ffmeta(meta: BookMeta, chapters: Sequence[tuple[str, float, float]], title: Optional[str] = None) -> str:
    """ffmpeg's metadata file: `title` (a chapter file's own) or the book's as the title, the book's as the album,
    the author, and the chapter marks."""
    lines = [";FFMETADATA1"]
    if title or meta.title:
        lines.append(f"title={_ffmeta_escape(title or meta.title)}")
    if meta.title:
        lines.append(f"album={_ffmeta_escape(meta.title)}")
    if meta.author:
        lines += [f"artist={_ffmeta_escape(meta.author)}", f"album_artist={_ffmeta_escape(meta.author)}"]
    lines.append("genre=Audiobook")
    for title, start, end in chapters:
        lines += ["[CHAPTER]", "TIMEBASE=1/1000", f"START={int(start * 1000)}", f"END={int(end * 1000)}",
                  f"title={_ffmeta_escape(title)}"]
    return "\n".join(lines) + "\n"


class M4bEncoder:
    """AAC in an .m4b with chapter marks and tags, through ffmpeg. The audio goes (16-bit) to an unnamed
    spool file in the target's folder as it comes, and is encoded at `close`, when the chapter marks are
    known; the spool disappears when closed (or when the process dies)."""

    def __init__(self, path: Path, sample_rate: int, meta: BookMeta, title: Optional[str] = None):
        self.ffmpeg = shutil.which("ffmpeg")
        if not self.ffmpeg:
            raise EncodeError(FFMPEG_MISSING)
        self.path, self.sample_rate, self.meta, self.title = Path(path), sample_rate, meta, title
        self.spool = tempfile.TemporaryFile(dir=self.path.parent)
        self.samples = 0

    def write(self, audio: np.ndarray) -> None:
        data = pcm16(audio)
        self.spool.write(data)
        self.samples += len(data) // 2

    def close(self, chapters: Sequence[tuple[str, float, float]] = ()) -> str:
        marks = chapters or [(self.title or self.meta.title or "Chapter 1", 0.0, self.samples / self.sample_rate)]
        try:
            self.spool.flush()
            self.spool.seek(0)
            with tempfile.TemporaryDirectory(prefix="tts-m4b-") as td:
                txt = Path(td) / "meta.txt"
                txt.write_text(_ffmeta(self.meta, marks, self.title), encoding="utf-8")
                cmd = [self.ffmpeg, "-nostdin", "-y", "-v", "error", "-f", "s16le", "-ar", str(self.sample_rate),
                       "-ac", "1", "-i", "pipe:0", "-i", str(txt)]
                maps = ["-map", "0:a", "-map_metadata", "1", "-map_chapters", "1"]
                if self.meta.cover:
                    cover = Path(td) / ("cover.png" if (self.meta.cover_mime or "").endswith("png") else "cover.jpg")
                    cover.write_bytes(self.meta.cover)
                    cmd += ["-i", str(cover)]
                    maps += ["-map", "2:v", "-c:v", "copy", "-disposition:v:0", "attached_pic"]
                proc = subprocess.run(cmd + maps + ["-c:a", "aac", "-b:a", "64k", "-f", "ipod", str(self.path)],
                                      stdin=self.spool, capture_output=True, text=True)
        finally:
            self.spool.close()
        if proc.returncode != 0:
            raise EncodeError(f"ffmpeg failed writing {self.path.name}: {proc.stderr.strip()[-500:]}")
        return "AAC"

    def abort(self) -> None:
        self.spool.close()


Encoder = Union[SoundFileEncoder, M4bEncoder]


def open_encoder(target, sample_rate: int, fmt: str, meta: BookMeta = BookMeta(),
                 title: Optional[str] = None) -> Encoder:
    """An encoder to `write` audio to chunk by chunk, then `close(chapters)` (-> codec) or `abort()`.
    Tags: title (`title` or the book's), artist and album from `meta`; m4b: a path target only."""
    if fmt == "m4b":
        if not isinstance(target, (str, Path)):
            raise EncodeError("m4b is written to files only, not to a stream")
        return M4bEncoder(Path(target), sample_rate, meta, title)
    return SoundFileEncoder(target, sample_rate, fmt, file_tags(meta, title))


def file_tags(meta: BookMeta, title: Optional[str] = None) -> dict:
    """A file's tags: title (`title` or the book's), artist and album from `meta`."""
    return {"title": title or meta.title, "artist": meta.author, "album": meta.title}


def encode(target, audio: np.ndarray, sample_rate: int, fmt: str, meta: BookMeta = BookMeta(),
           title: Optional[str] = None, chapters: Sequence[tuple[str, float, float]] = ()) -> str:
    """Write `audio` to `target` (a path or a binary file object) as `fmt`; returns the codec used
    (e.g. 'OPUS'). Tags as `open_encoder`; m4b: `chapters` marks (default one chapter, the whole audio)."""
    enc = open_encoder(target, sample_rate, fmt, meta, title)
    try:
        enc.write(audio)
    except BaseException:
        enc.abort()
        raise
    return enc.close(chapters)


def encode_bytes(audio: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """A whole file in `fmt` as bytes ("pcm": raw s16le samples)."""
    if fmt == "pcm":
        return pcm16(audio)
    buf = io.BytesIO()
    encode(buf, audio, sample_rate, fmt)
    return buf.getvalue()
