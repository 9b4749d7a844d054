"""Language tags between clients and the model (appliance.languages)."""
from __future__ import annotations

import pytest

from appliance.languages import language_tags, model_language

LANGS = ["auto", "chinese", "english", "german", "japanese", "beijing_dialect", "cantonese"]


def test_tags_of_the_model_languages():
    assert language_tags(LANGS) == ["zh", "en", "de", "ja"]  # no tag for auto, a dialect, an unknown name


@pytest.mark.parametrize("tag,name", [("en", "english"), ("en-US", "english"), ("en_GB", "english"),
                                      ("de-DE", "german"), ("zh-Hans-CN", "chinese"), ("English", "english"),
                                      ("german", "german"), (None, "auto"), ("", "auto"), ("auto", "auto"),
                                      ("sw-KE", "sw-KE")])
def test_model_language(tag, name):
    assert model_language(tag, LANGS) == name
