"""Text normalization for synthesis: what the engine should *say*.

``normalize(text, language, lexicon)`` runs, in order:

1. Unicode cleanup (control characters, odd spaces, ligatures, ellipses, whitespace);
2. the user lexicon (:class:`Lexicon`), before every other rule;
3. abbreviations (English, German);
4. numbers with ``num2words``: currency, percentages, times, dates, ordinals,
   years, decades, ranges, units, decimals, negatives (full rules for English and
   German; plain numbers/decimals/percent for other num2words languages; Chinese
   digits are converted only if num2words supports ``zh``, otherwise kept).

``language`` accepts codes ("en", "de-DE") or names ("English", "German").
Unknown languages only get cleanup and the lexicon.
"""
from __future__ import annotations

import re
from typing import Optional

from text.normalize.abbrev import expand_abbreviations
from text.normalize.cleanup import cleanup
from text.normalize.lexicon import Lexicon
from text.normalize.numbers import expand_numbers

LANGUAGE_NAMES = {
    "english": "en", "german": "de", "deutsch": "de", "chinese": "zh", "mandarin": "zh", "japanese": "ja",
    "korean": "ko", "french": "fr", "spanish": "es", "italian": "it", "portuguese": "pt", "russian": "ru",
    "dutch": "nl", "polish": "pl", "swedish": "sv", "danish": "da", "norwegian": "no", "finnish": "fi",
    "turkish": "tr", "czech": "cs", "ukrainian": "uk",
}
CJK = {"zh", "ja", "ko"}
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?)\]}])")


def language_code(language: Optional[str]) -> str:
    """Map "en-US", "English", "de_DE" ... to a short code ("en", "de"); "" if unknown/auto."""
    if not language:
        return ""
    lang = language.strip().lower().replace("_", "-")
    if lang in LANGUAGE_NAMES:
        return LANGUAGE_NAMES[lang]
    code = lang.split("-")[0]
    return "" if code in ("auto", "und", "mul") else code


def normalize(text: str, language: str, lexicon: Optional[Lexicon] = None) -> str:
    """Return the spoken form of ``text`` in ``language`` (see module docstring for the rules)."""
    lang = language_code(language)
    text = cleanup(text)
    if lexicon:
        text = lexicon.apply(text)
    text = expand_abbreviations(text, lang)
    if lang == "zh":
        text = _chinese_numbers(text)
    elif lang:
        text = expand_numbers(text, lang)
    text = re.sub(r"\s+", " ", text).strip()
    if lang not in CJK:
        text = _SPACE_BEFORE_PUNCT.sub(r"\1", text)
    return text


def _chinese_numbers(text: str) -> str:
    """Arabic numerals -> Chinese with num2words when it supports "zh"; otherwise unchanged."""
    from text.normalize.numbers import supported

    if not supported("zh"):
        return text
    return expand_numbers(text, "zh")


__all__ = ["normalize", "Lexicon", "language_code", "cleanup"]
