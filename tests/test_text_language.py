"""text.language.guess_language: the language a text is in, where nothing says (a narrated EPUB's language for a
job in `auto`): by script, then by common words; "" where it cannot tell, never a guess on too little."""
from __future__ import annotations

import pytest

from text.language import guess_language, spoken_language

SAMPLES = {
    "en": "It was a bright cold day in April, and the clocks were striking thirteen. Winston Smith, his chin "
          "nuzzled into his breast in an effort to escape the vile wind, slipped quickly through the glass doors.",
    "de": "Als Gregor Samsa eines Morgens aus unruhigen Träumen erwachte, fand er sich in seinem Bett zu einem "
          "ungeheueren Ungeziefer verwandelt. Er lag auf seinem panzerartig harten Rücken und sah den Bauch.",
    "fr": "Longtemps, je me suis couché de bonne heure. Parfois, à peine ma bougie éteinte, mes yeux se fermaient "
          "si vite que je n'avais pas le temps de me dire: je m'endors. Et, une demi-heure après, la pensée "
          "qu'il était temps de chercher le sommeil m'éveillait.",
    "es": "En un lugar de la Mancha, de cuyo nombre no quiero acordarme, no ha mucho tiempo que vivía un hidalgo "
          "de los de lanza en astillero. Una olla de algo más vaca que carnero, salpicón las más noches, duelos y "
          "quebrantos los sábados, consumían las tres partes de su hacienda.",
    "it": "Nel mezzo del cammin di nostra vita mi ritrovai per una selva oscura, ché la diritta via era smarrita. "
          "Quel ramo del lago di Como, che volge a mezzogiorno, tra due catene non interrotte di monti.",
    "pt": "Uma noite destas, vindo da cidade para o Engenho Novo, encontrei no trem da Central um rapaz aqui do "
          "bairro, que eu conheço de vista e de chapéu. Cumprimentou-me, sentou-se ao pé de mim, falou da lua e "
          "dos ministros.",
    "nl": "Het was een koude dag en de klokken sloegen dertien. Hij liep naar huis, maar zijn vrouw was er niet. "
          "Ik weet niet wat je van hem wilt.",
    "ru": "Все счастливые семьи похожи друг на друга, каждая несчастливая семья несчастлива по-своему.",
    "uk": "Усі щасливі родини схожі між собою, кожна нещаслива родина нещаслива по-своєму. Він ішов додому.",
    "zh": "那是最美好的时代，那是最糟糕的时代。今天天气很好，我们去公园散步吧。",
    "ja": "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。",
    "ko": "모든 행복한 가정은 서로 닮았지만, 불행한 가정은 모두 저마다의 이유로 불행하다.",
}


@pytest.mark.parametrize("tag", sorted(SAMPLES))
def test_a_text_is_told_by_its_language(tag):
    assert guess_language([SAMPLES[tag]]) == tag


def test_too_little_or_nothing_to_tell_gives_no_answer():
    assert guess_language([]) == ""
    assert guess_language(["Hello world. 1234"]) == ""  # too few words to tell
    assert guess_language(["12 345 -- 678"]) == ""
    assert guess_language(["de la que en a de la que en a de la que en a"]) == ""  # words of several languages


def test_it_reads_the_start_of_a_long_text():
    """A book's paragraphs, one by one: the first SAMPLE_CHARS decide, the rest is not read."""
    seen = []

    def paragraphs():
        for _ in range(10_000):
            seen.append(1)
            yield SAMPLES["fr"]

    assert guess_language(paragraphs()) == "fr" and len(seen) < 100


def test_the_spoken_language_is_the_jobs_else_the_texts():
    """What a manifest and a narrated EPUB declare: the job's language as a tag, a job set to auto the guess,
    "und" where nothing tells."""
    assert spoken_language("german", [SAMPLES["fr"]]) == "de"  # the job says so: the text is not read
    assert spoken_language("en-US", []) == "en" and spoken_language("chinese", []) == "zh"
    assert spoken_language("auto", [SAMPLES["zh"]]) == "zh" and spoken_language(None, [SAMPLES["ru"]]) == "ru"
    assert spoken_language("auto", ["12 345"]) == "und"
