"""English-only number rules: times, ordinals, decades, years, ranges, units, Roman chapter numbers."""
from __future__ import annotations

import re

from num2words import num2words

from text.normalize import words as W
from text.normalize.spoken import Rule, pad, prev_word, range_rule, say, year

YEAR_CUES = {
    "in", "since", "by", "from", "until", "till", "of", "year", "years", "during", "before", "after", "around",
    "circa", "c", "ca", "early", "late", "mid", "spring", "summer", "autumn", "fall", "winter", "between", "and",
    "to", "through", "born", "died", "till", "about",
} | {m.lower() for m in W.MONTHS_EN}
COUNT_CUES = {"over", "under", "nearly", "almost", "than", "exactly", "some", "approximately", "only", "just"}
NOT_PLURAL = {"was", "is", "has", "as", "this", "its", "his", "us", "yes", "does", "goes", "always", "perhaps"}
ROMAN = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def roman_to_int(s: str) -> int:
    total, prev = 0, 0
    for ch in reversed(s.upper()):
        v = ROMAN[ch]
        total += -v if v < prev else v
        prev = max(prev, v)
    return total


def _time(m: re.Match) -> str:
    h, mi, ampm = int(m.group("h")), int(m.group("m")), m.group("ampm")
    if h > 24 or mi > 59:
        return m.group()
    hw = num2words(h)
    if mi == 0:
        words = f"{hw} o'clock" if not ampm else hw
    elif mi < 10:
        words = f"{hw} oh {num2words(mi)}"
    else:
        words = f"{hw} {num2words(mi)}"
    if ampm:
        words += " AM" if ampm[0].lower() == "a" else " PM"
    return pad(m, words) + _kept_period(m, ampm)


def _kept_period(m: re.Match, ampm) -> str:
    """"at 7 p.m." at a sentence end: the abbreviation's dot was also the full stop."""
    if ampm and ampm.endswith(".") and re.match(r"$|\s+[A-Z]", m.string[m.end():]):
        return "."
    return ""


def _year(m: re.Match) -> str:
    n = int(m.group("y"))
    after = m.string[m.end():]
    nxt = re.match(r"\s+([a-z]+)", after)
    prev = prev_word(m)
    if prev in COUNT_CUES and prev not in YEAR_CUES:
        return pad(m, say(m.group("y"), "en"))
    if prev not in YEAR_CUES and nxt and nxt.group(1).endswith("s") and nxt.group(1) not in NOT_PLURAL:
        return pad(m, say(m.group("y"), "en"))  # "1500 soldiers"
    return pad(m, year(n, "en"))


def _decade(m: re.Match) -> str:
    n = int(m.group("d"))
    words = year(n, "en") if n >= 1000 else num2words(n)
    if words.endswith("y"):
        words = words[:-1] + "ies"
    else:
        words += "s"
    return pad(m, words)


def _unit(m: re.Match) -> str:
    one, many = W.UNITS["en"][m.group("u")]
    n = m.group("n")
    return pad(m, f"{say(n, 'en')} {one if n in ('1', '1.0') else many}")


def english_rules(num: str) -> list[Rule]:
    units = "|".join(re.escape(u) for u in sorted(W.UNITS["en"], key=len, reverse=True))
    return [
        (re.compile(r"\b(?P<kw>chapter|part|book|volume|act|scene|section)\s+(?P<r>[IVXLCDM]+)\b(?!\.\w)", re.I),
         lambda m: f"{m.group('kw')} {num2words(roman_to_int(m.group('r')))}" if re.fullmatch(r"[IVXLCDM]+|[ivxlcdm]+", m.group("r")) else m.group()),
        (re.compile(r"(?<![\d:])(?P<h>\d{1,2}):(?P<m>\d{2})(?::\d{2})?(?:\s?(?P<ampm>[aApP]\.?[mM]\.?)(?!\w))?(?![\d:])"), _time),
        (re.compile(r"(?<![\d:.])(?P<h>\d{1,2})(?P<m>)\s?(?P<ampm>[aApP]\.?[mM]\.?)(?!\w)"),
         lambda m: pad(m, f"{num2words(int(m.group('h')))} {'AM' if m.group('ampm')[0] in 'aA' else 'PM'}")
         + _kept_period(m, m.group("ampm"))),
        (re.compile(r"(?<![\d.,])(?P<n>\d+(?:\.\d+)?)\s?(?P<u>" + units + r")(?![\w/])"), _unit),
        (re.compile(r"(?<![\d.,])(?P<n>\d{1,3}(?:,\d{3})*|\d+)(?P<suf>st|nd|rd|th)\b", re.I),
         lambda m: pad(m, num2words(int(m.group("n").replace(",", "")), to="ordinal"))),
        (re.compile(r"(?<![\w'’])['’]?(?P<d>\d{1,3}0)s\b"), _decade),
        range_rule("en", "to"),
        (re.compile(r"(?<![\d.,$£€])(?P<y>1[1-9]\d{2}|20\d{2})(?![\d%]|[.,]\d)"), _year),
        (re.compile(r"&"), lambda m: " and "),
    ]
