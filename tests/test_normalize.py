"""Text normalization: numbers, dates, currency, abbreviations, Unicode cleanup, user lexicon."""
from __future__ import annotations

import pytest

from text.normalize import Lexicon, language_code, normalize
from text.normalize.lexicon import LexiconError


@pytest.mark.parametrize(
    "text,expected",
    [
        ("In 1984, it rained.", "In nineteen eighty-four, it rained."),
        ("1984 was a year.", "nineteen eighty-four was a year."),
        ("1500 soldiers came.", "one thousand five hundred soldiers came."),
        ("It costs $5.20.", "It costs five dollars and twenty cents."),
        ("It costs $1 or €3.", "It costs one dollar or three euros."),
        ("They paid £1m.", "They paid one million pounds."),
        ("It is 3:45 pm now.", "It is three forty-five PM now."),
        ("Meet at 7 a.m. Then go.", "Meet at seven AM. Then go."),
        ("At 3:05 and 4:00.", "At three oh five and four o'clock."),
        ("Rates rose 12.5%.", "Rates rose twelve point five percent."),
        ("It was -5 degrees.", "It was minus five degrees."),
        ("Pi is 3.14 roughly.", "Pi is three point one four roughly."),
        ("The 1st, 2nd, 3rd and 21st.", "The first, second, third and twenty-first."),
        ("The 1980s and the '90s.", "The nineteen eighties and the nineties."),
        ("From 1990-1995 it grew.", "From nineteen ninety to nineteen ninety-five it grew."),
        ("Pages 10-20.", "Pages ten to twenty."),
        ("1,234,567 people", "one million two hundred and thirty-four thousand five hundred and sixty-seven people"),
        ("Agent 007.", "Agent zero zero seven."),
        ("Dr. Smith met Mr. and Mrs. Jones.", "Doctor Smith met Mister and Missus Jones."),
        ("St. Paul lives on Main St.", "Saint Paul lives on Main Street."),
        ("Fruit, e.g. apples, i.e. food.", "Fruit, for example apples, that is food."),
        ("Apples, pears, etc.", "Apples, pears, et cetera."),
        ("Cats vs. dogs", "Cats versus dogs"),
        ("See No. 5 on Jan. 3.", "See number five on January three."),
        ("Chapter IV", "Chapter four"),
        ("Tom & Jerry", "Tom and Jerry"),
        ("5 km at 30 mph", "five kilometers at thirty miles per hour"),
    ],
)
def test_english(text, expected):
    assert normalize(text, "en") == expected


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Am 3. Oktober 1990 war es 14:30 Uhr.", "Am dritten Oktober neunzehnhundertneunzig war es vierzehn Uhr dreißig."),
        ("Der 3. Oktober ist ein Feiertag.", "Der dritte Oktober ist ein Feiertag."),
        ("Treffen am 3.10.1990 um 8 Uhr.", "Treffen am dritten Oktober neunzehnhundertneunzig um acht Uhr."),
        ("Im 19. Jahrhundert lebten 1500 Menschen.", "Im neunzehnten Jahrhundert lebten eintausendfünfhundert Menschen."),
        ("Das kostet 5,20 € bzw. 1 Euro.", "Das kostet fünf Euro und zwanzig Cent beziehungsweise ein Euro."),
        ("Es waren 12,5 % mehr.", "Es waren zwölf Komma fünf Prozent mehr."),
        ("Es gab -3 Grad und 1.000 Leute.", "Es gab minus drei Grad und eintausend Leute."),
        ("z.B. Nr. 5 usw.", "zum Beispiel Nummer fünf und so weiter."),
        ("z. B. d. h. ca. 3", "zum Beispiel das heißt circa drei"),
        ("Dr. Müller wohnt in der Goethe Str. 5.", "Doktor Müller wohnt in der Goethe Straße fünf."),
        ("1984 war ein Jahr.", "neunzehnhundertvierundachtzig war ein Jahr."),
        ("Kapitel IV", "Kapitel vier"),
    ],
)
def test_german(text, expected):
    assert normalize(text, "de") == expected


def test_german_currency_one():
    assert normalize("Es kostet 1 €.", "de") == "Es kostet ein Euro."


def test_cleanup():
    assert normalize("a\x00b\x07c\u200bd  \t e\u00a0f", "en") == "a b cd e f"
    assert normalize("Wait… what. . . no", "en") == "Wait... what... no"
    assert normalize("“Smart” quotes ‘kept’", "en") == "“Smart” quotes ‘kept’"
    assert normalize("ﬁne -- dash", "en") == "fine — dash"
    assert normalize("  \n\t ", "en") == ""


def test_chinese_keeps_characters():
    out = normalize("我有3个苹果。今天很好！", "zh")
    assert "我有" in out and "个苹果。今天很好！" in out


def test_other_language_best_effort_and_unknown():
    assert normalize("Il a 3,5 ans et 20 %", "fr") == "Il a trois virgule cinq ans et vingt pour cent"
    assert normalize("Dr. Smith 42", "xx") == "Dr. Smith 42"


def test_language_codes():
    assert language_code("en-US") == "en"
    assert language_code("German") == "de"
    assert language_code("zh_CN") == "zh"
    assert language_code("auto") == ""
    assert language_code(None) == ""


# ---------------------------------------------------------------- lexicon

def test_lexicon_whole_word_and_case(tmp_path):
    lex = Lexicon.from_dict({"qwen": "chwen", "US": "United States", "New York City": "the big apple", "New York": "NY"})
    assert normalize("Qwen and qwen, not Qwentin.", "en", lex) == "Chwen and chwen, not Qwentin."
    assert normalize("The US told us.", "en", lex) == "The United States told us."
    assert normalize("New York City and New  York.", "en", lex) == "the big apple and NY."


def test_lexicon_runs_before_other_rules():
    lex = Lexicon.from_dict({"Dr.": "Drive", "2B": "to be"})
    assert normalize("Mulholland Dr. is long.", "en", lex) == "Mulholland Drive is long."
    assert normalize("2B or not 2B", "en", lex) == "to be or not to be"


def test_lexicon_load_formats_and_merge(tmp_path):
    flat = tmp_path / "flat.yaml"
    flat.write_text("nginx: engine x\nSQL: sequel\n", encoding="utf-8")
    listed = tmp_path / "list.yaml"
    listed.write_text("- word: SQL\n  replacement: S Q L\n- {word: k8s, replacement: kubernetes}\n", encoding="utf-8")
    nested = tmp_path / "nested.yaml"
    nested.write_text("entries:\n  gif: jif\n", encoding="utf-8")
    merged = Lexicon.load(flat).merge(Lexicon.load(listed)).merge(Lexicon.load(nested))
    assert len(merged) == 4
    assert normalize("Nginx, SQL, k8s and a GIF", "en", merged) == "Engine x, S Q L, kubernetes and a Jif"


def test_lexicon_errors(tmp_path):
    with pytest.raises(LexiconError, match="not found"):
        Lexicon.load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [unclosed\n", encoding="utf-8")
    with pytest.raises(LexiconError, match="YAML"):
        Lexicon.load(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n", encoding="utf-8")
    with pytest.raises(LexiconError):
        Lexicon.load(scalar)
    assert len(Lexicon.load(_empty(tmp_path))) == 0


def _empty(tmp_path):
    p = tmp_path / "empty.yaml"
    p.write_text("", encoding="utf-8")
    return p
