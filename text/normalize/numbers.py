"""Numbers to words with ``num2words``: years, times, currency, percentages, ordinals, dates, decimals.

English and German have full rule sets; other languages supported by num2words get
plain numbers, decimals and percentages; unsupported ones are left unchanged.
"""
from __future__ import annotations

import re
from decimal import Decimal
from typing import Optional

from num2words import CONVERTER_CLASSES, num2words

from text.normalize import words as W
from text.normalize.rules_de import german_rules
from text.normalize.rules_en import english_rules
from text.normalize.spoken import DECIMAL_COMMA, Rule, pad, say, to_decimal


def supported(lang: str) -> bool:
    return lang in CONVERTER_CLASSES


def _num_re(lang: str) -> str:
    if lang in DECIMAL_COMMA:
        return r"(?:\d{1,3}(?:\.\d{3})+|\d+)(?:,\d+)?"
    return r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"


def _currency_rules(lang: str, num: str) -> list[Rule]:
    table = W.CURRENCIES.get(lang)
    if not table:
        return []
    syms = "|".join(re.escape(k) for k in sorted(table, key=len, reverse=True))
    scale = W.SCALES[lang]
    scale_re = "|".join(sorted((re.escape(k) for k in scale), key=len, reverse=True))

    def render(amount: str, code: str, sc: Optional[str]) -> str:
        one, many, sub_one, sub_many = table[code]
        if sc:
            return f"{say(amount, lang)} {scale[sc.lower() if sc.lower() in scale else sc]} {many}"
        value = to_decimal(amount, lang)
        whole = int(value)
        cents = int((value - whole) * 100 + Decimal("0.5")) if sub_one else 0
        whole_w = W.one_before_noun(num2words(whole, lang=lang), lang)
        parts = []
        if whole or not cents:
            parts.append(f"{whole_w} {one if whole == 1 else many}")
        if cents:
            cw = W.one_before_noun(num2words(cents, lang=lang), lang)
            parts.append(f"{cw} {sub_one if cents == 1 else sub_many}")
        return f" {W.AND[lang]} ".join(parts)

    before = re.compile(rf"(?P<sym>{syms})\s?(?P<amt>{num})(?:\s?(?P<sc>{scale_re})(?![\w]))?")
    after = re.compile(rf"(?<![\w.,])(?P<amt>{num})(?:\s?(?P<sc>{scale_re}))?\s?(?P<sym>{syms})(?![\w])")
    return [
        (before, lambda m: pad(m, render(m.group("amt"), table_key(table, m.group("sym")), m.group("sc")))),
        (after, lambda m: pad(m, render(m.group("amt"), table_key(table, m.group("sym")), m.group("sc")))),
    ]


def table_key(table: dict, sym: str) -> str:
    return sym if sym in table else sym.upper()


def rules_for(lang: str) -> list[Rule]:
    """Ordered (regex, replacement) rules for ``lang``."""
    num = _num_re(lang)
    rules: list[Rule] = []
    rules += _currency_rules(lang, num)
    if lang == "en":
        rules += english_rules(num)
    elif lang == "de":
        rules += german_rules(num)
    pct = W.PERCENT.get(lang)
    if pct:
        rules.append((re.compile(rf"(?P<neg>(?<![\w.,])[-−])?(?P<n>{num})\s?%"),
                      lambda m: pad(m, (W.MINUS.get(lang, "minus") + " " if m.group("neg") else "") + say(m.group("n"), lang) + " " + pct)))
    if lang in W.MINUS:
        rules.append((re.compile(rf"(?<![\w.,)])[-−](?=\d)"), lambda m: W.MINUS[lang] + " "))
    rules.append((re.compile(rf"(?<![\d.,])(?:{num})(?![\d])"), lambda m: pad(m, say(m.group(), lang))))
    return rules


_CACHE: dict[str, list[Rule]] = {}


def expand_numbers(text: str, lang: str) -> str:
    """Spell out numbers in ``text`` for ``lang``; unsupported languages are returned unchanged."""
    if not supported(lang):
        return text
    if lang not in _CACHE:
        _CACHE[lang] = rules_for(lang)
    for rx, fn in _CACHE[lang]:
        text = rx.sub(fn, text)
    return text
