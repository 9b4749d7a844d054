"""One source book converted by the tools people use (pandoc, calibre's ebook-convert, LibreOffice) into every
format they write that the appliance reads, and how close what the appliance reads comes to the source.

The source is Markdown with a YAML metadata block: a title and an author with non-ASCII letters, front matter
(a foreword), four chapters (one titled in Chinese), two footnotes, a table, a list and an image with alt text.
pandoc writes it as EPUB 3, EPUB 2, DOCX, ODT, RTF, HTML, FB2, Markdown and plain text; calibre converts
pandoc's EPUB 3 with its defaults (AZW3, MOBI, EPUB, FB2, DOCX, PDF, RTF, TXT, HTMLZ, TXTZ); LibreOffice converts
pandoc's DOCX (DOCX, ODT, RTF, PDF). What a listener should hear of each: the body's words (chapter titles and
paragraphs, table cells and list items) and nothing else: no note markers, notes, table of contents, title
page or alt text.
"""
from __future__ import annotations

import difflib
import os
import re
import shutil
import struct
import subprocess
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

SOURCE = """---
title: "Zoë's Garden Café"
author: Zoë Müller
lang: en
---

# Foreword

This small book was written for friends who like quiet gardens and slow mornings. Nothing in it really \
happened, and yet everything in it is true, the way old stories are true.

I thank my neighbours, who lent me their roses, their ladders and their patience.

# Chapter One: The Bench

Zoë sat on the bench.[^1] It said nothing, as benches do, but the morning was warm and the Straße behind the \
hedge was empty. A blackbird hopped along the wall, stopped, and looked at her with one bright eye.

She opened a naïve little notebook and wrote down the names of the birds she could hear: the robin, the wren, \
the chattering sparrows under the roof. Her grandmother had taught her to listen before looking.

When the church bell rang nine times, she closed the notebook and went inside to make tea.

[^1]: The bench was painted green by her grandfather.

# 第二章 花园

她在花园里读书。风很轻，鸟在唱歌。

下午，她给邻居写了一封长信，告诉他玫瑰已经开了。

晚上，月亮升起来，花园里非常安静。

# Chapter Three: The Table

At the café on the corner the menu was written on a board in white chalk, and Zoë copied it carefully into \
her notebook.[^2] The owner, a tall man called Henrik, watched her with amusement.

| Dish | Price |
|------|-------|
| Coffee | three euros |
| Plum cake | four euros |
| Lemonade | two euros |

The waiter laughed and brought both the coffee and the cake, although she had only asked for one of them. \
She decided not to complain.

[^2]: Prices changed every summer, and nobody ever knew why.

# Chapter Four: The List

Before leaving the town she made a list of things to plant in the spring:

- tulips in three colours
- rosemary by the kitchen door
- sunflowers along the fence

![A watering can painted blue](can.png)

Then she walked home through the soft rain, happy and tired, and slept until the garden woke her again.
"""
TITLE, AUTHOR = "Zoë's Garden Café", "Zoë Müller"
CHAPTERS = ["Foreword", "Chapter One: The Bench", "第二章 花园", "Chapter Three: The Table", "Chapter Four: The List"]
NOTES = ["The bench was painted green by her grandfather.", "Prices changed every summer, and nobody ever knew why."]
ALT = "A watering can painted blue"
CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
PANDOC = ["pandoc", "-f", "markdown-implicit_figures", "-s"]  # an image alone in its paragraph stays an image


def source_body() -> str:
    """What a listener should hear, as the source says it: headings and paragraphs, without the metadata
    block, the notes, their references and the image."""
    body = SOURCE.split("---", 2)[2]
    lines = [ln for ln in body.splitlines() if not ln.startswith(("[^", "![", "|---"))]
    return "\n".join(re.sub(r"\[\^\d\]", "", ln).lstrip("#-| ") for ln in lines)


def words(text: str) -> list[str]:
    """The words of `text` as a listener tells them apart: lower case, apostrophes as one, every CJK
    character a word."""
    out: list[str] = []
    for w in re.findall(r"\w+(?:'\w+)*", text.replace("’", "'").lower()):
        out.extend(w if CJK.search(w) else [w])
    return out


def precision_recall(read: list[str], source: list[str]) -> tuple[float, float]:
    """Of the words read, the share that are the source's, in its order (precision); of the source's words,
    the share read (recall)."""
    matched = sum(b.size for b in difflib.SequenceMatcher(None, source, read, autojunk=False).get_matching_blocks())
    return (matched / len(read) if read else 0.0), matched / len(source)


def differences(read: list[str], source: list[str]) -> list[str]:
    """The words read that are not the source's and those missed, for a failure's message."""
    out = []
    for op, a1, a2, b1, b2 in difflib.SequenceMatcher(None, source, read, autojunk=False).get_opcodes():
        if op != "equal":
            out.append(f"{op}: source {' '.join(source[a1:a2])!r} read {' '.join(read[b1:b2])!r}")
    return out


def png() -> bytes:
    """An 8x8 blue PNG (the image the alt text describes)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x00\x80\xff" * 8 for _ in range(8))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 8, 8, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


@dataclass(frozen=True)
class Conversion:
    """One file a tool writes: `name` (its file name), the tool, and how: pandoc from the Markdown (`target`
    its writer), calibre from pandoc's EPUB 3, LibreOffice from pandoc's DOCX (`target` the ending).
    `required`: where the tests must run (TTS_APPLIANCE_REQUIRE_SYSTEM_TESTS=1: .ci/run installs every tool,
    LibreOffice and pandoc's LaTeX and CJK font too); a developer's machine skips a missing tool with its reason."""

    name: str
    tool: str
    target: str
    required: bool = True


CONVERSIONS = [Conversion(f"pandoc.{name}", "pandoc", writer) for name, writer in (
    ("epub3.epub", "epub3"), ("epub2.epub", "epub2"), ("docx", "docx"), ("odt", "odt"), ("rtf", "rtf"),
    ("html", "html"), ("fb2", "fb2"), ("md", "markdown"), ("txt", "plain"))]
CONVERSIONS.append(Conversion("pandoc.pdf", "pandoc", "latex"))  # -o *.pdf: LaTeX, then PDF
CONVERSIONS += [Conversion(f"calibre.{ext}", "calibre", ext) for ext in (
    "azw3", "mobi", "epub", "fb2", "docx", "pdf", "rtf", "txt", "htmlz", "txtz")]
CONVERSIONS += [Conversion(f"libreoffice.{ext}", "libreoffice", ext) for ext in ("docx", "odt", "rtf", "pdf")]
PROGRAMS = {"pandoc": "pandoc", "calibre": "ebook-convert", "libreoffice": "soffice"}
INSTALL = {"pandoc": "apt-get install pandoc", "calibre": "apt-get install calibre",
           "libreoffice": "apt-get install libreoffice-writer-nogui"}


def missing(tool: str) -> Optional[str]:
    """Why `tool` cannot run here (None: it can)."""
    program = PROGRAMS[tool]
    if shutil.which(program) is None:
        return f"{tool} is not installed here (no {program} on PATH; {INSTALL[tool]})"
    return None


def _latex() -> tuple[Optional[list[str]], Optional[str]]:
    """pandoc's options for a PDF through xelatex with a CJK font, or why it cannot write one here."""
    if shutil.which("xelatex") is None:
        return None, ("pandoc writes PDF through LaTeX: xelatex is not installed here (apt-get install texlive-xetex; "
                      "--no-install-recommends texlive-lang-chinese for its CJK package)")
    fonts = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True).stdout.split("\n")
    family = next((f.split(",")[0].strip() for f in fonts if f.strip()), None)
    if family is None:
        return None, "pandoc's PDF needs a Chinese font for xelatex: none here (apt-get install fonts-noto-cjk)"
    return ["--pdf-engine=xelatex", "-V", f"CJKmainfont={family}"], None


def _run(cmd: list[str], cwd: Path, env: Optional[dict] = None) -> Optional[str]:
    """Run a converter; None when it worked, else what it said."""
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, errors="replace", timeout=300)
    except subprocess.TimeoutExpired:
        return f"{' '.join(cmd)}: no result after 300 s"
    if done.returncode != 0:
        return f"{' '.join(cmd)} failed ({done.returncode}): {(done.stderr or done.stdout)[-1500:]}"
    return None


def _calibre(folder: Path, c: Conversion) -> Optional[str]:
    # calibre renders PDF with Qt WebEngine (Chromium), which refuses to run as root with its sandbox on
    env = {**os.environ, "QTWEBENGINE_CHROMIUM_FLAGS": "--no-sandbox", "QT_QPA_PLATFORM": "offscreen"}
    return _run(["ebook-convert", "pandoc.epub3.epub", c.name], folder, env)


def _libreoffice(folder: Path, conversions: list[Conversion]) -> dict[str, Optional[str]]:
    """LibreOffice's files, one after another (one profile, in the folder: never the user's)."""
    out = {}
    profile = (folder / "lo-profile").as_uri()
    for c in conversions:
        work = folder / f"lo-{c.target}"
        work.mkdir()
        shutil.copy(folder / "pandoc.docx", work / "libreoffice.docx")
        err = _run(["soffice", f"-env:UserInstallation={profile}", "--headless", "--convert-to", c.target,
                    "--outdir", "out", "libreoffice.docx"], work)
        made = work / "out" / c.name
        if err is None and not made.is_file():
            err = f"LibreOffice wrote no {c.name}"
        if err is None:
            shutil.move(made, folder / c.name)
        out[c.name] = err
    return out


def convert_all(folder: Path) -> dict[str, tuple[Optional[Path], Optional[str], Optional[str]]]:
    """Every conversion made in `folder`: name -> (its file, why it was skipped, why it failed)."""
    (folder / "book.md").write_text(SOURCE, encoding="utf-8")
    (folder / "can.png").write_bytes(png())
    results: dict[str, tuple] = {}

    def skip(c: Conversion, why: str) -> None:
        results[c.name] = (None, why, None)

    def done(c: Conversion, err: Optional[str]) -> None:
        results[c.name] = (folder / c.name, None, None) if err is None else (None, None, err)

    pandoc_missing = missing("pandoc")
    for c in (c for c in CONVERSIONS if c.tool == "pandoc"):
        extra, why = _latex() if c.name.endswith(".pdf") and not pandoc_missing else ([], pandoc_missing)
        if why:
            skip(c, why)
        else:
            done(c, _run(PANDOC + extra + ["-t", c.target, "book.md", "-o", c.name], folder))
    for tool in ("calibre", "libreoffice"):
        todo = [c for c in CONVERSIONS if c.tool == tool]
        source = "pandoc.epub3.epub" if tool == "calibre" else "pandoc.docx"
        why = missing(tool) or (None if results[source][0] else f"pandoc made no {source} to convert")
        for c in todo if why else []:
            skip(c, why)
        if why:
            continue
        if tool == "calibre":
            with ThreadPoolExecutor(max_workers=3) as pool:
                for c, err in zip(todo, pool.map(lambda c: _calibre(folder, c), todo)):
                    done(c, err)
        else:
            for name, err in _libreoffice(folder, todo).items():
                done(next(c for c in todo if c.name == name), err)
    return results
