"""Document ingestion: formats, chapter detection, skipping, and every kind of bad input."""
from __future__ import annotations

import hashlib
import time
import os
import zipfile
from pathlib import Path

import pytest

from jobs.errors import IngestError, JobError
from jobs.ingest import IngestOptions, load_document

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(range(256)) * 4


def write(tmp_path: Path, name: str, content) -> Path:
    p = tmp_path / name
    if isinstance(content, str):
        p.write_text(content, encoding="utf-8")
    else:
        p.write_bytes(content)
    return p


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


# ---------------------------------------------------------------- plain text

BOOK = """The Great Book
by Somebody

Contents

Chapter 1: The Beginning
Chapter 2: The Middle
Chapter 3: The End

CHAPTER 1: The Beginning

It was a dark and stormy night.[1] The rain fell
in torrents, except at occasional intervals.

Second paragraph here.

[1] A footnote text.

Chapter 2: The Middle

Middle text. Mr. Smith went to Washington.

* * *

After the break.

Chapter 3: The End

Final words.
"""


def test_text_chapters_toc_and_footnotes(tmp_path):
    doc = load_document(write(tmp_path, "book.txt", BOOK))
    titles = [c.title for c in doc.chapters]
    assert titles == ["CHAPTER 1: The Beginning", "Chapter 2: The Middle", "Chapter 3: The End"]
    assert (doc.title, doc.author) == ("The Great Book", "Somebody")  # the title block is metadata, not read
    ch1 = doc.chapters[0].paragraphs
    assert ch1[0] == "It was a dark and stormy night. The rain fell in torrents, except at occasional intervals."
    assert ch1 == [ch1[0], "Second paragraph here."]  # footnote block at chapter end dropped
    assert doc.chapters[1].paragraphs == ["Middle text. Mr. Smith went to Washington.", "After the break."]
    assert doc.source_format == "txt"
    assert not any("Contents" in p for c in doc.chapters for p in c.paragraphs)


def test_text_keep_footnotes_and_toc_when_asked(tmp_path):
    doc = load_document(write(tmp_path, "book.txt", BOOK), IngestOptions(skip_toc=False, skip_footnotes=False))
    text = " ".join(p for c in doc.chapters for p in c.paragraphs)
    assert "[1]" in text and "A footnote text." in text
    assert any(c.title.startswith("Contents") for c in doc.chapters)


def test_text_heading_styles(tmp_path):
    text = (
        "PROLOGUE\n\nIt began.\n\nCHAPTER IV\n\nRoman numerals work.\n\nChapter Twelve\n\nWords work.\n\n"
        "Part One\n\nChapter 1\n\nStacked headings merge.\n\nThe Title\n=========\n\nUnderlined.\n\nEpilogue\n\nDone.\n"
    )
    doc = load_document(write(tmp_path, "h.txt", text))
    assert [c.title for c in doc.chapters] == [
        "PROLOGUE", "CHAPTER IV", "Chapter Twelve", "Part One. Chapter 1", "The Title", "Epilogue"
    ]
    assert doc.chapters[3].paragraphs == ["Stacked headings merge."]


def test_gutenberg_style_subtitle(tmp_path):
    text = (
        "CHAPTER I.\n\nDown the Rabbit-Hole\n\n\nAlice was beginning to get very tired of sitting by her sister on the\n"
        "bank, and of having nothing to do.\n\nCHAPTER II.\n\nThe Pool of Tears\n\n\n\"Curiouser and curiouser!\" cried"
        " Alice (she was so much surprised, that\nfor the moment she quite forgot how to speak good English).\n"
    )
    doc = load_document(write(tmp_path, "alice.txt", text))
    assert [c.title for c in doc.chapters] == ["CHAPTER I. Down the Rabbit-Hole", "CHAPTER II. The Pool of Tears"]
    assert doc.chapters[0].paragraphs[0].startswith("Alice was beginning")


def test_no_headings_is_one_chapter_and_sentence_mentions_are_not_headings(tmp_path):
    text = "First paragraph mentions\nChapter 12 of the report in passing.\n\nChapter 3 of the manual explains it.\n"
    doc = load_document(write(tmp_path, "plain.txt", text))
    assert len(doc.chapters) == 1 and doc.chapters[0].title == ""
    assert len(doc.chapters[0].paragraphs) == 2


def test_one_paragraph_per_line_mode(tmp_path):
    lines = [f"This is paragraph number {i} and it is long enough to look like a real paragraph of prose text." * 2
             for i in range(5)]
    doc = load_document(write(tmp_path, "lines.txt", "\n".join(lines)))
    assert len(doc.chapters[0].paragraphs) == 5


@pytest.mark.parametrize(
    "encoding,text",
    [
        ("utf-8-sig", "Grüße aus München — “quoted”."),
        ("utf-16", "Grüße aus München, schöne Straße."),
        ("utf-16-le", "Plain UTF-16 without a byte order mark, ümlaut."),
        ("cp1252", "Café déjà vu, naïve résumé — “quotes” and the façade of the château were beautiful."),
        ("latin-1", "Die Straße in München war schön, und die Bäume waren grün. Größe und Höhe."),
        ("cp1251", "Привет, как дела? Это тест русского текста, который написан в старой кодировке."),
    ],
)
def test_encodings(tmp_path, encoding, text):
    doc = load_document(write(tmp_path, "enc.txt", text.encode(encoding)))
    assert doc.chapters[0].paragraphs == [text]


def test_markdown(tmp_path):
    md = (
        "# My Book\n\n## Chapter One\n\nSome **bold** and *italic* text with a [link](http://x.com) and `code`.[^1]\n\n"
        "- item one\n- item two\n\n```\nprint('code block')\n```\n\nSecond Chapter\n--------------\n\n"
        "> A quote with ![img](a.png) an image.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n[^1]: The footnote.\n"
    )
    doc = load_document(write(tmp_path, "b.md", md))
    assert doc.title == "My Book"
    assert [c.title for c in doc.chapters] == ["Chapter One", "Second Chapter"]
    assert doc.chapters[0].paragraphs == ["Some bold and italic text with a link and code.", "item one", "item two"]
    assert doc.chapters[1].paragraphs == ["A quote with an image.", "a, b", "1, 2"]
    assert "footnote" not in " ".join(doc.chapters[1].paragraphs)


# ---------------------------------------------------------------- HTML

def test_html_and_broken_html(tmp_path):
    html = (
        '<html lang="de"><head><title>Kaputt</title><style>p{color:red}</style></head><body>'
        "<h1>Kapitel 1<p>Hallo <b>Welt<p>Zweiter Absatz<sup><a href='#fn1'>1</a></sup> hier</div></span>"
        "<h1>Kapitel 2</h1><p>Text &amp; mehr &lt;3<aside epub:type='footnote' id='fn1'>Fußnote</aside>"
        "<script>alert(1)</script><p>Unclosed <i>italic and <b>bold"
    )
    doc = load_document(write(tmp_path, "b.html", html))
    assert doc.title == "Kaputt" and doc.language == "de"
    assert [c.title for c in doc.chapters] == ["Kapitel 1", "Kapitel 2"]
    assert doc.chapters[0].paragraphs == ["Hallo Welt", "Zweiter Absatz hier"]
    assert doc.chapters[1].paragraphs == ["Text & mehr <3", "Unclosed italic and bold"]


def test_html_garbage_still_produces_text(tmp_path):
    html = "<<<div><p>Some text</x></y><p <b>More</i> text <!-- unterminated comment"
    doc = load_document(write(tmp_path, "g.htm", html))
    assert "Some text" in " ".join(doc.chapters[0].paragraphs)


@pytest.mark.parametrize("closed", [False, True])
def test_html_deep_nesting_is_linear(tmp_path, closed):
    """Nested <div>s (closed or not, with stray end tags): each tag costs O(1), so 4 times the tags take about
    4 times the work (the old parser walked the whole tag stack per tag: ~2,000 times the work here, and minutes
    for 50,000 tags). The work is counted, not timed: the Python lines the parse runs (the parser's own and
    html.parser's), the same on any machine and under any load; a count past 5 times stops the parse."""
    import sys

    class TooMuch(Exception):
        pass

    def parse(n: int, limit: float) -> tuple[int, list]:
        html = "<html><body>" + "<div>x " * n + ("</div>" * n if closed else "</span>" * n) + "<p>End.</p>"
        path = write(tmp_path, f"deep{n}.html", html)
        lines = 0

        def trace(frame, event, arg):
            nonlocal lines
            if event == "line":
                lines += 1
                if lines > limit:
                    raise TooMuch
            return trace

        sys.settrace(trace)
        try:
            doc = load_document(path)
        except TooMuch:
            doc = None
        finally:
            sys.settrace(None)
        return lines, [p for c in doc.chapters for p in c.paragraphs] if doc else []

    n = 8_000
    small, _ = parse(n // 4, float("inf"))
    large, paras = parse(n, 5 * small)
    assert large <= 5 * small, f"{n // 4} nested tags: {small} lines run, {n}: over {large} (linear: ~4x)"
    assert large > 3 * small  # (the count sees the parse: 4 times the tags, about 4 times the lines)
    assert len(paras) == n + 1 and paras[-1] == "End."


# ---------------------------------------------------------------- EPUB

CONTAINER = """<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">
<rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/></rootfiles></container>"""

OPF = """<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="id">
<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>Test Book</dc:title><dc:creator>Ann Author</dc:creator>
<dc:language>en</dc:language><meta name="cover" content="cover-img"/></metadata>
<manifest>
<item id="nav" href="nav.xhtml" media-type="application/xhtml+xml" properties="nav"/>
<item id="cover-img" href="images/cover.png" media-type="image/png"/>
<item id="copy" href="text/copyright.xhtml" media-type="application/xhtml+xml"/>
<item id="c1" href="text/ch1.xhtml" media-type="application/xhtml+xml"/>
<item id="c1b" href="text/ch1b.xhtml" media-type="application/xhtml+xml"/>
<item id="c2" href="text/ch2.xhtml" media-type="application/xhtml+xml"/>
<item id="notes" href="text/notes.xhtml" media-type="application/xhtml+xml"/>
</manifest>
<spine><itemref idref="nav"/><itemref idref="copy"/><itemref idref="c2x"/><itemref idref="c1"/><itemref idref="c1b"/>
<itemref idref="c2"/><itemref idref="notes" linear="no"/></spine></package>"""

NAV = """<?xml version="1.0"?><html xmlns="http://www.w3.org/1999/xhtml" xmlns:epub="http://www.idpf.org/2007/ops">
<body><nav epub:type="toc"><h1>Contents</h1><ol><li><a href="text/ch1.xhtml">The First Chapter</a></li>
<li><a href="text/ch2.xhtml#start">The Second Chapter</a></li></ol></nav></body></html>"""


def xhtml(body: str) -> str:
    return ('<?xml version="1.0" encoding="utf-8"?><html xmlns="http://www.w3.org/1999/xhtml" '
            f'xmlns:epub="http://www.idpf.org/2007/ops"><head><title>x</title></head><body>{body}</body></html>')


def make_epub(path: Path, files: dict | None = None, drop: tuple = ()) -> Path:
    content = {
        "META-INF/container.xml": CONTAINER,
        "OEBPS/content.opf": OPF,
        "OEBPS/nav.xhtml": NAV,
        "OEBPS/images/cover.png": PNG,
        "OEBPS/text/copyright.xhtml": xhtml("<p>Copyright © 2020 Ann Author. All rights reserved.</p>"),
        "OEBPS/text/ch1.xhtml": xhtml(
            "<h1>Chapter 1</h1><p>Once upon a time<a epub:type='noteref' href='notes.xhtml#n1'>1</a>.</p>"
            "<p>Second &amp; last paragraph.</p>"),
        "OEBPS/text/ch1b.xhtml": xhtml("<p>Continuation of chapter one.</p>"),
        "OEBPS/text/ch2.xhtml": xhtml(
            "<section><h2 id='start'>The Second Chapter</h2><p>Text two.</p>"
            "<aside epub:type='footnote'><p>An aside footnote.</p></aside></section>"),
        "OEBPS/text/notes.xhtml": xhtml("<p id='n1'>1. The endnote.</p>"),
    }
    content.update(files or {})
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        for name, data in content.items():
            if name not in drop:
                z.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED)
    return path


def test_epub(tmp_path):
    doc = load_document(make_epub(tmp_path / "book.epub"))
    assert (doc.title, doc.author, doc.language, doc.source_format) == ("Test Book", "Ann Author", "en", "epub")
    assert doc.cover == PNG and doc.cover_mime == "image/png"
    assert [c.title for c in doc.chapters] == ["", "The First Chapter", "The Second Chapter"]
    assert doc.chapters[1].paragraphs == ["Once upon a time.", "Second & last paragraph.", "Continuation of chapter one."]
    assert doc.chapters[2].paragraphs == ["Text two."]


def test_epub_front_matter_and_ncx(tmp_path):
    ncx = """<?xml version="1.0"?><ncx xmlns="http://www.daisy.org/z3986/2005/ncx/"><navMap>
    <navPoint id="a"><navLabel><text>NCX One</text></navLabel><content src="text/ch1.xhtml"/></navPoint>
    <navPoint id="b"><navLabel><text>NCX Two</text></navLabel><content src="text/ch2.xhtml"/></navPoint></navMap></ncx>"""
    opf = OPF.replace('properties="nav"', "").replace(
        "</manifest>", '<item id="ncx" href="toc.ncx" media-type="application/x-dtbncx+xml"/></manifest>'
    ).replace('<itemref idref="nav"/>', "").replace("<spine>", '<spine toc="ncx">')
    path = make_epub(tmp_path / "b.epub", {"OEBPS/content.opf": opf, "OEBPS/toc.ncx": ncx})
    doc = load_document(path, IngestOptions(skip_front_matter=True))
    assert [c.title for c in doc.chapters] == ["NCX One", "NCX Two"]


def test_epub_keep_footnotes(tmp_path):
    doc = load_document(make_epub(tmp_path / "b.epub"), IngestOptions(skip_footnotes=False))
    text = " ".join(p for c in doc.chapters for p in c.paragraphs)
    assert "An aside footnote." in text and "time1." in text


def test_epub_zip_bomb(tmp_path):
    path = make_epub(tmp_path / "bomb.epub", {"OEBPS/text/ch2.xhtml": b"\x00" * (20 * 1024 * 1024)})
    with pytest.raises(IngestError, match="zip bomb"):
        load_document(path)


def test_epub_declared_size_over_limit(tmp_path):
    path = make_epub(tmp_path / "big.epub", {"OEBPS/text/big.xhtml": os.urandom(300_000)})
    with pytest.raises(IngestError, match="expand"):
        load_document(path, IngestOptions(max_uncompressed_bytes=200_000))


def test_epub_not_a_zip(tmp_path):
    with pytest.raises(IngestError, match="not a valid zip"):
        load_document(write(tmp_path, "fake.epub", "This is just text pretending to be an EPUB."))


def test_epub_missing_opf(tmp_path):
    path = make_epub(tmp_path / "noopf.epub", drop=("OEBPS/content.opf",))
    with pytest.raises(IngestError, match="OPF"):
        load_document(path)
    path2 = make_epub(tmp_path / "noopf2.epub", drop=("OEBPS/content.opf", "META-INF/container.xml"))
    with pytest.raises(IngestError, match="OPF"):
        load_document(path2)


def test_epub_sniffed_without_extension(tmp_path):
    src = make_epub(tmp_path / "x.epub")
    target = tmp_path / "mystery.bin"
    target.write_bytes(src.read_bytes())
    assert load_document(target).title == "Test Book"


# ---------------------------------------------------------------- DOCX

W_NS = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'


def docx_para(text: str, style: str | None = None) -> str:
    ppr = f'<w:pPr><w:pStyle w:val="{style}"/></w:pPr>' if style else ""
    return f"<w:p>{ppr}<w:r><w:t xml:space=\"preserve\">{text}</w:t></w:r></w:p>"


def make_docx(path: Path, paras: list[tuple[str, str | None]]) -> Path:
    body = "".join(docx_para(t, s) for t, s in paras)
    styles = (f'<w:styles {W_NS}><w:style w:type="paragraph" w:styleId="berschrift1"><w:name w:val="heading 1"/>'
              '</w:style><w:style w:type="paragraph" w:styleId="Title"><w:name w:val="Title"/></w:style></w:styles>')
    core = ('<cp:coreProperties xmlns:cp="http://schemas.openxmlformats.org/package/2006/metadata/core-properties" '
            'xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>Docx Title</dc:title><dc:creator>Writer</dc:creator>'
            "</cp:coreProperties>")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("word/document.xml", f"<w:document {W_NS}><w:body>{body}</w:body></w:document>")
        z.writestr("word/styles.xml", styles)
        z.writestr("docProps/core.xml", core)
    return path


def test_docx(tmp_path):
    path = make_docx(tmp_path / "d.docx", [
        ("The Book", "Title"), ("Intro text.", None), ("First Heading", "Heading1"), ("Para one.", None),
        ("Para two.", None), ("Second Heading", "berschrift1"), ("Para three.", None), ("", None),
    ])
    doc = load_document(path)
    assert doc.title == "Docx Title" and doc.author == "Writer" and doc.source_format == "docx"
    assert [(c.title, c.paragraphs) for c in doc.chapters] == [
        ("", ["Intro text."]), ("First Heading", ["Para one.", "Para two."]), ("Second Heading", ["Para three."]),
    ]


# ---------------------------------------------------------------- PDF

def test_pdf_without_text_layer_is_a_clear_error(tmp_path):
    pypdf = pytest.importorskip("pypdf")
    writer = pypdf.PdfWriter()
    writer.add_blank_page(width=200, height=200)
    path = tmp_path / "blank.pdf"
    with open(path, "wb") as fh:
        writer.write(fh)
    with pytest.raises(IngestError, match="no text layer"):
        load_document(path)


def test_broken_pdf(tmp_path):
    with pytest.raises(IngestError, match="PDF"):
        load_document(write(tmp_path, "broken.pdf", b"%PDF-1.4\n garbage garbage"))


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize(
    "name,content,message",
    [
        ("empty.txt", b"", "empty"),
        ("blank.txt", b"   \n\t\n  \r\n", "no text"),
        ("image.txt", PNG, "binary"),
        ("nuls.txt", b"abc\x00\x01\x02\x00\x00def" * 100, "binary"),
        ("image.png", PNG, "binary"),
        ("mystery.xyz", PNG, "binary"),
        ("control.txt", bytes(range(1, 32)) * 50, "binary"),
        ("doc.doc", b"whatever", "not supported"),
    ],
)
def test_bad_inputs(tmp_path, name, content, message):
    path = write(tmp_path, name, content)
    before = digest(path)
    with pytest.raises(IngestError, match=message):
        load_document(path)
    assert path.exists() and digest(path) == before  # the user's file is never touched


def test_undecodable_bytes(tmp_path):
    import random

    rng = random.Random(1)
    path = write(tmp_path, "junk.txt", bytes(rng.randrange(128, 256) for _ in range(3000)))
    with pytest.raises(IngestError, match="encoding|binary"):
        load_document(path)


def test_too_large_is_checked_before_reading(tmp_path, monkeypatch):
    path = write(tmp_path, "big.txt", "x" * 2000)
    opened = []
    real_open = open

    def spy(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spy)
    with pytest.raises(IngestError, match="too large"):
        load_document(path, IngestOptions(max_bytes=1000))
    assert str(path) not in opened


def test_allowed_roots_and_symlinks(tmp_path):
    inside = tmp_path / "inbox"
    outside = tmp_path / "secret"
    inside.mkdir()
    outside.mkdir()
    ok = write(inside, "ok.txt", "Hello there.")
    secret = write(outside, "s.txt", "Top secret.")
    opts = IngestOptions(allowed_roots=[inside])
    assert load_document(ok, opts).chapters[0].paragraphs == ["Hello there."]
    with pytest.raises(IngestError, match="outside the allowed"):
        load_document(secret, opts)
    link = inside / "link.txt"
    link.symlink_to(secret)
    with pytest.raises(IngestError, match="outside the allowed"):
        load_document(link, opts)
    with pytest.raises(IngestError, match="outside the allowed"):
        load_document(inside / ".." / "secret" / "s.txt", opts)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(IngestError, match="not found"):
        load_document(tmp_path / "nope.txt")
    with pytest.raises(IngestError, match="folder"):
        load_document(tmp_path)


def test_unknown_extension_text_is_sniffed(tmp_path):
    doc = load_document(write(tmp_path, "notes.weird", "Just some text.\n\nAnother paragraph."))
    assert doc.chapters[0].paragraphs == ["Just some text.", "Another paragraph."]
    html = load_document(write(tmp_path, "page.weird", "<!DOCTYPE html><html><body><p>Web page</p></body></html>"))
    assert html.source_format == "html"


def test_ingest_error_is_job_error():
    assert issubclass(IngestError, JobError)


# ---------------------------------------------------------------- isolated ingest (child process, limits)

def test_isolated_ingest_returns_the_same_document(tmp_path):
    from jobs.ingest.isolate import load_document_isolated

    path = make_epub(tmp_path / "book.epub")
    direct, isolated = load_document(path), load_document_isolated(path)
    assert isolated == direct and isolated.cover == PNG


def test_isolated_ingest_reports_bad_input_and_honours_options(tmp_path):
    from jobs.ingest.isolate import load_document_isolated

    with pytest.raises(IngestError, match="empty"):
        load_document_isolated(write(tmp_path, "e.txt", ""))
    inside = tmp_path / "inbox"
    inside.mkdir()
    link = inside / "passwd.txt"
    link.symlink_to(write(tmp_path, "secret.txt", "Top secret."))
    with pytest.raises(IngestError, match="outside the allowed"):
        load_document_isolated(link, IngestOptions(allowed_roots=[inside]))


def _deep_html(tmp_path, n=400_000):
    return write(tmp_path, "deep.html", "<html><body>" + "<div>x " * n)


@pytest.mark.parametrize("limit, message", [
    ({"cpu_s": 1, "wall_s": 60}, r"used more than 1 s of CPU time; raise jobs.ingest_cpu_s or split the file"),
    ({"cpu_s": 60, "wall_s": 0.5}, r"took longer than 0.5 s; raise jobs.ingest_wall_s or split the file"),
])
def test_isolated_ingest_time_limits(tmp_path, limit, message):
    """A file that parses for many seconds is stopped at the limit with a reason naming the setting (the
    kernel's SIGXCPU at the CPU limit; the parent's kill at the wall-clock one)."""
    from jobs.ingest.isolate import IngestLimits, load_document_isolated

    path = _deep_html(tmp_path)
    with pytest.raises(IngestError, match=r"parsing deep\.html " + message):
        load_document_isolated(path, limits=IngestLimits(**limit))


def test_isolated_ingest_memory_limit(tmp_path):
    from jobs.ingest.isolate import IngestLimits, load_document_isolated

    path = write(tmp_path, "lines.txt", b"a\n" * 4_000_000)  # millions of tiny paragraphs: hundreds of MB
    with pytest.raises(IngestError, match=r"lines\.txt needed more than 48 MB of memory; raise jobs.ingest_memory_mb"):
        load_document_isolated(path, limits=IngestLimits(memory_mb=48))


def test_cancel_all_stops_a_running_ingest_at_once(tmp_path):
    """What the daemon does on SIGTERM: every running ingest child is killed; the caller is told
    it was cancelled (not that the file is bad)."""
    import threading

    from jobs.ingest import isolate
    from jobs.ingest.isolate import IngestCancelled, cancel_all, load_document_isolated

    path = _deep_html(tmp_path)
    outcome = []

    def ingest():
        try:
            load_document_isolated(path)
        except Exception as exc:
            outcome.append(exc)

    t = threading.Thread(target=ingest)
    t.start()
    deadline = time.monotonic() + 300  # (a failure guard)
    while not isolate._live:  # the child is parsing (it needs seconds of CPU for this file)
        assert time.monotonic() < deadline and t.is_alive(), outcome
        time.sleep(0.02)
    assert cancel_all() == 1
    t.join(300)
    assert not t.is_alive() and isinstance(outcome[0], IngestCancelled)  # killed, not parsed to the end


def _late_wakeups(monkeypatch, n: int = 1) -> list:
    """Make the next `n` waits of subprocess.communicate wake up 150 ms after their timeout (a thread scheduled
    late on a busy machine); the list counts those done."""
    import selectors
    import subprocess

    done = []

    class Late(subprocess._PopenSelector):
        def select(self, timeout=None):
            if len(done) < n and timeout is not None:
                done.append(timeout)
                time.sleep(timeout + 0.15)
                return super().select(0)
            return super().select(timeout)

    assert issubclass(Late, selectors.BaseSelector)
    monkeypatch.setattr(subprocess, "_PopenSelector", Late)
    return done


def test_a_late_wakeup_does_not_keep_the_request_from_the_child(tmp_path, monkeypatch):
    """One wait that wakes past its timeout (on a busy machine) used to leave the child without its request
    (only the first communicate() carried it): a 15-byte PDF then failed as "took longer than 300 s" and a
    zip bomb as a timeout. Each file gets its own reason, with a late wake-up injected in each ingest."""
    from jobs.ingest.isolate import IngestLimits, load_document_isolated

    limits = IngestLimits(wall_s=60)
    late = _late_wakeups(monkeypatch, 1)
    with pytest.raises(IngestError, match="PDF could not be read"):
        load_document_isolated(write(tmp_path, "tiny.pdf", b"%PDF-1.4\n%%EOF\n"), limits=limits)
    assert len(late) == 1
    late.clear()
    bomb = make_epub(tmp_path / "bomb.epub", {"OEBPS/text/ch2.xhtml": b"\x00" * (20 * 1024 * 1024)})
    with pytest.raises(IngestError, match="zip bomb"):
        load_document_isolated(bomb, limits=limits)
    assert len(late) == 1
    late.clear()
    doc = load_document_isolated(write(tmp_path, "ok.txt", "A sentence to read.\n"), limits=limits)
    assert len(late) == 1 and doc.chapters[0].paragraphs == ["A sentence to read."]


# ---------------------------------------------------------------- admin findings: ANSI, title line, DRM

def test_ansi_escapes_are_not_spoken(tmp_path):
    from text.normalize import cleanup

    raw = "\x1b[1;31mChapter 1\x1b[0m\n\nThe \x1b[32mdisk\x1b[0m is \x1b]0;win title\x07full\x1b(B now.\n"
    doc = load_document(write(tmp_path, "console.txt", raw))
    assert [(c.title, c.paragraphs) for c in doc.chapters] == [("Chapter 1", ["The disk is full now."])]
    assert cleanup("a \x1b[2Kb \x9b1mc \x1b7d") == "a b c d"


def test_hash_title_line_of_a_text_file_is_the_document_title(tmp_path):
    from jobs.settings import JobSpec
    from jobs.submit import document_chapters

    doc = load_document(write(tmp_path, "b.txt", "# My Great Book\n\nIt was a dark night.\n\nMore text.\n"))
    assert doc.title == "My Great Book"
    [(title, segs)] = document_chapters(doc, JobSpec(language="english"))
    assert "Great Book" not in " ".join(s.text for s in segs)
    doc = load_document(write(tmp_path, "c.txt", "# Title\n\nChapter 1\n\nText one.\n\nChapter 2\n\nText two.\n"))
    assert doc.title == "Title" and [c.title for c in doc.chapters] == ["Chapter 1", "Chapter 2"]
    assert load_document(write(tmp_path, "d.txt", "#hashtag is text\n")).title == "d"


ENCRYPTION = """<?xml version="1.0"?><encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container"
xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData>
<enc:EncryptionMethod Algorithm="{alg}"/><enc:CipherData><enc:CipherReference URI="{uri}"/></enc:CipherData>
</enc:EncryptedData></encryption>"""


@pytest.mark.parametrize("extra", [
    {"META-INF/encryption.xml": ENCRYPTION.format(alg="http://www.w3.org/2001/04/xmlenc#aes128-cbc",
                                                 uri="OEBPS/text/ch1.xhtml"),
     "OEBPS/text/ch1.xhtml": bytes(range(256)) * 8},
    {"META-INF/rights.xml": "<rights/>"},
    {"META-INF/sinf.xml": "<fairplay/>", "OEBPS/text/ch1.xhtml": bytes(range(256)) * 8},  # Apple
    {"META-INF/license.lcpl": "{}", "OEBPS/text/ch1.xhtml": bytes(range(256)) * 8},  # Readium LCP
])
def test_encrypted_epub_is_reported_as_drm(tmp_path, extra):
    with pytest.raises(IngestError, match=r"EPUB is DRM-protected \(encrypted\); remove the DRM with the tool "
                                          r"of your store/library and submit again"):
        load_document(make_epub(tmp_path / "drm.epub", extra))


@pytest.mark.parametrize("noise", [bytes(range(256)) * 8, bytes(range(128, 256)) * 40])
def test_encrypted_chapters_without_a_rights_file_are_drm_not_a_binary_file(tmp_path, noise):
    """Content encrypted with no manifest naming it: a chapter that is no text means an encrypted book."""
    with pytest.raises(IngestError, match=r"EPUB is DRM-protected \(encrypted\).*'OEBPS/text/ch1.xhtml' is not "
                                          r"readable: encrypted") as exc:
        load_document(make_epub(tmp_path / "drm.epub", {"OEBPS/text/ch1.xhtml": noise}))
    assert "binary" not in str(exc.value)


def test_font_obfuscation_is_not_drm(tmp_path):
    enc = ENCRYPTION.format(alg="http://www.idpf.org/2008/embedding", uri="OEBPS/fonts/f.otf")
    doc = load_document(make_epub(tmp_path / "fonts.epub", {"META-INF/encryption.xml": enc}))
    assert doc.title == "Test Book"
