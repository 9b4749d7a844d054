"""Abbreviation expansion for English and German (whole-word, capitalization-aware)."""
from __future__ import annotations

import re
from typing import Callable

# (abbreviation, expansion, may end a sentence). Internal spaces are optional ("z.B." == "z. B.").
EN = [
    ("Mr.", "Mister", False), ("Mrs.", "Missus", False), ("Ms.", "Miz", False), ("Dr.", "Doctor", False),
    ("Prof.", "Professor", False), ("Jr.", "Junior", True), ("Sr.", "Senior", True), ("Mt.", "Mount", False),
    ("Capt.", "Captain", False), ("Gen.", "General", False), ("Col.", "Colonel", False), ("Lt.", "Lieutenant", False),
    ("Sgt.", "Sergeant", False), ("Rev.", "Reverend", False), ("Gov.", "Governor", False), ("Sen.", "Senator", False),
    ("e.g.", "for example", False), ("i.e.", "that is", False), ("etc.", "et cetera", True), ("vs.", "versus", False),
    ("vs", "versus", False), ("approx.", "approximately", False), ("cf.", "compare", False), ("Inc.", "Incorporated", True),
    ("Ltd.", "Limited", True), ("Corp.", "Corporation", True), ("Ave.", "Avenue", True), ("Blvd.", "Boulevard", True),
    ("Dept.", "Department", False), ("Univ.", "University", False), ("et al.", "and others", True),
]
DE = [
    ("z.B.", "zum Beispiel", False), ("usw.", "und so weiter", True), ("u.s.w.", "und so weiter", True),
    ("bzw.", "beziehungsweise", False), ("d.h.", "das heißt", False), ("u.a.", "unter anderem", True),
    ("ca.", "circa", False), ("Dr.", "Doktor", False), ("Prof.", "Professor", False), ("Hr.", "Herr", False),
    ("Hrn.", "Herrn", False), ("Fr.", "Frau", False), ("St.", "Sankt", False), ("Str.", "Straße", True),
    ("evtl.", "eventuell", False), ("ggf.", "gegebenenfalls", False), ("vgl.", "vergleiche", False),
    ("inkl.", "inklusive", False), ("zzgl.", "zuzüglich", False), ("Mio.", "Millionen", True),
    ("Mrd.", "Milliarden", True), ("Tsd.", "Tausend", True), ("etc.", "et cetera", True), ("bspw.", "beispielsweise", False),
    ("sog.", "sogenannte", False), ("v. Chr.", "vor Christus", True), ("n. Chr.", "nach Christus", True),
    ("Jh.", "Jahrhundert", True), ("o.ä.", "oder ähnliches", True), ("u.U.", "unter Umständen", False),
    ("z.T.", "zum Teil", False), ("i.d.R.", "in der Regel", False), ("Abs.", "Absatz", False),
]
# Abbreviations only expanded before a number.
EN_NUM = [("No.", "number"), ("Nos.", "numbers"), ("Fig.", "figure"), ("Vol.", "volume"), ("p.", "page"),
          ("pp.", "pages"), ("Ch.", "chapter"), ("Chap.", "chapter"), ("#", "number"),
          ("Jan.", "January"), ("Feb.", "February"), ("Mar.", "March"), ("Apr.", "April"), ("Jun.", "June"),
          ("Jul.", "July"), ("Aug.", "August"), ("Sep.", "September"), ("Sept.", "September"),
          ("Oct.", "October"), ("Nov.", "November"), ("Dec.", "December")]
DE_NUM = [("Nr.", "Nummer"), ("S.", "Seite"), ("Abb.", "Abbildung"), ("Bd.", "Band"), ("Kap.", "Kapitel"),
          ("Tel.", "Telefon"), ("#", "Nummer")]

Rule = tuple[re.Pattern, Callable[[re.Match], str]]


def _body(abbr: str) -> str:
    parts = re.split(r"(?<=\.)\s*", abbr.strip())
    return r"\s?".join(re.escape(p.strip()) for p in parts if p)


def _cap(found: str, repl: str) -> str:
    if found[:1].isupper() and repl[:1].islower():
        return repl[0].upper() + repl[1:]
    return repl


def _compile(table, num_table, lang: str) -> list[Rule]:
    rules: list[Rule] = []
    for abbr, expansion, can_end in sorted(table, key=lambda t: -len(t[0])):
        lower = abbr[0].islower()
        body = _body(abbr)
        flags = re.I if lower and "." in abbr else 0
        rx = re.compile(rf"(?<![\w.]){body}(?!\w)(?P<after>\s+(?=[A-ZÄÖÜ])|$)?", flags)

        def repl(m, expansion=expansion, can_end=can_end, lower=lower):
            out = _cap(m.group(), expansion) if lower else expansion
            after = m.group("after")
            if can_end and after is not None and (after == "" or lang == "en"):
                return out + "." + after  # abbreviation also ended the sentence
            return out + (after or "")

        rules.append((rx, repl))
    # St. in English: Saint before a name, Street otherwise
    if lang == "en":
        rules.append((re.compile(r"(?<![\w.])St\.(?=\s+[A-Z])"), lambda m: "Saint"))
        rules.append((re.compile(r"(?<![\w.])St\.(?P<end>\s*$)?"), lambda m: "Street." if m.group("end") is not None else "Street"))
    for abbr, expansion in num_table:
        rx = re.compile(rf"(?<![\w.]){_body(abbr)}\s?(?=\d)", re.I if abbr[0].islower() else 0)
        rules.append((rx, lambda m, e=expansion: (_cap(m.group(), e) if m.start() == 0 else e) + " "))
    return rules


RULES = {"en": _compile(EN, EN_NUM, "en"), "de": _compile(DE, DE_NUM, "de")}


def expand_abbreviations(text: str, lang: str) -> str:
    """Expand the language's common abbreviations; unknown languages are returned unchanged."""
    for rx, repl in RULES.get(lang, ()):
        text = rx.sub(repl, text)
    return text
