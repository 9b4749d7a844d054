"""What a reader meets in a narrated EPUB besides the narration itself: the accessibility metadata (schema.org,
as EPUB Accessibility asks) and ARIA roles, checked by Ace by DAISY (marker `ace`: tests/fixtures/ace_install.sh
installs it, ./install.sh --dev runs that; a skip where it is missing, a failure where
$TTS_APPLIANCE_REQUIRE_SYSTEM_TESTS=1, as .ci/run sets it as root); the language it declares; and the read-along
text the page shows from the manifest, which must be the book's own. The books: `narrated` (tests/conftest.py).
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
import zipfile
from pathlib import Path

import pytest

from ace_util import ace, ace_missing, failures
from epub_util import OPF, make_epub, metadata, overlays
from narrated_util import TXT

XHTML = "{http://www.w3.org/1999/xhtml}"
EPUB_TYPE = "{http://www.idpf.org/2007/ops}type"


@pytest.mark.parametrize("kind", [".txt", ".md", ".epub"])
def test_the_read_along_text_is_the_book_as_it_shows(narrated, kind):
    """The read-along text as the manifest lets a player build it (a chapter's title segment its heading, the
    others a paragraph each by their `paragraph`) is the narrated book's own text: each heading once, then its
    paragraphs, none run into another (the page's player showed the title again, run into the first one)."""
    _, manifest, _ = narrated[kind]
    epub = zipfile.ZipFile(manifest["output"]["epub"])
    _, _, found = overlays(epub)
    shown, book = [], []
    for chapter in manifest["chapters"]:
        heading = [e["original"] for e in chapter["segments"] if e["kind"] == "title"]
        assert all(e["paragraph"] is None for e in chapter["segments"] if e["kind"] == "title")
        paragraphs: dict[int, list[str]] = {}
        for e in chapter["segments"]:
            if e["kind"] == "text":
                paragraphs.setdefault(e["paragraph"], []).append(e["original"])
        shown.append((" ".join(heading), [" ".join(p) for _, p in sorted(paragraphs.items())]))
    for _, doc_path in sorted(found.values()):
        root = ET.fromstring(epub.read(doc_path))
        blocks = [" ".join("".join(e.itertext()).split()) for e in root.iter()
                  if e.tag in (XHTML + "h1", XHTML + "h2", XHTML + "p") and not _in_note(root, e)]
        book.append((blocks[0], blocks[1:]))
    if kind == ".epub":  # the book's words as they stand there (the segments' text is tidied: "&", no marker)
        book = [(h, [p.replace("waited1 by", "waited by") for p in ps]) for h, ps in book]
    assert shown == book


def _in_note(root, element) -> bool:
    """Whether `element` lies in a footnote (an aside), which the narration does not read."""
    return any(element in list(aside.iter()) for aside in root.iter(XHTML + "aside"))


def test_the_narration_adds_the_accessibility_metadata_it_makes_true(narrated):
    """schema.org accessibility metadata (EPUB Accessibility): the simple EPUB of a text declares it all, every
    epub:type with its ARIA role; an EPUB input gets what the narration adds (synchronized audio) and, where it
    says nothing, what is known of it (hazards unknown), never a second value for what it declares."""
    for kind in (".txt", ".md"):
        epub = zipfile.ZipFile(narrated[kind][1]["output"]["epub"])
        metas = metadata(overlays(epub)[1])
        assert metas[("schema:accessMode", None)] == ["textual", "auditory"]
        assert metas[("schema:accessModeSufficient", None)] == ["textual"]
        assert metas[("schema:accessibilityFeature", None)] == ["tableOfContents", "readingOrder",
                                                                 "synchronizedAudioText"]
        assert metas[("schema:accessibilityHazard", None)] == ["none"]
        assert "read aloud" in metas[("schema:accessibilitySummary", None)][0]
        roles = {"chapter": "doc-chapter", "toc": "doc-toc"}
        typed = [e for n in epub.namelist() if n.endswith(".xhtml")
                 for e in ET.fromstring(epub.read(n)).iter() if e.get(EPUB_TYPE)]
        assert typed and all(e.get("role") == roles[e.get(EPUB_TYPE)] for e in typed)
    epub = zipfile.ZipFile(narrated[".epub"][1]["output"]["epub"])
    metas = metadata(overlays(epub)[1])
    assert metas[("schema:accessMode", None)] == ["textual", "auditory"]
    assert metas[("schema:accessibilityFeature", None)] == ["synchronizedAudioText"]
    assert metas[("schema:accessibilityHazard", None)] == ["unknown"]


def test_an_epub_keeps_the_accessibility_metadata_it_declares(tmp_path):
    """An input that declares its own: the narration adds only `auditory` and `synchronizedAudioText`."""
    from jobs.ingest import load_document
    from jobs.narrated.accessibility import accessibility_metadata

    declared = ('    <meta property="schema:accessMode">textual</meta>\n'
                '    <meta property="schema:accessMode">visual</meta>\n'
                '    <meta property="schema:accessModeSufficient">textual</meta>\n'
                '    <meta property="schema:accessibilityFeature">alternativeText</meta>\n'
                '    <meta property="schema:accessibilityHazard">none</meta>\n'
                '    <meta property="schema:accessibilitySummary">Images are described.</meta>\n'
                '    <meta name="schema:accessibilityFeature" content="tableOfContents"/>\n')
    opf = OPF.replace("  </metadata>", declared + "  </metadata>")
    path = make_epub(tmp_path / "a11y.epub", {"OEBPS/content.opf": opf})
    package = load_document(path).package
    assert package.accessibility == {
        "schema:accessMode": ["textual", "visual"], "schema:accessModeSufficient": ["textual"],
        "schema:accessibilityFeature": ["alternativeText", "tableOfContents"],
        "schema:accessibilityHazard": ["none"], "schema:accessibilitySummary": ["Images are described."]}
    assert accessibility_metadata(package, generated=False) == [
        ("schema:accessMode", "auditory"), ("schema:accessibilityFeature", "synchronizedAudioText")]


@pytest.mark.parametrize("language, text, expected", [
    ("auto", TXT, "en"),
    ("auto", "Kapitel 1: Der Anfang\n\nEs war ein heller, kalter Tag, und die Uhren schlugen dreizehn. Er lag "
             "auf seinem Bett und sah, wie sich die Tür öffnete. Niemand war mit ihm gekommen.\n", "de"),
    ("french", TXT, "fr"),  # the job's own language, where it names one
])
def test_the_simple_epub_declares_the_language_spoken(tmp_path, language, text, expected):
    """A job in `auto` (the model takes the language from the text) declares the text's language, not `und`."""
    from jobs.queue import Queue
    from jobs.settings import JobSpec, resolve_home
    from jobs.submit import submit_file

    paths = resolve_home(tmp_path / "home").ensure()
    queue = Queue(paths.db)
    try:
        src = tmp_path / "story.txt"
        src.write_text(text, encoding="utf-8")
        job_id, error = submit_file(queue, paths, src, JobSpec(format="epub", language=language))
        assert error is None
        narration = json.loads(queue.job(job_id)["meta"])["narration"]
    finally:
        queue.close()
    epub = zipfile.ZipFile(narration["package"])
    opf = overlays(epub)[1]
    assert [e.text for e in opf.iter("{http://purl.org/dc/elements/1.1/}language")] == [expected]
    for name in epub.namelist():
        if name.endswith(".xhtml"):
            root = ET.fromstring(epub.read(name))
            assert root.get("{http://www.w3.org/XML/1998/namespace}lang") == root.get("lang") == expected


@pytest.mark.ace
@pytest.mark.parametrize("kind", [".txt", ".md"])
def test_ace_finds_nothing_in_a_simple_narrated_epub(narrated, kind, tmp_path):
    """Ace by DAISY: no failed check at all (metadata, ARIA roles, the page checks it runs in chromium)."""
    if ace_missing():
        pytest.skip(ace_missing())
    report = ace(Path(narrated[kind][1]["output"]["epub"]), tmp_path / "ace")
    assert failures(report) == []
    assert report["earl:result"]["earl:outcome"] == "pass"


@pytest.mark.ace
def test_ace_finds_nothing_the_narration_brought_into_an_epub(narrated, tmp_path):
    """An EPUB input keeps its own markup (it is narrated in place): Ace may find in the narrated book what it
    finds in the input (this one's epub:type without ARIA roles), nothing more, and no metadata missing."""
    if ace_missing():
        pytest.skip(ace_missing())
    src, manifest, _ = narrated[".epub"]
    before = failures(ace(src, tmp_path / "before"))
    after = failures(ace(Path(manifest["output"]["epub"]), tmp_path / "after"))
    assert any(rule.startswith("metadata-") for _, rule, _, _ in before)  # so the next line means something
    assert not [f for f in after if f[1].startswith("metadata-")]
    assert not Counter(f[:3] for f in after) - Counter(f[:3] for f in before), after  # no more of any, file by file

