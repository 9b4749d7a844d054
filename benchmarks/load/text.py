"""Text for the open-loop load benchmark: English prompts of 8-28 words and a generated book."""
from __future__ import annotations

import random

CORPUS = [
    "The lighthouse keeper climbed the narrow stairs every evening and lit the lamp before the fog rolled in.",
    "Our train leaves at a quarter past nine, so please bring your ticket and a warm coat.",
    "A small bakery on the corner sells bread that is still warm when the first customers arrive.",
    "The committee will meet again next Tuesday to review the budget and the plans for the new library.",
    "Rain drummed on the tin roof while the children played cards by the light of a single candle.",
    "If the package does not arrive by Friday, call the front desk and ask for a replacement.",
    "He planted tomatoes, beans and a row of sunflowers that grew taller than the garden fence.",
    "The museum opens its new gallery of maps and travel journals to the public this weekend.",
    "Turn left at the old stone bridge, follow the river for a mile, and you will see the farm.",
    "She wrote letters to her grandmother every month and kept the replies in a wooden box.",
    "The weather service expects strong winds along the coast tonight, with heavy rain by morning.",
    "Nobody noticed that the clock in the town hall had stopped at twenty minutes to four.",
    "Please remember to save your work before the system restarts for maintenance at midnight.",
    "The orchestra tuned their instruments as the audience slowly found their seats in the dark hall.",
    "A fox crossed the snowy field at dawn, leaving a neat line of tracks toward the woods.",
    "The recipe calls for two cups of flour, a pinch of salt and three spoonfuls of honey.",
    "When the power came back on, the whole street cheered and the dogs began to bark.",
    "Our guide explained how the monks had copied books by hand for more than three hundred years.",
    "The ferry was late because of the tide, so we watched the gulls and drank hot tea.",
    "Every spring the valley fills with wildflowers, and hikers come from far away to see them.",
    "The engineer checked each bolt twice before she let the crane lift the steel beam.",
    "I would like a table for four near the window, if one is free at seven o'clock.",
    "The old map showed a path through the marsh that no longer existed on any modern chart.",
    "After the long winter the harbor came back to life with fishing boats and market stalls.",
]
WORDS = " ".join(CORPUS).split()
STARTS = [sum(len(s.split()) for s in CORPUS[:i]) for i in range(len(CORPUS))]  # sentence starts in WORDS


def prompt(rng: random.Random, lo: int = 8, hi: int = 28) -> str:
    """An English prompt of `lo`..`hi` words (uniform): a run of the corpus from a random sentence start."""
    k = rng.randint(lo, hi)
    start = rng.choice([s for s in STARTS if s + k <= len(WORDS)])
    words = WORDS[start:start + k]
    text = " ".join(words).rstrip(",;:.")
    return text[0].upper() + text[1:] + "."


def book_text(segments: int, per_chapter: int = 25, seed: int = 0) -> str:
    """Plain text of chapters ("Chapter N" headings) of paragraphs of two corpus sentences (under the
    segmenter's 300 characters, so each paragraph is about one segment; each numbered, so no two are
    alike): about `segments` segments,
    chapter headings included."""
    rng = random.Random(seed)
    chapters = max(1, round(segments / (per_chapter + 1)))
    paragraphs = max(1, segments - chapters)
    parts = []
    for c in range(chapters):
        parts.append(f"Chapter {c + 1}")
        n = paragraphs // chapters + (1 if c < paragraphs % chapters else 0)
        for i in range(n):  # numbered: every paragraph distinct, none served from the audio cache
            parts.append(" ".join([f"Part {i + 1} of chapter {c + 1}."] + rng.sample(CORPUS, 2)))
    return "\n\n".join(parts) + "\n"
