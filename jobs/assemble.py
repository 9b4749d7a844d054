"""Audio files: atomic writes, click-free joins, loudness levelling, chapter and book files.

Encoding by format (wav, flac, ogg, mp3, m4b) lives in `jobs.encode`; `write_encoded` makes it
atomic. `assemble_book` writes one file per chapter and one for the whole book.
"""
from __future__ import annotations

import logging
import os
import re
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import soundfile as sf

from jobs.encode import BookMeta, EncodeError, encode, open_encoder, write_chunk

log = logging.getLogger(__name__)

AssemblyError = EncodeError  # a book cannot be written as asked (the message says what to do)


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


def write_encoded(path: str | Path, audio: np.ndarray, sample_rate: int, fmt: str, meta: BookMeta = BookMeta(),
                  title: Optional[str] = None, chapters: Sequence[tuple[str, float, float]] = ()) -> str:
    """`jobs.encode.encode` to `path` atomically (a crash leaves the old file or none); returns the codec."""
    with atomic_path(path) as tmp:
        return encode(tmp, audio, sample_rate, fmt, meta, title, chapters)


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


class BookWriter:
    """Writes a book chapter by chapter: each chapter's file as soon as its pieces are known, and the book
    file as it goes (streamed for the formats libsndfile writes; m4b, written by ffmpeg, at `finish`).

    Files are written atomically: the book goes to a hidden temp file renamed at `finish`; `abort` (or a
    crash) leaves no book file behind. `assemble_book` is this over chapters already in memory."""

    def __init__(self, out_dir: str | Path, sample_rate: int, fmt: str, meta: BookMeta = BookMeta(),
                 settings: JoinSettings = JoinSettings()):
        self.out_dir, self.sample_rate, self.fmt, self.meta, self.settings = Path(out_dir), sample_rate, fmt, meta, settings
        self.outs: list[ChapterOut] = []
        self.codec = ""
        self.samples = 0
        self._held: list[np.ndarray] = []  # m4b: the whole book is encoded at the end
        self._file = None
        self.path = self.out_dir / f"{safe_name(meta.title or 'book')}.{fmt}"
        self._tmp = self.out_dir / f".{self.path.stem}.{uuid.uuid4().hex[:8]}.tmp{self.path.suffix}"

    @property
    def streamed(self) -> bool:
        return self.fmt != "m4b"

    def chapter(self, number: int, title: str, pieces: Sequence[tuple[Optional[np.ndarray], int]]) -> tuple:
        """Join chapter `number`'s (audio or None, pause_after_ms) pieces and write its file; returns what
        `append` takes. Independent of other chapters: chapters may be prepared on several threads."""
        audio, spans = join(pieces, self.sample_rate, self.settings)
        path, codec = None, ""
        if audio.size:
            path = self.out_dir / "chapters" / f"{number:02d} - {safe_name(title)}.{self.fmt}"
            codec = write_encoded(path, audio, self.sample_rate, self.fmt, self.meta, title=title)
        return title, path, audio, spans, codec

    def append(self, title: str, path: Optional[Path], audio: np.ndarray, spans: list, codec: str) -> ChapterOut:
        """Add a prepared chapter to the book (in chapter order)."""
        start = self.samples / self.sample_rate
        if audio.size:
            self.codec = codec
            self._append(audio)
        out = ChapterOut(title, path, start, start + audio.size / self.sample_rate, spans)
        self.outs.append(out)
        return out

    def add_chapter(self, title: str, pieces: Sequence[tuple[Optional[np.ndarray], int]]) -> ChapterOut:
        """`chapter` then `append`: the next chapter, written and added to the book."""
        return self.append(*self.chapter(len(self.outs) + 1, title, pieces))

    def _append(self, audio: np.ndarray) -> None:
        self.samples += audio.size
        if not self.streamed:
            self._held.append(audio)
            return
        if self._file is None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._file = open_encoder(self._tmp, self.sample_rate, self.fmt, self.meta)
        write_chunk(self._file, audio)

    def finish(self) -> tuple[Path, list[ChapterOut], str]:
        """Close the book file and put it in place -> (book path, chapter outputs, codec)."""
        if not self.samples:
            self.abort()
            raise AssemblyError("no audio to assemble: every segment failed (see `tts-appliance logs JOB`)")
        marks = [(c.title, c.start_s, c.end_s) for c in self.outs if c.end_s > c.start_s]
        if self.streamed:
            self._file.close()
            self._file = None
            with open(self._tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(self._tmp, self.path)
            fsync_dir(self.out_dir)
        else:
            self.codec = write_encoded(self.path, np.concatenate(self._held), self.sample_rate, self.fmt, self.meta,
                                       chapters=marks)
            self._held = []
        log.info("wrote %s (%.1f s, %d chapters, %s)", self.path, self.samples / self.sample_rate, len(self.outs),
                 self.codec)
        return self.path, self.outs, self.codec

    def abort(self) -> None:
        """Drop the unfinished book file (chapter files already written stay)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tmp.exists():
            self._tmp.unlink()


def assemble_book(out_dir: str | Path, chapters: Sequence[tuple[str, Sequence[tuple[Optional[np.ndarray], int]]]],
                  sample_rate: int, fmt: str, meta: BookMeta = BookMeta(),
                  settings: JoinSettings = JoinSettings()) -> tuple[Path, list[ChapterOut], str]:
    """Write `chapters/NN - Title.<fmt>` per chapter and `<title>.<fmt>` for the book into `out_dir`.

    `chapters` is [(title, [(segment audio or None, pause_after_ms), ...]), ...].
    Returns (book path, chapter outputs with timings, codec).
    """
    writer = BookWriter(out_dir, sample_rate, fmt, meta, settings)
    try:
        for title, pieces in chapters:
            writer.add_chapter(title, pieces)
        return writer.finish()
    except BaseException:
        writer.abort()
        raise
