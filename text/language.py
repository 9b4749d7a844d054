"""Which language a text is written in, where nothing says so: its BCP-47 primary tag, or "" when unsure.

    guess_language(["It was a bright cold day in April, and the clocks were striking thirteen."]) -> "en"

For a job whose language is `auto` (the model then picks the language from the text itself) this is what it
speaks, as far as the text tells: what a narrated EPUB declares as its language instead of `und`. The script
decides first (kana: ja, hangul: ko, Han alone: zh, Cyrillic: ru, or uk where its own letters show); text in
Latin letters by its most common short words, for the languages the model speaks and a few near them. A text
too short, or with no clear winner, gives "": better no answer than a wrong one.
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter
from typing import Iterable, Optional

from text.normalize import language_code

SAMPLE_CHARS = 20_000  # enough text to tell; the start of a book stands for the rest
MIN_HITS = 5  # common words a Latin-script text must show before it is named
LEAD = 1.5  # how far ahead of the next language the winner must be

# short, frequent words of each language; a word listed for two languages tells neither and is not counted
COMMON_WORDS = {
    "en": "the and of to is was that it with for his her you he she they have had not this which are be at",
    "de": "der die das und ist nicht ein eine mit sich auf den dem des ich sie er war wir auch noch wie",
    "fr": "de la le les et en est une des du que qui dans pour pas sur au avec ce il elle nous vous mais sont je ne "
          "était avait avais suis lui ses mes mon tout cette été",
    "es": "de la a el los las y en es una del que por con para no se lo su al como pero más muy",
    "it": "la a il gli le e è una del della che di per non con si lo sono ma come più anche nel questo",
    "pt": "de a o os as e é uma do da que em por com para não se ao dos das mas como mais muito",
    "nl": "de het een en is van dat niet met op zijn ik je hij zij maar ook voor aan wat",
}
_SHARED = {w for w, n in Counter(w for words in COMMON_WORDS.values() for w in set(words.split())).items() if n > 1}
_WORDS = {lang: set(words.split()) - _SHARED for lang, words in COMMON_WORDS.items()}
_WORD = re.compile(r"[^\W\d_]+")
UKRAINIAN = set("іїєґІЇЄҐ")


def _script(ch: str) -> str:
    o = ord(ch)
    if 0x3040 <= o <= 0x30FF or 0x31F0 <= o <= 0x31FF:
        return "kana"
    if 0xAC00 <= o <= 0xD7AF or 0x1100 <= o <= 0x11FF or 0x3130 <= o <= 0x318F:
        return "hangul"
    if 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0xF900 <= o <= 0xFAFF:
        return "han"
    if 0x0400 <= o <= 0x04FF:
        return "cyrillic"
    if ch.isalpha() and unicodedata.name(ch, "").startswith("LATIN"):
        return "latin"
    return ""


def guess_language(texts: Iterable[str]) -> str:
    """The BCP-47 primary tag of the language of `texts` (read up to SAMPLE_CHARS), or "" when unsure."""
    parts, size = [], 0
    for t in texts:
        parts.append(t)
        size += len(t)
        if size >= SAMPLE_CHARS:
            break
    sample = " ".join(parts)[:SAMPLE_CHARS]
    scripts = Counter(s for s in map(_script, sample) if s)
    letters = sum(scripts.values())
    if not letters:
        return ""
    cjk = scripts["kana"] + scripts["han"]
    if scripts["kana"] and scripts["kana"] >= 0.1 * cjk and cjk >= 0.3 * letters:
        return "ja"
    if scripts["hangul"] >= 0.3 * letters:
        return "ko"
    if scripts["han"] >= 0.3 * letters:
        return "zh"
    if scripts["cyrillic"] >= 0.5 * letters:
        return "uk" if sum(ch in UKRAINIAN for ch in sample) >= 0.01 * scripts["cyrillic"] else "ru"
    if scripts["latin"] < 0.5 * letters:
        return ""
    hits = Counter()
    for word in _WORD.findall(sample.lower()):
        for lang, words in _WORDS.items():
            if word in words:
                hits[lang] += 1
    ranked = hits.most_common(2) + [("", 0), ("", 0)]
    (best, n), (_, second) = ranked[0], ranked[1]
    return best if n >= MIN_HITS and n >= LEAD * second else ""


def spoken_language(language: Optional[str], texts: Iterable[str]) -> str:
    """The BCP-47 primary tag of what is spoken: the one `language` names ("english", "de", "en-US"), else the
    language of `texts` as `guess_language` reads it (a job set to auto); "und" where neither tells."""
    code = language_code(language)
    if code.isalpha() and len(code) in (2, 3):
        return code
    return guess_language(texts) or "und"
