"""Number strings to words (``num2words``): the pieces every language's number rules use
(`text.normalize.numbers` puts the rules together; `rules_en`, `rules_de` add their own)."""
from __future__ import annotations

import logging
import re
from decimal import Decimal, InvalidOperation
from typing import Callable

from num2words import num2words

log = logging.getLogger(__name__)

DECIMAL_COMMA = {"de", "fr", "es", "it", "pt", "nl", "ru", "pl", "cs", "sk", "sv", "da", "no", "fi", "tr", "uk", "ro", "hu"}


def to_decimal(s: str, lang: str) -> Decimal:
    if lang in DECIMAL_COMMA:
        s = s.replace(".", "").replace(",", ".")
    else:
        s = s.replace(",", "")
    return Decimal(s)


def _n2w(*args, **kwargs) -> str:
    """num2words without the commas it puts between groups ("one million, two...")."""
    return num2words(*args, **kwargs).replace(",", "")


def digits(s: str, lang: str) -> str:
    return " ".join(num2words(int(c), lang=lang) for c in s if c.isdigit())


def say(s: str, lang: str) -> str:
    """Words for the number string ``s`` written with the language's separators."""
    dec = "," if lang in DECIMAL_COMMA else "."
    has_frac = bool(re.search(rf"{re.escape(dec)}\d+$", s))
    intpart = re.sub(r"[.,]", "", s.split(dec)[0])
    try:
        if (len(intpart) > 1 and intpart.startswith("0") and not has_frac) or len(intpart) > 15:
            return digits(s, lang)
        value = to_decimal(s, lang)
        if not has_frac:
            return _n2w(int(value), lang=lang)
        return _n2w(value, lang=lang)
    except (InvalidOperation, NotImplementedError, ValueError, OverflowError, KeyError, IndexError) as exc:
        log.debug("num2words failed for %r (%s): %s", s, lang, exc)
        return digits(s, lang)


def year(n: int, lang: str) -> str:
    if lang == "de" and not 1100 <= n < 2000:
        return num2words(n, lang=lang)
    try:
        return num2words(n, lang=lang, to="year")
    except (NotImplementedError, AttributeError):
        return num2words(n, lang=lang)


def pad(m: re.Match, words: str) -> str:
    """Keep spaces between the words and adjacent letters ("3D" -> "three D")."""
    s = m.string
    left = " " if m.start() > 0 and s[m.start() - 1].isalpha() else ""
    right = " " if m.end() < len(s) and s[m.end()].isalpha() else ""
    return f"{left}{words}{right}"


_RANGE = re.compile(r"(?<![\d.,])(?P<a>\d+)\s?(?P<dash>[-–])\s?(?P<b>\d+)(?![\d.,]\d)")


def range_rule(lang: str, joiner: str) -> "Rule":
    """The rule reading "a-b" as "a JOINER b" (years as years); kept as written unless a < b, or when a
    hyphen joins numbers of different lengths (a code such as 12-345)."""
    def spoken_range(m: re.Match) -> str:
        a, b = m.group("a"), m.group("b")
        if int(a) >= int(b) or (len(a) != len(b) and m.group("dash") == "-"):
            return m.group()
        if len(a) == 4 and 1000 <= int(a) < 2100:
            return pad(m, f"{year(int(a), lang)} {joiner} {year(int(b), lang)}")
        return pad(m, f"{say(a, lang)} {joiner} {say(b, lang)}")

    return _RANGE, spoken_range


def prev_word(m: re.Match) -> str:
    before = m.string[: m.start()].rstrip()
    found = re.search(r"(\w+)\W*$", before)
    return found.group(1).lower() if found else ""


Rule = tuple[re.Pattern, Callable[[re.Match], str]]
