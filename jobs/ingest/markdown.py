"""Markdown -> plain text lines (markup stripped, headings kept as ``#`` lines for the text parser), and the
metadata block many Markdown files open with (pandoc, Jekyll, Hugo, Obsidian): YAML between ``---`` lines, or
TOML between ``+++`` lines (Hugo), whose title, author and language are the document's."""
from __future__ import annotations

import logging
import re
from typing import Any, Optional

log = logging.getLogger(__name__)

FENCE_RE = re.compile(r"^\s{0,3}(```|~~~)")
REF_DEF_RE = re.compile(r"^\s{0,3}\[(?!\^)[^\]]+\]:\s*\S+")
FOOTNOTE_DEF_RE = re.compile(r"^\s{0,3}\[\^([^\]]+)\]:\s*(.*)$")
TABLE_SEP_RE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
TABLE_ROW_RE = re.compile(r"^\s*\|.*\|\s*$")
QUOTE_RE = re.compile(r"^\s{0,3}>\s?")
LIST_RE = re.compile(r"^\s*(?:[-*+]|\d{1,3}[.)])\s+(.*)$")
SCENE_RE = re.compile(r"^\s{0,3}([-*_])(\s*\1){2,}\s*$")
FRONT_RE = re.compile(r"\A\ufeff?(?:(---)|\+\+\+)[ \t]*\r?\n(.*?)\r?\n(?(1)(?:---|\.\.\.)|\+\+\+)[ \t]*(?:\r?\n|\Z)",
                      re.S)
MAX_FRONT = 64 * 1024  # a metadata block is short; a longer "block" is text
# pandoc's attributes at a heading's end ("# Title {#id .class key=value}", "{-}"), and on a span ("[x]{.sc}")
ATTRS_RE = re.compile(r"\s*\{\s*(?:[#.][^{}]*|-|[\w-]+=[^{}]*)\}\s*$")

_INLINE = [
    (re.compile(r"!\[([^\]]*)\]\([^)]*\)"), ""),
    (re.compile(r"\[([^\]]+)\]\([^)]*\)"), r"\1"),
    (re.compile(r"\[([^\]]+)\]\{[^{}]*\}"), r"\1"),
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
        out.append(strip_inline(ATTRS_RE.sub("", line) if line.rstrip().endswith("}") else line))
    return "\n".join(out)


def front_matter(text: str) -> tuple[dict, str]:
    """({"title", "author", "language"} from a leading YAML or TOML metadata block (None where it says none), the
    text after the block); a file without one: (all None, text)."""
    meta: dict[str, Optional[str]] = {"title": None, "author": None, "language": None}
    m = FRONT_RE.match(text)
    if m is None or len(m.group(2)) > MAX_FRONT:
        return meta, text
    data = _parse(m.group(2), toml=m.group(1) is None)
    if data is None:
        return meta, text
    meta["title"] = _names(data.get("title"))
    meta["author"] = _names(next((data[k] for k in ("author", "authors", "creator") if data.get(k)), None))
    meta["language"] = _names(data.get("lang") or data.get("language"))
    return meta, text[m.end():]


def _parse(block: str, toml: bool) -> Optional[dict]:
    """The metadata block as a mapping; None when it is none (then it is the document's text)."""
    import tomllib

    import yaml

    try:
        if toml:
            return tomllib.loads(block)
        data = yaml.safe_load(block)
    except Exception as exc:  # any parser error: not a metadata block
        log.info("the Markdown file's opening block is not metadata (%s); read as text", exc)
        return None
    return data if isinstance(data, dict) else None


def _names(value: Any, depth: int = 0) -> Optional[str]:
    """A metadata value as text: a string; a list of strings, or of mappings with a name (pandoc's authors).
    Looked into three levels deep at most (YAML aliases can make a value hold itself)."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return " ".join(strip_inline(str(value)[:1000]).split()) or None
    if depth >= 3:
        return None
    if isinstance(value, dict):
        return _names(value.get("name") or value.get("text"), depth + 1)
    if isinstance(value, list):
        names = [n for n in (_names(v, depth + 1) for v in value[:20]) if n]
        return ", ".join(names) or None
    return None
