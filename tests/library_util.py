"""Books as a listener's library shows them, made with the tools users make them with: an EPUB with a cover
image and an author, written by pandoc (Debian's pandoc; the tests that need it skip without it)."""
from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A plain PNG of one colour (8-bit RGB), as any image editor writes one."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def pandoc_epub(folder: Path, markdown: str, title: str, author: str, cover: bytes | None = None) -> Path:
    """`folder/book.epub` made by pandoc from `markdown` (# lines are chapters), with its title, author and
    cover image (`--epub-cover-image`)."""
    exe = shutil.which("pandoc")
    if exe is None:
        pytest.skip("pandoc is not installed (apt-get install pandoc)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "book.md").write_text(markdown, encoding="utf-8")
    argv = [exe, "book.md", "-o", "book.epub", "--metadata", f"title={title}", "--metadata", f"author={author}",
            "--metadata", "lang=en"]
    if cover is not None:
        (folder / "cover.png").write_bytes(cover)
        argv.append("--epub-cover-image=cover.png")
    subprocess.run(argv, cwd=folder, check=True, capture_output=True, timeout=120)
    return folder / "book.epub"
