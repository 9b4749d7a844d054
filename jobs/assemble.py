"""Audio files: atomic writes, click-free joins, loudness levelling and encoding.

Formats: wav and flac (16-bit), ogg (Opus when this libsndfile can write it, else Vorbis), mp3
(when this libsndfile can write MP3), m4b (AAC with chapter marks, title/author/cover, through
ffmpeg). `assemble_book` writes one file per chapter and one for the whole book.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import soundfile as sf

log = logging.getLogger(__name__)

OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
FFMPEG_MISSING = "ffmpeg not found: install it (apt install ffmpeg) or choose flac/mp3"


class AssemblyError(Exception):
    """Audio cannot be written as asked (message says what to do)."""


# -- durable files -----------------------------------------------------------------------------
def fsync_dir(path: Path) -> None:
    """Flush a directory entry (after a rename) to disk; a no-op where unsupported."""
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(final: str | Path):
    """Yield a temp path in the same folder; on success fsync it, rename over `final`, fsync the folder.

    The temp name starts with a dot and keeps the final suffix (tools that look at it still work).
    On error the temp file is removed and `final` is untouched.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.stem}.{uuid.uuid4().hex[:8]}.tmp{final.suffix}"
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
        fsync_dir(final.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_bytes_atomic(final: str | Path, data: bytes) -> None:
    with atomic_path(final) as tmp:
        Path(tmp).write_bytes(data)


def write_segment_audio(path: str | Path, audio: np.ndarray, sample_rate: int) -> None:
    """Store one segment's audio durably as float32 WAV."""
    with atomic_path(path) as tmp:
        sf.write(str(tmp), np.asarray(audio, dtype=np.float32), sample_rate, format="WAV", subtype="FLOAT")


def read_audio(path: str | Path) -> tuple[np.ndarray, int]:
    data, sr = sf.read(str(path), dtype="float32", always_2d=False)
    if data.ndim > 1:
        data = data.mean(axis=1)
    return data.astype(np.float32), sr


# -- joining -----------------------------------------------------------------------------------
@dataclass
class JoinSettings:
    """How segments are joined: edge fades, loudness target, peak limiter threshold."""

    fade_ms: float = 8.0
    target_rms_db: float = -20.0
    max_gain_db: float = 20.0
    limit: float = 0.89  # peaks above this are softly limited (never above 1.0)


def rms_db(audio: np.ndarray, gate_db: float = -50.0) -> float:
    """RMS in dBFS over the 20 ms frames louder than `gate_db` (pauses do not pull it down)."""
    a = np.asarray(audio, dtype=np.float64)
    if a.size == 0:
        return -120.0
    flen = 480
    n = a.size // flen
    frames = a[: n * flen].reshape(n, flen) if n else a[None]
    power = (frames ** 2).mean(axis=1)
    loud = power[power > 10 ** (gate_db / 10)]
    p = loud.mean() if loud.size else power.mean()
    return float(10 * np.log10(max(p, 1e-12)))


def level(audio: np.ndarray, settings: JoinSettings) -> np.ndarray:
    """Gain a segment toward the target RMS (gain capped at +/- max_gain_db)."""
    gain_db = np.clip(settings.target_rms_db - rms_db(audio), -settings.max_gain_db, settings.max_gain_db)
    return (audio * 10 ** (gain_db / 20)).astype(np.float32)


def fade_edges(audio: np.ndarray, sample_rate: int, fade_ms: float) -> np.ndarray:
    """Raised-cosine fade-in and fade-out so every segment starts and ends at zero."""
    a = np.array(audio, dtype=np.float32, copy=True)
    n = min(int(sample_rate * fade_ms / 1000), a.size // 2)
    if n > 0:
        ramp = (0.5 - 0.5 * np.cos(np.linspace(0, np.pi, n + 1)[1:])).astype(np.float32)
        ramp[-1] = 1.0
        a[:n] *= ramp
        a[-n:] *= ramp[::-1]
        a[0] = a[-1] = 0.0
    return a


def limit_peaks(audio: np.ndarray, threshold: float) -> np.ndarray:
    """Soft limiter: unchanged below `threshold`, smoothly compressed above, never reaching 1.0."""
    a = np.asarray(audio, dtype=np.float32)
    mag = np.abs(a)
    over = mag > threshold
    if not over.any():
        return a
    head = 1.0 - threshold
    out = a.copy()
    out[over] = np.sign(a[over]) * (threshold + head * np.tanh((mag[over] - threshold) / head)) * 0.999
    return out


def join(pieces: Sequence[tuple[Optional[np.ndarray], int]], sample_rate: int,
         settings: JoinSettings = JoinSettings()) -> tuple[np.ndarray, list[Optional[tuple[float, float]]]]:
    """Join (audio, pause_after_ms) pieces; a None audio (failed segment) is skipped.

    Returns the joined audio and each piece's (start_s, end_s) within it (None for skipped).
    """
    parts, spans, pos = [], [], 0
    for audio, pause_ms in pieces:
        if audio is None:
            spans.append(None)
            continue
        seg = fade_edges(level(audio, settings), sample_rate, settings.fade_ms)
        spans.append((pos / sample_rate, (pos + seg.size) / sample_rate))
        silence = np.zeros(int(round(sample_rate * max(0, pause_ms) / 1000)), dtype=np.float32)
        parts += [seg, silence]
        pos += seg.size + silence.size
    out = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    return limit_peaks(out, settings.limit), spans


# -- encoding ----------------------------------------------------------------------------------
@dataclass
class BookMeta:
    title: Optional[str] = None
    author: Optional[str] = None
    cover: Optional[bytes] = None
    cover_mime: Optional[str] = None


def ogg_codec(sample_rate: int) -> str:
    """'OPUS' when this libsndfile writes Opus at this rate, else 'VORBIS'."""
    return "OPUS" if "OPUS" in sf.available_subtypes("OGG") and sample_rate in OPUS_RATES else "VORBIS"


def _sf_encode(path: Path, audio: np.ndarray, sr: int, fmt: str, meta: BookMeta, title: Optional[str]) -> str:
    if fmt == "mp3" and "MP3" not in sf.available_formats():
        raise AssemblyError(f"this libsndfile ({sf.__libsndfile_version__}) cannot write MP3: upgrade "
                            "soundfile (pip install -U soundfile, libsndfile >= 1.1) or choose flac/ogg/m4b")
    fmt_name, subtype = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"),
                         "ogg": ("OGG", ogg_codec(sr))}[fmt]
    with atomic_path(path) as tmp:
        with sf.SoundFile(str(tmp), "w", samplerate=sr, channels=1, format=fmt_name, subtype=subtype) as f:
            for attr, value in (("title", title or meta.title), ("artist", meta.author), ("album", meta.title)):
                if value:
                    try:
                        setattr(f, attr, value)
                    except Exception:  # some containers take no tags; the audio matters more
                        pass
            f.write(np.asarray(audio, dtype=np.float32))
    return subtype


def _ffmeta_escape(text: str) -> str:
    return re.sub(r"([=;#\\\n])", r"\\\1", text)


def _m4b_encode(path: Path, audio: np.ndarray, sr: int, meta: BookMeta,
                chapters: Sequence[tuple[str, float, float]]) -> str:
    ffmpeg = shutil.which("ffmpeg")
    if not ffmpeg:
        raise AssemblyError(FFMPEG_MISSING)
    with tempfile.TemporaryDirectory(prefix="tts-m4b-") as td:
        wav, txt = Path(td) / "in.wav", Path(td) / "meta.txt"
        sf.write(str(wav), np.asarray(audio, dtype=np.float32), sr, subtype="PCM_16")
        lines = [";FFMETADATA1"]
        if meta.title:
            lines += [f"title={_ffmeta_escape(meta.title)}", f"album={_ffmeta_escape(meta.title)}"]
        if meta.author:
            lines += [f"artist={_ffmeta_escape(meta.author)}", f"album_artist={_ffmeta_escape(meta.author)}"]
        lines.append("genre=Audiobook")
        for title, start, end in chapters:
            lines += ["[CHAPTER]", "TIMEBASE=1/1000", f"START={int(start * 1000)}", f"END={int(end * 1000)}",
                      f"title={_ffmeta_escape(title)}"]
        txt.write_text("\n".join(lines) + "\n", encoding="utf-8")
        cmd = [ffmpeg, "-nostdin", "-y", "-v", "error", "-i", str(wav), "-i", str(txt)]
        maps = ["-map", "0:a", "-map_metadata", "1", "-map_chapters", "1"]
        if meta.cover:
            ext = ".png" if (meta.cover_mime or "").endswith("png") else ".jpg"
            cover = Path(td) / f"cover{ext}"
            cover.write_bytes(meta.cover)
            cmd += ["-i", str(cover)]
            maps += ["-map", "2:v", "-c:v", "copy", "-disposition:v:0", "attached_pic"]
        with atomic_path(path) as tmp:
            proc = subprocess.run(cmd + maps + ["-c:a", "aac", "-b:a", "64k", "-f", "ipod", str(tmp)],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise AssemblyError(f"ffmpeg failed writing {path.name}: {proc.stderr.strip()[-500:]}")
    return "AAC"


def encode(path: str | Path, audio: np.ndarray, sample_rate: int, fmt: str, meta: BookMeta = BookMeta(),
           title: Optional[str] = None, chapters: Sequence[tuple[str, float, float]] = ()) -> str:
    """Write `audio` to `path` atomically as `fmt`; returns the codec used (e.g. 'OPUS')."""
    path = Path(path)
    if fmt == "m4b":
        marks = chapters or [(title or meta.title or "Chapter 1", 0.0, audio.size / sample_rate)]
        return _m4b_encode(path, audio, sample_rate, meta, marks)
    if fmt not in ("wav", "flac", "ogg", "mp3"):
        raise AssemblyError(f"unknown format {fmt!r}: choose wav, flac, ogg, mp3 or m4b")
    return _sf_encode(path, audio, sample_rate, fmt, meta, title)


# -- whole book --------------------------------------------------------------------------------
@dataclass
class ChapterOut:
    title: str
    path: Optional[Path]
    start_s: float  # in the book file
    end_s: float
    spans: list = field(default_factory=list)  # per segment (start_s, end_s) in the chapter file, or None


def safe_name(text: str, limit: int = 60) -> str:
    """A file-name-safe version of a title."""
    cleaned = re.sub(r"[^\w\- .,'()]+", "_", text or "").strip(" ._")
    return cleaned[:limit] or "untitled"


def assemble_book(out_dir: str | Path, chapters: Sequence[tuple[str, Sequence[tuple[Optional[np.ndarray], int]]]],
                  sample_rate: int, fmt: str, meta: BookMeta = BookMeta(),
                  settings: JoinSettings = JoinSettings()) -> tuple[Path, list[ChapterOut], str]:
    """Write `chapters/NN - Title.<fmt>` per chapter and `<title>.<fmt>` for the book into `out_dir`.

    `chapters` is [(title, [(segment audio or None, pause_after_ms), ...]), ...].
    Returns (book path, chapter outputs with timings, codec).
    """
    out_dir = Path(out_dir)
    outs, audios, pos = [], [], 0.0
    codec = ""
    for i, (title, pieces) in enumerate(chapters, start=1):
        audio, spans = join(pieces, sample_rate, settings)
        dur = audio.size / sample_rate
        path = None
        if audio.size:
            path = out_dir / "chapters" / f"{i:02d} - {safe_name(title)}.{fmt}"
            codec = encode(path, audio, sample_rate, fmt, meta, title=title)
        outs.append(ChapterOut(title, path, pos, pos + dur, spans))
        audios.append(audio)
        pos += dur
    book = np.concatenate(audios) if audios else np.zeros(0, dtype=np.float32)
    if not book.size:
        raise AssemblyError("no audio to assemble: every segment failed (see `tts-appliance logs JOB`)")
    marks = [(c.title, c.start_s, c.end_s) for c in outs if c.end_s > c.start_s]
    book_path = out_dir / f"{safe_name(meta.title or 'book')}.{fmt}"
    codec = encode(book_path, book, sample_rate, fmt, meta, chapters=marks)
    log.info("wrote %s (%.1f s, %d chapters, %s)", book_path, book.size / sample_rate, len(outs), codec)
    return book_path, outs, codec
