"""German-only number rules: dates with ordinals ("am 3. Oktober"), times ("14:30 Uhr"), years, ranges."""
from __future__ import annotations

import re

from num2words import num2words

from text.normalize import words as W
from text.normalize.rules_en import roman_to_int
from text.normalize.spoken import Rule, pad, prev_word, range_rule, say, year

DATIVE = {"am", "vom", "zum", "bis", "ab", "seit", "dem", "den", "im", "beim", "zur", "des", "vor", "nach", "an",
          "ihrem", "seinem", "ihren", "seinen", "meinem", "diesem"}
ARTICLE = {"der", "die", "das", "jede", "diese", "seine", "ihre"}
YEAR_CUES = {"im", "jahr", "jahre", "jahres", "seit", "bis", "von", "ab", "um", "anfang", "ende", "mitte", "nach",
             "vor", "sommer", "winter", "herbst", "frühjahr", "frühling", "und", "oder"} | {m.lower() for m in W.MONTHS_DE}
_MONTH_ALT = "|".join(sorted([re.escape(m) for m in W.MONTHS_DE] + [re.escape(a) for a in W.MONTH_ABBR_DE], key=len, reverse=True))


def ordinal(n: int, prev: str) -> str:
    """German ordinal with a simple case ending from the preceding word."""
    base = num2words(n, lang="de", to="ordinal")  # "dritte"
    if prev in DATIVE:
        return base + "n"
    if prev in ARTICLE:
        return base
    return base + "r"


def _month_name(tok: str) -> str:
    return W.MONTHS_DE[W.MONTH_ABBR_DE[tok] - 1] if tok in W.MONTH_ABBR_DE else tok


def _date_named(m: re.Match) -> str:
    day = int(m.group("d"))
    if not 1 <= day <= 31:
        return m.group()
    return pad(m, f"{ordinal(day, prev_word(m))} {_month_name(m.group('mon'))}")


def _date_numeric(m: re.Match) -> str:
    day, mon = int(m.group("d")), int(m.group("m"))
    if not (1 <= day <= 31 and 1 <= mon <= 12):
        return m.group()
    out = f"{ordinal(day, prev_word(m))} {W.MONTHS_DE[mon - 1]}"
    y = m.group("y")
    if y:
        out += " " + (year(int(y), "de") if len(y) == 4 else num2words(int(y), lang="de"))
    return pad(m, out)


def _ordinal_noun(m: re.Match) -> str:
    prev = prev_word(m)
    if prev not in DATIVE and prev not in ARTICLE:
        return m.group()
    return pad(m, ordinal(int(m.group("n")), prev) + " ") + m.group("noun")


def _time(m: re.Match) -> str:
    h, mi = int(m.group("h")), int(m.group("m"))
    if h > 24 or mi > 59:
        return m.group()
    hw = W.one_before_noun(num2words(h, lang="de"), "de")
    return pad(m, f"{hw} Uhr" + (f" {num2words(mi, lang='de')}" if mi else ""))


def _year(m: re.Match) -> str:
    n = int(m.group("y"))
    nxt = re.match(r"\s+([A-ZÄÖÜ][a-zäöüß]+)", m.string[m.end():])
    if prev_word(m) not in YEAR_CUES and nxt and nxt.group(1) not in W.MONTHS_DE:
        return pad(m, say(m.group("y"), "de"))  # "1500 Soldaten"
    return pad(m, year(n, "de"))


def _unit(m: re.Match) -> str:
    one, many = W.UNITS["de"][m.group("u")]
    n = m.group("n")
    words = say(n, "de")
    return pad(m, f"{W.one_before_noun(words, 'de') if n == '1' else words} {one if n == '1' else many}")


def german_rules(num: str) -> list[Rule]:
    units = "|".join(re.escape(u) for u in sorted(W.UNITS["de"], key=len, reverse=True))
    return [
        (re.compile(r"\b(?P<kw>Kapitel|Teil|Band|Buch|Akt|Szene)\s+(?P<r>[IVXLCDM]+)\b(?!\.\w)"),
         lambda m: f"{m.group('kw')} {num2words(roman_to_int(m.group('r')), lang='de')}"),
        (re.compile(r"(?<![\d.])(?P<d>\d{1,2})\.\s?(?P<m>\d{1,2})\.(?:\s?(?P<y>\d{4}|\d{2})(?!\d))?"), _date_numeric),
        (re.compile(rf"(?<![\d.])(?P<d>\d{{1,2}})\.\s*(?P<mon>{_MONTH_ALT})(?!\w)"), _date_named),
        (re.compile(r"(?<![\d.:])(?P<h>\d{1,2})[:.](?P<m>\d{2})\s?Uhr\b"), _time),
        (re.compile(r"(?<![\d.:])(?P<h>\d{1,2}):(?P<m>\d{2})(?![\d:])"), _time),
        (re.compile(r"(?<![\d.:])(?P<h>\d{1,2})\s?Uhr\b"),
         lambda m: pad(m, W.one_before_noun(num2words(int(m.group("h")), lang="de"), "de") + " Uhr")),
        (re.compile(r"(?<![\d.,])(?P<n>\d+(?:,\d+)?)\s?(?P<u>" + units + r")(?![\w/])"), _unit),
        (re.compile(r"(?<![\d.,])(?P<n>\d{1,3})\.\s(?P<noun>[A-ZÄÖÜ][a-zäöüß]+)"), _ordinal_noun),
        range_rule("de", "bis"),
        (re.compile(r"(?<![\d.,$£€])(?P<y>1[1-9]\d{2}|20\d{2})(?![\d%]|[.,]\d)"), _year),
        (re.compile(r"&"), lambda m: " und "),
    ]
