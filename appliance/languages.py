"""Language tags between clients and the model: the checkpoint names its languages (english, german ...),
clients send BCP-47 tags (Home Assistant: `en`, `en-US`, `de-DE`) or names.

    language_tags(["auto", "english", "german"]) -> ["en", "de"]        what Wyoming `info` lists
    model_language("de-DE", languages) -> "german"                      what the engine is asked for

The short code of a tag or name is `jobs.normalize.language_code` (one table for the whole project).
"""
from __future__ import annotations

from typing import Optional, Sequence

from text.normalize import language_code


def language_tags(languages: Sequence[str]) -> list[str]:
    """The BCP-47 primary tags of a model's languages, in its order ('auto' and names without a known
    code left out: language_code keeps an unknown name's first word, which is no 2-3 letter tag)."""
    tags = [language_code(name) for name in languages if name != "auto"]
    return list(dict.fromkeys(t for t in tags if len(t) in (2, 3) and t.isalpha()))


def model_language(tag: Optional[str], languages: Sequence[str]) -> str:
    """The model's language for a client's `tag`: a name it knows as it is ("English" -> "english"), a
    BCP-47 tag by its primary code ("en-US" -> "english"); None, "" and "auto" -> "auto". A tag no
    language of the model has is returned unchanged: the engine refuses it, naming the languages."""
    if not tag or not tag.strip():
        return "auto"
    key = tag.strip().lower()
    if key in languages:
        return key
    code = language_code(tag)
    if not code:
        return "auto"
    for name in languages:
        if name != "auto" and language_code(name) == code:
            return name
    return tag
