"""The ID3v2.4 tag of an MP3 file: title, artist and album as UTF-8 text frames, and chapter marks.

    write_id3(path, {"title": ..., "artist": ..., "album": ...}, [(title, start_s, end_s), ...])

Chapters are CHAP frames (each with its title in a TIT2 sub-frame) in chapter order, under a top-level ordered
CTOC frame listing them in that order (what podcast and audiobook players, and ffmpeg, read); a CTOC holds at most
255 entries, so a longer book's top-level CTOC lists ordered CTOCs of up to 255 chapters each.

Why not libsndfile or mutagen: libsndfile (LAME) writes only an ID3v1 tag, Latin-1 by definition, with the
UTF-8 bytes it is given and cut at 30 bytes ("ZoÃ« MÃ¼ller" when read back); mutagen orders the frames it saves
by size, so the shortest chapter came first. The tag is built here from the ID3v2.4 structure (a 10-byte
header, frames with syncsafe sizes) and put in front of the audio once the file is written.
"""
from __future__ import annotations

import os
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Mapping, Optional, Sequence

TEXT_FRAMES = {"title": "TIT2", "artist": "TPE1", "album": "TALB"}
UTF8 = b"\x03"  # the text encoding byte of ID3v2.4's UTF-8
CTOC_TOP_LEVEL, CTOC_ORDERED = 0x02, 0x01
CTOC_MAX = 255  # entries one CTOC frame can list (its count is one byte)
NO_OFFSET = 0xFFFFFFFF  # a CHAP's byte offsets: unused (times say where it starts)


def syncsafe(n: int) -> bytes:
    """`n` as ID3v2's 4-byte syncsafe integer (7 bits a byte)."""
    if not 0 <= n < 1 << 28:
        raise ValueError(f"an ID3v2 size must be below 256 MiB, got {n} bytes")
    return bytes((n >> shift) & 0x7F for shift in (21, 14, 7, 0))


def frame(frame_id: str, body: bytes) -> bytes:
    return frame_id.encode("ascii") + syncsafe(len(body)) + b"\x00\x00" + body


def text_frame(frame_id: str, text: str) -> bytes:
    return frame(frame_id, UTF8 + text.encode("utf-8"))


def _element_id(name: str) -> bytes:
    return name.encode("ascii") + b"\x00"


def chapter_frames(chapters: Sequence[tuple[str, float, float]]) -> list[bytes]:
    """CTOC frame(s) then one CHAP frame per chapter, in chapter order."""
    ids = [f"ch{i:03d}" for i in range(len(chapters))]
    chaps = [frame("CHAP", _element_id(eid) + struct.pack(">IIII", round(start * 1000), round(end * 1000),
                                                          NO_OFFSET, NO_OFFSET) + text_frame("TIT2", title))
             for eid, (title, start, end) in zip(ids, chapters)]

    def toc(eid: str, flags: int, children: list[str], title: Optional[str] = None) -> bytes:
        body = _element_id(eid) + bytes((flags, len(children))) + b"".join(_element_id(c) for c in children)
        return frame("CTOC", body + (text_frame("TIT2", title) if title else b""))

    groups = [ids[i:i + CTOC_MAX] for i in range(0, len(ids), CTOC_MAX)]
    if len(groups) == 1:
        tocs = [toc("toc", CTOC_TOP_LEVEL | CTOC_ORDERED, ids, "Chapters")]
    else:
        names = [f"toc{i + 1}" for i in range(len(groups))]
        tocs = [toc("toc", CTOC_TOP_LEVEL | CTOC_ORDERED, names, "Chapters")]
        tocs += [toc(name, CTOC_ORDERED, group) for name, group in zip(names, groups)]
    return tocs + chaps


def id3_tag(tags: Mapping[str, Optional[str]], chapters: Sequence[tuple[str, float, float]] = ()) -> bytes:
    """The whole ID3v2.4 tag: header, the text frames of `tags` that have a value, the chapter frames."""
    frames = [text_frame(TEXT_FRAMES[key], value) for key, value in tags.items() if value and key in TEXT_FRAMES]
    body = b"".join(frames + (chapter_frames(chapters) if chapters else []))
    return b"ID3\x04\x00\x00" + syncsafe(len(body)) + body


def _tag_end(head: bytes) -> int:
    """Bytes an ID3v2 tag at the start of a file takes (0: none)."""
    if len(head) < 10 or head[:3] != b"ID3":
        return 0
    size = sum((b & 0x7F) << shift for b, shift in zip(head[6:10], (21, 14, 7, 0)))
    return 10 + size + (10 if head[5] & 0x10 else 0)  # a footer, when flagged


def write_id3(path: str | Path, tags: Mapping[str, Optional[str]],
              chapters: Sequence[tuple[str, float, float]] = ()) -> None:
    """Put the ID3v2.4 tag of `tags` and `chapters` in front of the MP3 at `path` (replacing an ID3v2 tag it
    starts with); nothing when there is nothing to write. The file is rewritten beside itself and renamed."""
    if not chapters and not any(tags.get(key) for key in TEXT_FRAMES):
        return
    path = Path(path)
    tag = id3_tag(tags, chapters)
    with open(path, "rb") as src:
        src.seek(_tag_end(src.read(10)))
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".id3", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as dst:
                dst.write(tag)
                shutil.copyfileobj(src, dst, 1 << 20)
            shutil.copymode(path, tmp)  # the file keeps its mode (mkstemp makes 0600)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
