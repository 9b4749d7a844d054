"""Chapter marks in a finished book file, written with mutagen (m4b gets its marks from ffmpeg and mp3 from
its ID3v2 tag, both when audio.encode closes the file).

    write_chapter_tags(path, fmt, [(title, start_s, end_s), ...])

flac, opus Vorbis comments CHAPTER001=HH:MM:SS.mmm and CHAPTER001NAME=title (the chapter-comment
           convention players and taggers share).
Other formats (wav) have no common convention and are left as they are. Tags already in the file (title,
artist, album) are kept.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

FORMATS = ("flac", "opus")  # the formats that take chapter marks here


def write_chapter_tags(path: str | Path, fmt: str, chapters: Sequence[tuple[str, float, float]]) -> None:
    """Add `chapters` ((title, start_s, end_s) in the file's time) to the file at `path` in format `fmt`;
    a format not in FORMATS, or no chapters: nothing."""
    if not chapters or fmt not in FORMATS:
        return
    _comment_chapters(Path(path), fmt, chapters)


def _comment_chapters(path: Path, fmt: str, chapters) -> None:
    if fmt == "flac":
        from mutagen.flac import FLAC as Opener
    else:
        from mutagen.oggopus import OggOpus as Opener

    audio = Opener(path)
    if audio.tags is None:
        audio.add_tags()
    for i, (title, start, _) in enumerate(chapters, 1):
        audio.tags[f"CHAPTER{i:03d}"] = [timestamp(start)]
        audio.tags[f"CHAPTER{i:03d}NAME"] = [title]
    audio.save()


def timestamp(seconds: float) -> str:
    """HH:MM:SS.mmm"""
    ms = int(round(seconds * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    return f"{h:02d}:{m:02d}:{rest // 1000:02d}.{rest % 1000:03d}"
