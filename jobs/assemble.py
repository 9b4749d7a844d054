"""Audio files: atomic writes, click-free joins, loudness levelling, chapter and book files.

Encoding by format (wav, flac, opus, mp3, m4b) lives in `audio.encode` (with the chapter marks of m4b and mp3),
those of flac and opus in `jobs.chapter_tags`; `StreamedFile` writes it block by
block and atomically. `assemble_book` writes one file per chapter and one for the whole book. Memory
does not grow with the book: segments are read, joined and encoded one at a time (`join_blocks`), and
a chapter reaches the book file through an unnamed spool file on disk; a FLAC book is made of its chapters'
files' frames instead, without encoding the audio again (`audio.flac_splice`).
"""
from __future__ import annotations

import io
import logging
import os
import re
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable, Iterator, Optional, Sequence

import numpy as np
import soundfile as sf

from jobs.chapter_tags import write_chapter_tags
from jobs.disk import DiskFull, no_space
from jobs.tempnames import temp_path
from audio.encode import BookMeta, EncodeError, file_tags, open_encoder
from audio.flac_splice import FlacSpliceFile

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

    The temp name starts with a dot, keeps the final suffix (tools that look at it still work) and names
    its writer (jobs.tempnames: what a killed writer leaves is found and removed by jobs.leftovers).
    On error the temp file is removed and `final` is untouched.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(final)
    try:
        yield tmp
        put_in_place(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()


def put_in_place(tmp: Path, final: Path) -> None:
    """fsync `tmp`, rename it over `final`, fsync the folder."""
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fsync_dir(final.parent)


def write_bytes_atomic(final: str | Path, data: bytes) -> None:
    with atomic_path(final) as tmp:
        Path(tmp).write_bytes(data)


SEGMENT_SUFFIX = ".flac"  # segment audio: FLAC of 24-bit samples (the codec's output is within [-1, 1])


def encode_segment(audio: np.ndarray, sample_rate: int) -> bytes:
    """One segment's audio as FLAC, 24-bit: lossless to 2**-23 (the model's float32 samples, rounded), about
    half a float32 WAV; read back by `read_audio` as float32."""
    buf = io.BytesIO()
    sf.write(buf, np.clip(np.asarray(audio, dtype=np.float32).reshape(-1), -1.0, 1.0), sample_rate, format="FLAC",
             subtype="PCM_24")
    return buf.getvalue()


def write_segment_audio(path: str | Path, audio: np.ndarray, sample_rate: int) -> int:
    """Store one segment's audio durably (`encode_segment`, then an atomic write: a full disk raises OSError
    ENOSPC, not libsndfile's "System error."); returns the bytes written."""
    data = encode_segment(audio, sample_rate)
    write_bytes_atomic(path, data)
    return len(data)


def read_audio(path: str | Path) -> tuple[np.ndarray, int]:
    data, sr = sf.read(str(path), dtype="float32", always_2d=False)
    if data.ndim > 1:
        data = data.mean(axis=1)
    return data.astype(np.float32, copy=False), sr


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


Pieces = Iterable[tuple[Optional[np.ndarray], int]]  # (segment audio or None: failed, pause_after_ms)


def join_blocks(pieces: Pieces, sample_rate: int, settings: JoinSettings = JoinSettings()
                ) -> Iterator[tuple[np.ndarray, Optional[tuple[float, float]]]]:
    """`join` one piece at a time: yields (the piece levelled, faded and limited, then its pause;
    the piece's (start_s, end_s) in the joined audio) per piece; a None audio is skipped (an empty
    block, span None). `pieces` is consumed lazily: one segment's audio is in memory at a time."""
    pos = 0
    for audio, pause_ms in pieces:
        if audio is None:
            yield np.zeros(0, dtype=np.float32), None
            continue
        seg = limit_peaks(fade_edges(level(audio, settings), sample_rate, settings.fade_ms), settings.limit)
        silence = np.zeros(int(round(sample_rate * max(0, pause_ms) / 1000)), dtype=np.float32)
        yield np.concatenate([seg, silence]), (pos / sample_rate, (pos + seg.size) / sample_rate)
        pos += seg.size + silence.size


def join(pieces: Pieces, sample_rate: int,
         settings: JoinSettings = JoinSettings()) -> tuple[np.ndarray, list[Optional[tuple[float, float]]]]:
    """Join (audio, pause_after_ms) pieces in memory; a None audio (failed segment) is skipped.

    Returns the joined audio and each piece's (start_s, end_s) within it (None for skipped)."""
    blocks = list(join_blocks(pieces, sample_rate, settings))
    out = np.concatenate([b for b, _ in blocks]) if blocks else np.zeros(0, dtype=np.float32)
    return out, [span for _, span in blocks]


class StreamedFile:
    """An encoded audio file (`audio.encode` formats) written block by block and put in place by `close`:
    until then it is a hidden temp file beside `path`, which `abort` (or a crash) leaves behind at
    worst, never a half file under `path`. A file that got no audio is not created."""

    def __init__(self, path: str | Path, sample_rate: int, fmt: str, meta: BookMeta = BookMeta(),
                 title: Optional[str] = None):
        self.path, self.sample_rate, self.fmt, self.meta, self.title = Path(path), sample_rate, fmt, meta, title
        self.tmp = temp_path(self.path)
        self._enc = None

    def write(self, audio: np.ndarray) -> None:
        if not audio.size:
            return
        with self._full_disk():
            if self._enc is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._enc = open_encoder(self.tmp, self.sample_rate, self.fmt, self.meta, self.title)
            self._enc.write(audio)

    def append_flac(self, path: str | Path) -> int:
        """A FLAC file's frames added as they are (a FLAC book from its chapters' files, `audio.flac_splice`)
        -> the samples added. A file is written either this way or with `write`, not both."""
        with self._full_disk():
            if self._enc is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._enc = FlacSpliceFile(self.tmp, self.sample_rate, file_tags(self.meta, self.title))
            return self._enc.append(path)

    @contextmanager
    def _full_disk(self):
        """An encoder's error on a full disk as DiskFull (libsndfile says only "System error.": jobs.disk.no_space
        looks at the free space of the folder before the temp file is removed)."""
        try:
            yield
        except DiskFull:
            raise
        except Exception as exc:
            if no_space(exc, self.path.parent):
                raise DiskFull(self.path.parent, 0, f"writing {self.path.name}", exc) from exc
            raise

    def close(self, chapters: Sequence[tuple[str, float, float]] = ()) -> str:
        """Finish the file with these chapter marks (m4b: by ffmpeg; mp3: its ID3v2 tag, `audio.id3`; flac,
        opus: comments written by `jobs.chapter_tags`) and rename it into place -> the codec ("" when no
        audio came: no file)."""
        if self._enc is None:
            return ""
        enc, self._enc = self._enc, None
        try:
            with self._full_disk():
                codec = enc.close(chapters)
                write_chapter_tags(self.tmp, self.fmt, chapters)
                put_in_place(self.tmp, self.path)
            return codec
        finally:
            self.tmp.unlink(missing_ok=True)

    def abort(self) -> None:
        """Drop the unfinished file."""
        if self._enc is not None:
            enc, self._enc = self._enc, None
            enc.abort()
        self.tmp.unlink(missing_ok=True)


# -- whole book --------------------------------------------------------------------------------
SPOOL_BLOCK = 1 << 20  # samples per read when a chapter's spooled audio is copied into the book


@dataclass
class Chapter:
    """A chapter joined and written (`BookWriter.chapter`), waiting to be added to the book: its audio
    is in `spool` (float32, an unnamed file the book writer reads back and closes; None for a FLAC book, which
    takes the chapter file's frames)."""

    title: str
    path: Optional[Path]  # its own file (None: no audio)
    spool: Optional[IO[bytes]]
    samples: int
    spans: list  # per segment (start_s, end_s) in the chapter file, or None
    codec: str


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
    file as it goes, one block at a time (m4b: spooled, encoded by ffmpeg at `finish`; flac: the chapter files'
    frames, `audio.flac_splice`, so the book is not encoded a second time).

    Files are written atomically: the book goes to a hidden temp file renamed at `finish`; `abort` (or a
    crash) leaves no book file behind. Memory does not depend on the book's length: a chapter is read,
    joined and encoded segment by segment, and reaches the book through a spool file on disk (flac: its file).
    `assemble_book` is this over chapters already in memory."""

    def __init__(self, out_dir: str | Path, sample_rate: int, fmt: str, meta: BookMeta = BookMeta(),
                 settings: JoinSettings = JoinSettings()):
        self.out_dir, self.sample_rate, self.fmt, self.meta, self.settings = Path(out_dir), sample_rate, fmt, meta, settings
        self.outs: list[ChapterOut] = []
        self.codec = ""
        self.samples = 0
        self.path = self.out_dir / f"{safe_name(meta.title or 'book')}.{fmt}"
        self.splice = fmt == "flac"  # the book from its chapters' frames (StreamedFile.append_flac), not encoded again
        self._book = StreamedFile(self.path, sample_rate, fmt, meta)

    def chapter(self, number: int, title: str, pieces: Pieces) -> Chapter:
        """Join chapter `number`'s (audio or None, pause_after_ms) pieces (read lazily, one at a time) and
        write its file; returns what `append` takes. Independent of other chapters: chapters may be
        prepared on several threads. A FLAC book's chapter ends on a whole number of 16 samples (at most
        0.6 ms of silence more): only the book's last frame may hold fewer than 16 samples."""
        path = self.out_dir / "chapters" / f"{number:02d} - {safe_name(title)}.{self.fmt}"
        out = StreamedFile(path, self.sample_rate, self.fmt, self.meta, title=title)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        spool = None if self.splice else tempfile.TemporaryFile(dir=self.out_dir)
        spans, samples = [], 0
        try:
            for block, span in join_blocks(pieces, self.sample_rate, self.settings):
                spans.append(span)
                out.write(block)
                if spool is not None:
                    spool.write(block.astype(np.float32, copy=False).tobytes())
                samples += block.size
            if self.splice and samples % 16:
                out.write(np.zeros(16 - samples % 16, dtype=np.float32))
                samples += 16 - samples % 16
            codec = out.close()
        except BaseException:
            out.abort()
            if spool is not None:
                spool.close()
            raise
        return Chapter(title, path if samples else None, spool, samples, spans, codec)

    def append(self, chapter: Chapter) -> ChapterOut:
        """Add a prepared chapter to the book (in chapter order): its spool read block by block and closed, or
        (a FLAC book) its file's frames."""
        start = self.samples / self.sample_rate
        if chapter.spool is None:
            if chapter.path is not None and self._book.append_flac(chapter.path) != chapter.samples:
                raise AssemblyError(f"{chapter.path.name}: its file does not hold the chapter's "
                                    f"{chapter.samples} samples")
        else:
            try:
                chapter.spool.seek(0)
                while data := chapter.spool.read(SPOOL_BLOCK * 4):
                    self._book.write(np.frombuffer(data, dtype=np.float32))
            finally:
                chapter.spool.close()
        self.samples += chapter.samples
        out = ChapterOut(chapter.title, chapter.path, start, start + chapter.samples / self.sample_rate, chapter.spans)
        self.outs.append(out)
        return out

    def add_chapter(self, title: str, pieces: Pieces) -> ChapterOut:
        """`chapter` then `append`: the next chapter, written and added to the book."""
        return self.append(self.chapter(len(self.outs) + 1, title, pieces))

    def finish(self) -> tuple[Path, list[ChapterOut], str]:
        """Close the book file and put it in place -> (book path, chapter outputs, codec)."""
        if not self.samples:
            self.abort()
            raise AssemblyError("no audio to assemble: every segment failed (see `tts-appliance logs JOB`)")
        marks = [(c.title, c.start_s, c.end_s) for c in self.outs if c.end_s > c.start_s]
        self.codec = self._book.close(chapters=marks)
        log.info("wrote %s (%.1f s, %d chapters, %s)", self.path, self.samples / self.sample_rate, len(self.outs),
                 self.codec)
        return self.path, self.outs, self.codec

    def abort(self) -> None:
        """Drop the unfinished book file (chapter files already written stay)."""
        self._book.abort()


def assemble_book(out_dir: str | Path, chapters: Sequence[tuple[str, Pieces]],
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
