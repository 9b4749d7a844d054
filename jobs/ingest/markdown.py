"""Markdown -> plain text lines (markup stripped, headings kept as ``#`` lines for the text parser)."""
from __future__ import annotations

import re

FENCE_RE = re.compile(r"^\s{0,3}(```|~~~)")
REF_DEF_RE = re.compile(r"^\s{0,3}\[(?!\^)[^\]]+\]:\s*\S+")
FOOTNOTE_DEF_RE = re.compile(r"^\s{0,3}\[\^([^\]]+)\]:\s*(.*)$")
TABLE_SEP_RE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
TABLE_ROW_RE = re.compile(r"^\s*\|.*\|\s*$")
QUOTE_RE = re.compile(r"^\s{0,3}>\s?")
LIST_RE = re.compile(r"^\s*(?:[-*+]|\d{1,3}[.)])\s+(.*)$")
SCENE_RE = re.compile(r"^\s{0,3}([-*_])(\s*\1){2,}\s*$")

_INLINE = [
    (re.compile(r"!\[([^\]]*)\]\([^)]*\)"), ""),
    (re.compile(r"\[([^\]]+)\]\([^)]*\)"), r"\1"),
    (re.compile(r"\[([^\]]+)\]\[[^\]]*\]"), r"\1"),
    (re.compile(r"\[\^[^\]\s]+\]"), ""),
    (re.compile(r"<(?:https?|mailto|ftp):[^>\s]+>"), ""),
    (re.compile(r"</?[A-Za-z][^>]*>"), ""),
    (re.compile(r"`+([^`]+?)`+"), r"\1"),
    (re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1"), r"\2"),
    (re.compile(r"(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?![\w*])"), r"\1"),
    (re.compile(r"(?<![\w_])_(?=\S)(.+?)(?<=\S)_(?![\w_])"), r"\1"),
    (re.compile(r"~~(.+?)~~"), r"\1"),
    (re.compile(r"\\([\\`*_{}\[\]()#+\-.!>|])"), r"\1"),
]


def strip_inline(text: str) -> str:
    """Remove inline Markdown markup (emphasis, links, images, code, HTML tags)."""
    for rx, rep in _INLINE:
        text = rx.sub(rep, text)
    return text


def markdown_to_plain(text: str, skip_footnotes: bool = True) -> str:
    """Strip block-level Markdown; ``#`` headings and setext underlines stay for the text parser."""
    out: list[str] = []
    in_fence = False
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if FENCE_RE.match(line):
            in_fence = not in_fence
            out.append("")
            continue
        if in_fence or REF_DEF_RE.match(line) or TABLE_SEP_RE.match(line) and "|" in line:
            continue
        m = FOOTNOTE_DEF_RE.match(line)
        if m:
            out.append("")
            if not skip_footnotes:
                out.append(f"Note {m.group(1)}: {strip_inline(m.group(2))}")
            continue
        while QUOTE_RE.match(line):
            line = QUOTE_RE.sub("", line, count=1)
        if SCENE_RE.match(line):
            if line.strip()[0] == "-" and out and out[-1].strip():
                out.append(line)  # setext underline of a heading
                continue
            out.extend(["", "***", ""])
            continue
        if TABLE_ROW_RE.match(line):
            cells = [strip_inline(c.strip()) for c in line.strip().strip("|").split("|")]
            out.extend(["", ", ".join(c for c in cells if c), ""])
            continue
        m = LIST_RE.match(line)
        if m and not line.lstrip().startswith("#"):
            out.extend(["", strip_inline(m.group(1))])
            continue
        out.append(strip_inline(line))
    return "\n".join(out)
