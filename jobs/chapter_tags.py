"""Chapter marks in a finished book file, written with mutagen (m4b gets its marks from ffmpeg, audio.encode).

    write_chapter_tags(path, fmt, [(title, start_s, end_s), ...])

mp3        ID3v2 CHAP frames (one per chapter, its title in a TIT2 sub-frame) under one top-level ordered
           CTOC frame: what podcast and audiobook players read.
flac, opus Vorbis comments CHAPTER001=HH:MM:SS.mmm and CHAPTER001NAME=title (the chapter-comment
           convention players and taggers share).
Other formats (wav) have no common convention and are left as they are. Tags already in the file (title,
artist, album) are kept.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

FORMATS = ("mp3", "flac", "opus")  # the formats that take chapter marks here


def write_chapter_tags(path: str | Path, fmt: str, chapters: Sequence[tuple[str, float, float]]) -> None:
    """Add `chapters` ((title, start_s, end_s) in the file's time) to the file at `path` in format `fmt`;
    a format not in FORMATS, or no chapters: nothing."""
    if not chapters or fmt not in FORMATS:
        return
    if fmt == "mp3":
        _id3_chapters(Path(path), chapters)
    else:
        _comment_chapters(Path(path), fmt, chapters)


def _id3_chapters(path: Path, chapters) -> None:
    from mutagen.id3 import CHAP, CTOC, ID3, TIT2, CTOCFlags, ID3NoHeaderError

    try:
        tags = ID3(path)
    except ID3NoHeaderError:
        tags = ID3()
    ids = [f"ch{i:03d}" for i in range(len(chapters))]
    for eid, (title, start, end) in zip(ids, chapters):
        tags.add(CHAP(element_id=eid, start_time=int(round(start * 1000)), end_time=int(round(end * 1000)),
                      sub_frames=[TIT2(encoding=3, text=[title])]))
    tags.add(CTOC(element_id="toc", flags=CTOCFlags.TOP_LEVEL | CTOCFlags.ORDERED, child_element_ids=ids,
                  sub_frames=[TIT2(encoding=3, text=["Chapters"])]))
    tags.save(path)


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
