"""Plain text and Markdown -> blocks, with chapter-heading detection."""
from __future__ import annotations

import re
from typing import Optional

from jobs.ingest.blocks import PATTERN_LEVEL, Block
from jobs.ingest.titlepage import BY_RE

_NUMWORD = (
    r"(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
    r"sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred|"
    r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|last|final|"
    r"eins|zwei|drei|vier|fünf|sechs|sieben|acht|neun|zehn|elf|zwölf)"
)
_NUMBER = rf"(?:\d{{1,4}}|[ivxlcdm]{{1,8}}|{_NUMWORD}(?:[- ]{_NUMWORD})*)"
CHAPTER_RE = re.compile(
    rf"^(?:chapter|chap\.|part|book|volume|vol\.|section|kapitel|teil|buch|chapitre|capítulo|capitolo)\s+{_NUMBER}"
    rf"(?P<rest>\s*(?:[.:\-—–]\s*.*|\s+.*)?)$",
    re.I,
)
ORDINAL_CHAPTER_RE = re.compile(rf"^(?:{_NUMWORD}|\d{{1,3}}\.)\s+(?:chapter|part|kapitel|teil|buch)\s*[.:]?$", re.I)
KEYWORD_RE = re.compile(
    r"^(?:prologue|epilogue|preface|foreword|introduction|afterword|interlude|conclusion|acknowledge?ments|"
    r"appendix(?:\s+\w{1,4})?|contents|table of contents|dedication|copyright|prolog|epilog|vorwort|nachwort|"
    r"einleitung|inhalt|inhaltsverzeichnis|widmung|the end)\s*(?:[.:\-—–]\s*.{0,60})?$",
    re.I,
)
# CJK chapter words: 第三章, 第12回, 第一部 (Chinese, Japanese), 제3장 (Korean), with a title after them or not
CJK_CHAPTER_RE = re.compile(r"^(?:第\s?[0-9０-９一二三四五六七八九十百千零〇两壹贰叁肆伍陆柒捌玖拾]{1,8}\s?[章回节節卷部篇话話集幕]"
                            r"|제\s?[0-9０-９]{1,4}\s?[장편부화권])(?:[\s:：.．、—-]+(.{0,40}))?$")
SCENE_BREAK_RE = re.compile(r"^\s*(?:[*#~•·=_-]\s*){3,}$|^\s*[*#~•]\s*$")
# a paragraph that is all in square brackets: a picture's description (pandoc's plain text writes an image as
# "[its alt text]", Project Gutenberg "[Illustration: ...]"), not the book's text
PICTURE_RE = re.compile(r"^\[[^\[\]]{1,400}\]$")
MD_HEADING_RE = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SETEXT_RE = re.compile(r"^\s*(=+|-+)\s*$")
TITLE_LINE_RE = re.compile(r"^#\s+(\S.*?)\s*#*$")


def take_title_line(text: str) -> tuple[Optional[str], Optional[str], str]:
    """A plain-text file's title block: (title, author, the text after it), else (None, None, text).

    A `# Title` first line; or a first group of lines (up to a blank line) of one to three short lines that
    end no sentence, not a chapter heading (pandoc writes "Title" and "Author" lines, Gutenberg "Title" and
    "by Author"): its first line is the title, a "by ..." line or a second line the author. A lone title line
    may be followed by a lone author line (calibre: blank lines between them). Such a block is a title only
    where a chapter heading or a table of contents follows it, or it names its author with "by": a short first
    line of a letter or a note ("Dear Anna") stays text.
    """
    body = text.lstrip("\ufeff \t\r\n")
    first, _, rest = body.partition("\n")
    m = TITLE_LINE_RE.match(first.strip())
    if m:
        return m.group(1), None, rest
    groups = re.split(r"\n[ \t]*\n\s*", body.replace("\r\n", "\n"), maxsplit=2)
    lines = [ln.strip() for ln in groups[0].split("\n")]
    if len(groups) < 2 or not 1 <= len(lines) <= 3 or not all(_title_like(ln) for ln in lines) \
            or chapter_heading(lines[0]) or len(lines[0].split()) > 15:
        return None, None, text
    by_line = next((BY_RE.match(ln) for ln in lines[1:] if BY_RE.match(ln)), None)
    author = by_line.group(2) if by_line else lines[1] if len(lines) == 2 else None
    after = groups[1:]
    if author is None and len(lines) == 1 and len(after) == 2 and _name_line(after[0]):
        by_line = by_line or BY_RE.match(after[0].strip())
        author = BY_RE.sub(r"\2", after[0].strip())
        after = after[1:]
    rest = "\n\n".join(after)
    if not (by_line or chapter_heading(rest.lstrip().split("\n", 1)[0])):  # chapter words, "Contents"
        return None, None, text
    return lines[0], author, rest


def _title_like(line: str) -> bool:
    return 0 < len(line) <= 100 and not line.endswith(tuple(".!?;:,。！？；：，…")) \
        and not SCENE_BREAK_RE.match(line) and not line.startswith(("#", "[", "-", "*", "|"))


def _name_line(group: str) -> bool:
    """A group that is one short line naming a person ("Zoë Müller", "by Ann Author")."""
    line = group.strip()
    if "\n" in line or not _title_like(line) or chapter_heading(line):
        return False
    if BY_RE.match(line):
        return True
    words = line.split()
    return 2 <= len(words) <= 4 and all(w[:1].isupper() and not any(c.isdigit() for c in w) for w in words)


def chapter_heading(line: str) -> bool:
    """True if ``line`` (stripped) looks like a chapter heading: "Chapter 12", "CHAPTER IV", "Prologue"..."""
    line = line.strip()
    if not line or len(line) > 90:
        return False
    m = CHAPTER_RE.match(line)
    if m:
        rest = m.group("rest").strip()
        if not rest or rest[0] in ".:-—–":
            return not rest.endswith(",")
        first = rest.split()[0]
        return first[:1].isupper() or first[:1].isdigit() or first[:1] in "\"'“‘«"
    return bool(ORDINAL_CHAPTER_RE.match(line) or KEYWORD_RE.match(line) or CJK_CHAPTER_RE.match(line))


def styled_block(text: str, level: Optional[int]) -> Optional[Block]:
    """A paragraph of a format with paragraph styles (DOCX, ODT, RTF) as a block: a heading of `level`, else
    a heading by its words ("Chapter 3") when short, else a paragraph; None for level 0 (the Title style:
    the document's title, not a block)."""
    if level == 0:
        return None
    if level is not None:
        return Block("heading", text, level=level)
    if len(text) < 90 and chapter_heading(text):
        return Block("heading", text)
    return Block("para", text)


def _blocks_of_lines(text: str) -> list[list[str]]:
    """Split text into groups of lines separated by blank lines; very long lines are own groups."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    nonblank = [ln for ln in lines if ln.strip()]
    blank = len(lines) - len(nonblank)
    line_mode = bool(nonblank) and blank < 0.1 * len(nonblank) and (
        sum(len(ln) for ln in nonblank) / len(nonblank) > 100
    )
    groups: list[list[str]] = []
    cur: list[str] = []
    for ln in lines:
        if not ln.strip():
            if cur:
                groups.append(cur)
                cur = []
            continue
        if line_mode:
            groups.append([ln])
        else:
            cur.append(ln)
    if cur:
        groups.append(cur)
    return groups


def _subtitle(line: str) -> bool:
    s = line.strip()
    return 0 < len(s) <= 60 and s[-1] not in ".,;!?。，；！？…" and not chapter_heading(s)


def parse_plain_text(text: str, markdown: bool = False) -> list[Block]:
    """Turn plain text (or Markdown, after :func:`markdown_to_text_lines`) into blocks."""
    groups = _blocks_of_lines(text)
    blocks: list[Block] = []
    for gi, group in enumerate(groups):
        lines = [ln.rstrip() for ln in group]
        i = 0
        para: list[str] = []

        def flush() -> None:
            text = " ".join(x.strip() for x in para)
            if para and not (not markdown and PICTURE_RE.match(text)):
                blocks.append(Block("para", text, lines=[x.strip() for x in para]))
            para.clear()

        while i < len(lines):
            ln = lines[i]
            s = ln.strip()
            m = MD_HEADING_RE.match(s) if markdown else None
            if m:
                flush()
                blocks.append(Block("heading", m.group(2).strip(), level=len(m.group(1))))
            elif i + 1 < len(lines) and SETEXT_RE.match(lines[i + 1]) and not para and len(s) <= 90 and (
                markdown or lines[i + 1].strip()[0] == "="
            ):
                level = 1 if lines[i + 1].strip()[0] == "=" else 2
                blocks.append(Block("heading", s, level=level if markdown else PATTERN_LEVEL))
                i += 1
            elif SCENE_BREAK_RE.match(s):
                flush()
            elif not para and chapter_heading(s):
                title = s
                nxt = lines[i + 1] if i + 1 < len(lines) else None
                cm = CHAPTER_RE.match(s)
                cjk = CJK_CHAPTER_RE.match(s)  # "第三章 山": a title after the chapter words already
                rest_empty = not cm.group("rest").strip(" .:-—–") if cm else not (cjk and cjk.group(1))
                if nxt is not None and len(lines) == 2 and rest_empty and _subtitle(nxt):
                    title = _join(s, nxt.strip())
                    i += 1
                elif nxt is None and rest_empty and _following_subtitle(groups, gi):
                    title = _join(s, groups[gi + 1][0].strip())
                    groups[gi + 1] = []
                blocks.append(Block("heading", title, level=PATTERN_LEVEL))
            else:
                para.append(ln)
            i += 1
        flush()
    return blocks


def _following_subtitle(groups: list[list[str]], gi: int) -> bool:
    """Gutenberg style: "CHAPTER I." then a blank line, a one-line title, a blank line, the text."""
    return (
        gi + 2 < len(groups)
        and len(groups[gi + 1]) == 1
        and _subtitle(groups[gi + 1][0])
        and (len(groups[gi + 2]) > 1 or len(groups[gi + 2][0]) > 60)
    )


def _join(a: str, b: str) -> str:
    a = a.rstrip()
    return f"{a} {b}" if a[-1:] in ".:" else f"{a}: {b}"
