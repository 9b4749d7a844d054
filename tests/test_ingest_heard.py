"""What a listener hears is the book, all of it and nothing else: each format's way of marking what is not the
book's text (note references and notes, generated tables of contents, title pages, image descriptions,
metadata blocks) and where chapters start, in files made here the way the converters make them (the real
converters' files: tests/test_ingest_converted.py)."""
from __future__ import annotations

import zipfile

from ebook_util import ODF, make_odt
from epub_util import make_epub, xhtml
from mobi_util import mobi_book
from pdf_util import pdf_bytes
from test_ingest_ebooks import SKELETON

from jobs.document import Chapter, Document
from jobs.ingest import IngestOptions, load_document


def chapters(doc) -> list:
    return [(c.title, c.paragraphs) for c in doc.chapters]


def heard(doc) -> str:
    return " ".join([c.title for c in doc.chapters] + [p for c in doc.chapters for p in c.paragraphs])


# ---------------------------------------------------------------- Kindle books as calibre makes them

KF8_NOTES = (
    SKELETON + '<section type="titlepage" aid="1"><h1 class="title">Zoë\'s Kindle Book</h1>'
    '<p class="author">Ann Author</p></section>'
    + SKELETON + '<section aid="2"><h1>Erstes Kapitel</h1><p>Zoë sat on the bench.<a href="kindle:pos:fid:0002:'
    'off:0000000010" class="footnote-ref" type="noteref">1</a> It said nothing.</p></section><section '
    'type="footnotes"><hr/><ol><li type="footnote"><p>The bench was green.<a href="kindle:pos:fid:0002:off:'
    '0000000000" role="doc-backlink">↩︎</a></p></li></ol></section>'
    + SKELETON + '<div aid="3"><h1>第二章</h1><p>中文的文字。</p></div>'
    + SKELETON + '<div id="toc" aid="4"><h1>Zoë\'s Kindle Book</h1><ol class="toc"><li><a href="kindle:pos:'
    'fid:0001:off:0000000000">Erstes Kapitel</a></li><li><a href="kindle:pos:fid:0002:off:0000000000">第二章</a>'
    '</li></ol></div>')


def test_kf8_notes_title_page_and_generated_toc_are_not_read(tmp_path):
    path = tmp_path / "calibre.azw3"
    path.write_bytes(mobi_book(KF8_NOTES, version=8, author="Ann Author"))
    doc = load_document(path)
    assert chapters(doc) == [("Erstes Kapitel", ["Zoë sat on the bench. It said nothing."]), ("第二章", ["中文的文字。"])]
    assert (doc.title, doc.author) == ("Zoë's Kindle Book", "Ann Author")
    kept = load_document(path, IngestOptions(skip_footnotes=False))
    assert "The bench was green." in kept.chapters[0].paragraphs and "↩" not in heard(kept)


def _old_mobi() -> str:
    """Old MOBI as calibre writes it: headings as big bold paragraphs, notes as <a filepos> links to a list, a
    generated table of contents of filepos links at the end, named by the guide; a chapter titled in Chinese
    without chapter words, found only through the table of contents."""
    parts = ['<html><head><guide><reference type="toc" title="Contents" filepos={toc:010d} /></guide></head><body>',
             '<p><font size="7"><b>Zoë\'s Kindle Book</b></font></p><p>Ann Author</p><mbp:pagebreak/>',
             '<p><font size="7"><b>花园</b></font></p><p>Zoë sat on the bench.<sup><small><a filepos={note:010d}>1'
             '</a></small></sup> It said nothing.</p><hr/><ol>',
             '<li value="1"><p>The bench was green.<a filepos={ref:010d}>Back</a></p></li></ol><mbp:pagebreak/>',
             '<p><font size="7"><b>Chapter Two</b></font></p><p>More text here.</p><mbp:pagebreak/>',
             '<p><font size="7"><b>Contents</b></font></p><ol><li><a filepos={one:010d}>花园</a></li>'
             '<li><a filepos={two:010d}>Chapter Two</a></li></ol><mbp:pagebreak/></body></html>']
    zeros = dict.fromkeys(("toc", "note", "ref", "one", "two"), 0)
    at = [len("".join(parts[:i]).format(**zeros).encode()) for i in range(len(parts))]
    ref = at[2] + len(parts[2].format(**zeros).encode().split(b"<sup>")[0])
    return "".join(parts).format(toc=at[5], note=at[3], ref=ref, one=at[2], two=at[4])


def test_old_mobi_filepos_notes_guide_toc_and_chapter_starts(tmp_path):
    path = tmp_path / "calibre.mobi"
    path.write_bytes(mobi_book(_old_mobi(), author="Ann Author"))
    doc = load_document(path)
    assert chapters(doc) == [("花园", ["Zoë sat on the bench. It said nothing."]), ("Chapter Two", ["More text here."])]
    assert "The bench was green." in heard(load_document(path, IngestOptions(skip_footnotes=False)))


# ---------------------------------------------------------------- PDF

def test_pdf_chapters_sharing_a_page_notes_at_its_foot_and_actual_text(tmp_path):
    page1 = ["My Title", "Ann Author", "Foreword", "Some words before the story.", "Chapter One",
             "It began on a bench.1 It said nothing.", "The Storm", "Rain fell all night long.",
             "1 The bench was green."]
    page2 = ["Chapter Three", ("第二", "X"), "The end came at last."]  # a glyph whose text only /ActualText says
    path = tmp_path / "book.pdf"
    path.write_bytes(pdf_bytes([page1, page2], [("Foreword", 0), ("Chapter One", 0), ("The Storm", 0),
                                                ("Chapter Three", 1)], {"/Title": "My Title", "/Author": "Ann Author"}))
    doc = load_document(path)
    assert chapters(doc) == [("Foreword", ["Some words before the story."]),
                             ("Chapter One", ["It began on a bench. It said nothing."]),
                             ("The Storm", ["Rain fell all night long."]),
                             ("Chapter Three", ["第二 The end came at last."])]
    assert (doc.title, doc.author) == ("My Title", "Ann Author")
    assert "The bench was green." in heard(load_document(path, IngestOptions(skip_footnotes=False)))


# ---------------------------------------------------------------- EPUB, FB2, ODT, RTF

def test_pandoc_epub2_notes_in_a_footnotes_section_are_not_read(tmp_path):
    chapter = xhtml("The Station", '<div class="section" id="c2"><h1>The Station</h1><p>The train was late.<a '
                    'href="#fn1" class="footnote-ref" id="fnref1"><sup>1</sup></a></p></div><div class="footnotes">'
                    '<hr/><ol><li id="fn1"><p>Trains were always late then.</p></li></ol></div>')
    doc = load_document(make_epub(tmp_path / "pandoc2.epub", {"OEBPS/text/ch2.xhtml": chapter}))
    assert doc.chapters[-1].paragraphs == ["The train was late."] and "always late" not in heard(doc)


def test_calibre_fb2_sections_are_chapters_titled_by_their_bold_first_paragraph(tmp_path):
    fb2 = ('<?xml version="1.0" encoding="UTF-8"?><FictionBook xmlns="http://www.gribuser.ru/xml/fictionbook/2.0">'
           "<description><title-info><author><first-name>Zoë</first-name><last-name>Müller</last-name></author>"
           "<book-title>Das Buch</book-title></title-info></description><body>"
           "<section><p><strong>Das Buch</strong></p><p>Zoë Müller</p><empty-line/></section>"
           "<section><p><strong>Vorwort</strong></p><p>Ein Anfang.</p></section>"
           "<section><p><strong>第二章 花园</strong></p><p>中文的文字。</p><p><strong>Not a title</strong></p>"
           "</section></body></FictionBook>")
    path = tmp_path / "calibre.fb2"
    path.write_text(fb2, encoding="utf-8")
    assert chapters(load_document(path)) == [("Vorwort", ["Ein Anfang."]),
                                             ("第二章 花园", ["中文的文字。", "Not a title"])]


def test_odt_image_descriptions_are_not_read(tmp_path):
    ns = ODF + (' xmlns:draw="urn:oasis:names:tc:opendocument:xmlns:drawing:1.0" xmlns:xlink="http://www.w3.org/'
                '1999/xlink" xmlns:svg="urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0"')
    content = (f'<?xml version="1.0" encoding="UTF-8"?><office:document-content {ns}><office:body><office:text>'
               '<text:h text:outline-level="1">Chapter One</text:h><text:p>Before the picture.<draw:frame '
               'draw:name="Picture"><draw:image xlink:href="Pictures/a.png"/><svg:title>Can</svg:title><svg:desc>'
               'A watering can painted blue</svg:desc></draw:frame></text:p><text:p>After it.</text:p>'
               "</office:text></office:body></office:document-content>")
    doc = load_document(make_odt(tmp_path / "lo.odt", content=content))
    assert chapters(doc) == [("Chapter One", ["Before the picture.", "After it."])]


PANDOC_RTF = (r"{\rtf1\ansi\deff0{\fonttbl{\f0 \fswiss Helvetica;}}"
              "\n{\\pard \\qc \\f0 \\sa180 \\b \\fs36 Zo\\u235?'s Garden\\par}\n{\\pard \\qc \\f0 \\sa180 Zo\\u235? "
              "M\\u252?ller\\par}\n{\\pard \\ql \\f0 \\sa180 \\outlinelevel0 \\b \\fs36 Foreword\\par}\n"
              "{\\pard \\ql \\f0 \\sa180 A few words.\\par}\n{\\pard \\ql \\f0 \\sa180 \\outlinelevel0 \\b \\fs36 "
              "Chapter One\\par}\n{\\pard \\ql \\f0 \\sa180 The story.\\par}\n}")


def test_a_title_page_is_the_title_and_author_not_text(tmp_path):
    plain = tmp_path / "pandoc.rtf"  # pandoc's RTF: no \info, a centred title and author
    plain.write_text(PANDOC_RTF, encoding="ascii")
    doc = load_document(plain)
    assert (doc.title, doc.author) == ("Zoë's Garden", "Zoë Müller")
    assert chapters(doc) == [("Foreword", ["A few words."]), ("Chapter One", ["The story."])]
    garbled = tmp_path / "calibre.rtf"  # calibre's RTF: "?" for every letter beyond ASCII in \info
    garbled.write_text(PANDOC_RTF.replace(r"{\rtf1\ansi", r"{\rtf1{\info{\title Zo?'s Garden}{\author Zo? M?ller}}"
                                                            r"\ansi"), encoding="ascii")
    doc = load_document(garbled)
    assert (doc.title, doc.author) == ("Zoë's Garden", "Zoë Müller") and doc.chapters[0].title == "Foreword"


# ---------------------------------------------------------------- Markdown, plain text, HTMLZ, TXTZ

def test_markdown_metadata_block_and_heading_attributes(tmp_path):
    yaml_md = tmp_path / "jekyll.md"
    yaml_md.write_text('---\ntitle: "Zoë\'s Notes"\nauthor:\n  - name: Zoë Müller\nlang: de\ntags: [a, b]\n---\n\n'
                       "# Erstes Kapitel {#eins .unnumbered}\n\nText eins.\n\nZweites {-}\n======\n\nText zwei.\n",
                       encoding="utf-8")
    doc = load_document(yaml_md)
    assert (doc.title, doc.author, doc.language) == ("Zoë's Notes", "Zoë Müller", "de")
    assert chapters(doc) == [("Erstes Kapitel", ["Text eins."]), ("Zweites", ["Text zwei."])]
    toml_md = tmp_path / "hugo.md"
    toml_md.write_text('+++\ntitle = "Hugo Book"\nauthors = ["Ann", "Bob"]\n+++\n\n## Intro\n\nHello.\n')
    doc = load_document(toml_md)
    assert (doc.title, doc.author, chapters(doc)) == ("Hugo Book", "Ann, Bob", [("Intro", ["Hello."])])
    rule = tmp_path / "rule.md"  # a thematic break first is no metadata block
    rule.write_text("---\n\nJust text.\n\n---\n\nMore.\n")
    assert heard(load_document(rule)) == " Just text. More."


def test_plain_text_title_block_cjk_chapters_notes_and_pictures(tmp_path):
    path = tmp_path / "pandoc.txt"
    path.write_text("Zoë's Garden\nZoë Müller\n\nForeword\n\nA few words.\n\n第二章 花园\n\n她在花园里读书。\n\n"
                    "第3回\n\nZoë sat on the bench.1 It said nothing.\n\n[A watering can painted blue]\n\n"
                    "The bench was green.↩︎\n", encoding="utf-8")
    doc = load_document(path)
    assert (doc.title, doc.author) == ("Zoë's Garden", "Zoë Müller")
    assert chapters(doc) == [("Foreword", ["A few words."]), ("第二章 花园", ["她在花园里读书。"]),
                             ("第3回", ["Zoë sat on the bench. It said nothing."])]
    calibre = tmp_path / "calibre.txt"  # calibre: the title and the author apart, blank lines around them
    calibre.write_text("Zoë's Garden\n\n\nZoë Müller\n\n\n\n\nChapter 1\n\nText.\n", encoding="utf-8")
    doc = load_document(calibre)
    assert (doc.title, doc.author, chapters(doc)) == ("Zoë's Garden", "Zoë Müller", [("Chapter 1", ["Text."])])


def test_a_preamble_is_not_named_like_the_chapter_after_it(tmp_path):
    from jobs.submit import chapter_names

    path = tmp_path / "b.txt"
    path.write_text("A short note from the author, before it all.\n\nChapter 1\n\nText one.\n\nChapter 2\n\nTwo.\n")
    doc = load_document(path)
    names = chapter_names(doc)
    assert names == ["b", "Chapter 1", "Chapter 2"] and len(set(names)) == len(names)
    untitled = Document([Chapter("", ["x"]), Chapter("", ["y"])])
    assert chapter_names(untitled) == ["Chapter 1", "Chapter 2"]


OPF = ('<?xml version="1.0" encoding="utf-8"?><metadata><dc-metadata xmlns:dc="http://purl.org/dc/elements/1.1/">'
       "<dc:Language>eng</dc:Language><dc:Title>Zoë's Garden</dc:Title><dc:Creator role=\"aut\">Zoë Müller"
       "</dc:Creator></dc-metadata></metadata>")


def test_calibre_htmlz_and_txtz_are_read(tmp_path):
    with zipfile.ZipFile(tmp_path / "book.htmlz", "w") as z:
        z.writestr("index.html", "<html><head><title>x</title></head><body><h1>Zoë's Garden</h1><p>Zoë Müller</p>"
                                 "<h1>One</h1><p>Text one.</p><h1>Two</h1><p>Text two.</p></body></html>")
        z.writestr("style.css", "p {}")
        z.writestr("metadata.opf", OPF)
    with zipfile.ZipFile(tmp_path / "book.txtz", "w") as z:
        z.writestr("index.txt", "Zoë's Garden\n\n\nZoë Müller\n\n\nChapter 1\n\nText one.\n\nChapter 2\n\nTwo.\n")
        z.writestr("metadata.opf", OPF)
    for name, fmt, expected in (("book.htmlz", "htmlz", [("One", ["Text one."]), ("Two", ["Text two."])]),
                                ("book.txtz", "txtz", [("Chapter 1", ["Text one."]), ("Chapter 2", ["Two."])])):
        doc = load_document(tmp_path / name)
        assert (doc.source_format, doc.title, doc.author, chapters(doc)) == (fmt, "Zoë's Garden", "Zoë Müller",
                                                                             expected)
        mystery = tmp_path / f"{fmt}-without-its-ending.bin"
        mystery.write_bytes((tmp_path / name).read_bytes())
        assert load_document(mystery).source_format == fmt


def test_glued_references_go_only_with_notes_and_numbers_stay(tmp_path):
    noted = tmp_path / "noted.txt"
    noted.write_text("Chapter 1\n\nThe bench.1 At 10:30 version 2.1 played an mp3 file.2 A grandfather3 came.\n\n"
                     "Green.↩︎\n\nOld.↩︎\n\nKind.↩︎\n", encoding="utf-8")
    assert load_document(noted).chapters[0].paragraphs == [
        "The bench. At 10:30 version 2.1 played an mp3 file. A grandfather came."]
    plain = tmp_path / "plain.txt"  # no notes: a number after a word is the text's
    plain.write_text("Chapter 1\n\nThe bench.1 It said nothing.\n", encoding="utf-8")
    assert load_document(plain).chapters[0].paragraphs == ["The bench.1 It said nothing."]
    letter = tmp_path / "letter.txt"  # a short first line without chapters after it is no title
    letter.write_text("Dear Anna\n\nHow are you? I am fine.\n", encoding="utf-8")
    doc = load_document(letter)
    assert doc.title == "letter" and doc.chapters[0].paragraphs == ["Dear Anna", "How are you? I am fine."]
