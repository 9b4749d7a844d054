"""Splitting helpers for segmentation: sentences, clauses, words (Latin and CJK scripts)."""
from __future__ import annotations

import re

from engines.model.text import CJK_RE

NON_TERMINAL = {
    # English titles and abbreviations that do not end a sentence
    "mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "mt", "capt", "gen", "col", "lt", "sgt", "rev", "gov",
    "sen", "vs", "e.g", "i.e", "cf", "approx", "no", "nos", "fig", "vol", "p", "pp", "ch", "chap", "dept", "univ",
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "ave", "blvd", "ft",
    # German
    "z.b", "bzw", "d.h", "ca", "nr", "hr", "hrn", "fr", "str", "evtl", "ggf", "vgl", "inkl", "zzgl", "bspw", "sog",
    "s", "abb", "bd", "kap", "tel", "u.u", "z.t", "i.d.r", "abs", "okt", "dez", "mär", "v", "n",
}
DE_ORDINAL_PREV = {"am", "vom", "zum", "bis", "ab", "seit", "dem", "den", "im", "beim", "zur", "des", "der", "die",
                   "das"}
DE_MONTHS = {"januar", "februar", "märz", "april", "mai", "juni", "juli", "august", "september", "oktober",
             "november", "dezember", "jahrhundert"}
CLOSERS = "\"'”’»)]）」』】〉》›"
_CAND_RE = re.compile(rf"(?P<p>[.!?…]+|[。！？]+)(?P<c>[{re.escape(CLOSERS)}]*)")
_CLAUSE_RE = re.compile(r"(?<=[,;:])\s+|\s+(?=[—–]\s)|(?<=\s[—–])\s+|(?<=[，、；：])")
_ASCII_RUN_RE = re.compile(r"[A-Za-z0-9\u00c0-\u024f'’.-]+|\s+|.", re.S)


_TRAILING_SPACE = re.compile(r"\s*$")
_NEXT_CHAR = re.compile(r"\s*(\S)")
_NEXT_WORD = re.compile(r"\s*(\w+)")
_LOOK_BACK = 64  # characters before a mark that the word checks read (the words they look for are short)


def _is_boundary(text: str, m: re.Match, lang: str, growing: bool = False) -> bool:
    """Whether the candidate `m` ends a sentence. `growing`: more text may follow the end of `text`
    (a stream), so a mark at the very end is not yet a boundary, and one followed only by
    whitespace is judged without the next word. Reads only near the mark (no copy of the text before or
    after it), so a long paragraph is split in linear time."""
    punct, end = m.group("p"), m.end()
    if punct[0] in "。！？":
        return end < len(text) or not growing
    if _TRAILING_SPACE.match(text, end) and not growing:
        return True
    if not text[end:end + 1].isspace():
        return False  # "3.14", "e.g.x", "word.)"; growing: nothing follows yet
    nxt = _NEXT_CHAR.match(text, end)
    if nxt and nxt.group(1).islower():
        return False
    if punct == "." and not m.group("c"):
        before = text[max(0, m.start() - _LOOK_BACK):m.start()]
        token = re.search(r"(\S+)$", before)
        word = token.group(1).lstrip("(\"'“‘«[").lower() if token else ""
        if word in NON_TERMINAL or re.fullmatch(r"[^\W\d_]", word) or re.fullmatch(r"(?:[^\W\d_]\.)+[^\W\d_]", word):
            return False
        if lang == "de" and re.fullmatch(r"\d{1,2}", word):
            prev = re.search(r"(\w+)\W*$", before[: len(before) - len(token.group(1))])
            nxt_word = _NEXT_WORD.match(text, end)
            if (prev and prev.group(1).lower() in DE_ORDINAL_PREV) or (
                nxt_word and nxt_word.group(1).lower() in DE_MONTHS
            ):
                return False
    return True


def _sentences(text: str, lang: str, growing: bool) -> tuple[list[str], int]:
    """The complete sentences of `text` and where the rest begins."""
    out: list[str] = []
    start = 0
    for m in _CAND_RE.finditer(text):
        if _is_boundary(text, m, lang, growing):
            piece = text[start : m.end()].strip()
            if piece:
                out.append(piece)
            start = m.end()
    return out, start


def split_sentences(text: str, lang: str = "en") -> list[str]:
    """Split a paragraph into sentences (abbreviations, decimals, quotes, ellipses, CJK punctuation)."""
    out, start = _sentences(text, lang, growing=False)
    tail = text[start:].strip()
    return out + [tail] if tail else out


def split_streamed(text: str, lang: str = "en") -> tuple[list[str], str]:
    """Sentences of text that is still arriving (e.g. from a language model): the complete ones, by the
    rules of `split_sentences`, and the unfinished rest to keep until more text comes. A sentence is
    complete once whitespace (Latin scripts) or any text (CJK) follows its final mark."""
    out, start = _sentences(text, lang, growing=True)
    return out, text[start:]


def split_clauses(text: str) -> list[str]:
    """Split at clause punctuation (, ; : — and CJK ，、；：), punctuation staying with the left part."""
    return [p.strip() for p in _CLAUSE_RE.split(text) if p and p.strip()]


def split_words(text: str) -> list[str]:
    """Split into words; CJK characters are words of their own, Latin runs inside CJK stay whole."""
    if not CJK_RE.search(text):
        return text.split()
    words: list[str] = []
    for tok in _ASCII_RUN_RE.findall(text):
        if tok.isspace():
            if words:
                words[-1] += " "
            continue
        words.append(tok)
    return [w for w in (x.rstrip() if i == len(words) - 1 else x for i, x in enumerate(words)) if w.strip()]


def hard_split(token: str, size: int) -> list[str]:
    """Last resort for a single token longer than the budget: cut it into ``size``-character pieces."""
    size = max(1, size)
    return [token[i : i + size] for i in range(0, len(token), size)]




def pieces(text: str, lang: str = "en", max_chars: int = 400) -> list[str]:
    """`text` in pieces of at most `max_chars` characters that end at sentence ends (a sentence longer than
    that at clause ends, then between words): what one request can speak whole, whatever the input's length.
    Paragraph breaks end a piece too."""
    units: list[str] = []
    for para in (p for p in re.split(r"\n\s*\n", text) if p.strip()):
        for sentence in split_sentences(para.strip(), lang):
            units.extend(_fit(sentence, max_chars))
        units.append("\n")  # a piece ends with its paragraph
    out: list[str] = []
    cur = ""
    joiner = "" if lang in ("zh", "ja") else " "
    for u in units:
        if u == "\n":
            if cur:
                out.append(cur)
            cur = ""
        elif cur and len(cur) + len(joiner) + len(u) > max_chars:
            out.append(cur)
            cur = u
        else:
            cur = f"{cur}{joiner}{u}" if cur else u
    return out + [cur] if cur else out


def _fit(sentence: str, max_chars: int) -> list[str]:
    """One sentence as units of at most `max_chars`: itself, its clauses, runs of its words, cut words."""
    if len(sentence) <= max_chars:
        return [sentence]
    clauses = split_clauses(sentence)
    if len(clauses) > 1:
        return [u for c in clauses for u in _fit(c, max_chars)]
    out, cur = [], ""
    for w in split_words(sentence):
        w = w.strip()
        if len(w) > max_chars:
            out.extend(([cur] if cur else []) + hard_split(w, max_chars))
            cur = ""
        elif cur and len(cur) + 1 + len(w) > max_chars:
            out.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    return out + [cur] if cur else out
