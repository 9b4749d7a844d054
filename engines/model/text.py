"""Text facts the model's timing depends on: which characters are CJK, how long text takes to say.

One home for both: the engine's runaway frame limit, the jobs' audio guard and the segmenter's
language guess all use these.
"""
from __future__ import annotations

import re

CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")
CHARS_PER_S = 15.0  # spoken characters per second (alphabetic scripts, spaces not counted)
CJK_CHARS_PER_S = 5.0  # CJK characters per second


def is_cjk(ch: str) -> bool:
    """Kana, CJK ideographs (incl. extension A and compatibility) or Hangul syllables."""
    return CJK_RE.match(ch) is not None


def is_cjk_text(text: str) -> bool:
    """Whether more than 30% of the letters in the first 2000 characters are CJK."""
    letters = [c for c in text[:2000] if c.isalpha()]
    return bool(letters) and sum(1 for c in letters if is_cjk(c)) > 0.3 * len(letters)


def expected_seconds(text: str, chars_per_s: float = CHARS_PER_S, cjk_chars_per_s: float = CJK_CHARS_PER_S) -> float:
    """Rough spoken duration of `text` (no floor): non-space characters over their speaking rates."""
    cjk = sum(1 for ch in text if is_cjk(ch))
    other = sum(1 for ch in text if not ch.isspace()) - cjk
    return cjk / cjk_chars_per_s + other / chars_per_s
