"""What a listener hears of a book converted the way people convert books (tests/convert_util.py): pandoc,
calibre's ebook-convert (its defaults) and LibreOffice write one source book into every format they write that
the appliance reads; each file read gives the source body's words (precision and recall >= 99.5%, in order),
without note markers, notes, a table of contents, a title page or alt text, the source's chapters with their
titles, and the book's title and author.

The conversions are made once per session. A tool missing here skips its rows with the reason (marker
`converters`: a failure where TTS_APPLIANCE_REQUIRE_SYSTEM_TESTS=1 for pandoc and calibre, which .ci/run
installs); LibreOffice is optional everywhere, and so is pandoc's PDF (it needs xelatex and a Chinese font).
"""
from __future__ import annotations

import re

import pytest
from convert_util import ALT, AUTHOR, CHAPTERS, CONVERSIONS, NOTES, TITLE, convert_all, differences, \
    precision_recall, source_body, words

from jobs.ingest import load_document

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    return convert_all(tmp_path_factory.mktemp("converted"))


def _plain(text: str) -> str:
    return " ".join((text or "").replace("’", "'").split())


def _marks(c):
    return [pytest.mark.converters] if c.required else []


@pytest.mark.parametrize("name", [pytest.param(c.name, marks=_marks(c), id=c.name) for c in CONVERSIONS])
def test_a_converted_book_reads_as_its_source(converted, name):
    path, skipped, failed = converted[name]
    if skipped:
        pytest.skip(skipped)
    assert failed is None, failed
    doc = load_document(path)
    spoken = [(c.title, c.paragraphs) for c in doc.chapters]
    text = "\n".join(t + "\n" + "\n".join(ps) for t, ps in spoken)
    read, source = words(text), words(source_body())
    precision, recall = precision_recall(read, source)
    assert precision >= 0.995 and recall >= 0.995, (f"precision {precision:.3f} recall {recall:.3f}",
                                                   differences(read, source))
    assert "↩" not in text and not re.search(r"(?<=[^\W\d])[.,;:!?]?\d+(?=\s|$)", text), "a note marker is read"
    for heard in NOTES + [ALT]:
        assert _plain(heard) not in _plain(text), f"{heard!r} is read"
    assert [_plain(c.title) for c in doc.chapters] == CHAPTERS
    assert all(_plain(text).count(title) == 1 for title in CHAPTERS), "a chapter title is read twice (a TOC?)"
    assert (_plain(doc.title), _plain(doc.author)) == (TITLE, AUTHOR)
