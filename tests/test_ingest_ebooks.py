"""E-book formats beyond EPUB: MOBI/AZW/AZW3/PRC, ODT, RTF and FB2 (.fb2.zip too): chapters and titles from
each format's own structure, metadata, non-ASCII text, the names and content they are known by."""
from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest
from ebook_util import RTF, fb2_bytes, make_odt
from mobi_util import JPEG, Huffman, mobi_book, palmdb, palmdoc_compress, text_records

from jobs.ingest import READ_SUFFIXES, IngestOptions, guess_format, load_document
from jobs.ingest.mobi_compress import HuffCdic, palmdoc, strip_trailing

MOBI6 = ("<html><head><title>ignored</title></head><body><h1>Chapter One</h1><p>Zoë walked along the Straße.</p>"
         "<p>{filler}ß and the and the rest.</p><mbp:pagebreak/><h1>Chapter Two</h1><p>日本語のテキスト。</p>"
         "</body></html>")
SKELETON = ('<?xml version="1.0" encoding="utf-8"?><html xmlns="http://www.w3.org/1999/xhtml"><head><title>Part'
            '</title><link rel="stylesheet" href="kindle:flow:0001?mime=text/css"/></head><body aid="0"></body></html>')
KF8 = (SKELETON + '<div aid="1"><h2>Erstes Kapitel</h2><p>Zoë und die Straße.</p></div>'
       + SKELETON + '<div aid="2"><h2>第二章</h2><p>中文的文字。</p></div>')
CSS = ".css-rule-never-read { color: red }"


def mobi6(filler_to: int = 4095) -> str:
    """Old-MOBI markup whose "ß" (two bytes in UTF-8) straddles the first 4096-byte record boundary."""
    head = MOBI6.split("{filler}")[0].encode()
    return MOBI6.replace("{filler}", "x" * (filler_to - len(head)))


def chapters(doc) -> list:
    return [(c.title, c.paragraphs) for c in doc.chapters]


# ---------------------------------------------------------------- MOBI / AZW3

@pytest.mark.parametrize("compression", [1, 2, 17480], ids=["stored", "palmdoc", "huffcdic"])
def test_old_mobi_chapters_metadata_cover_and_a_character_cut_by_a_record(tmp_path, compression):
    path = tmp_path / "book.mobi"
    path.write_bytes(mobi_book(mobi6(), compression=compression))
    doc = load_document(path)
    assert (doc.title, doc.author, doc.language, doc.source_format) == ("Zoë's Kindle Book", "Ann Author", "de", "mobi")
    assert doc.cover == JPEG and doc.cover_mime == "image/jpeg"
    assert [c.title for c in doc.chapters] == ["Chapter One", "Chapter Two"]
    assert doc.chapters[0].paragraphs[0] == "Zoë walked along the Straße."
    assert doc.chapters[0].paragraphs[1].endswith("xß and the and the rest.")  # the overlap bytes joined once
    assert doc.chapters[1].paragraphs == ["日本語のテキスト。"]


@pytest.mark.parametrize("flags", [0, 1, 2, 3])
def test_trailing_entries_are_removed_whatever_the_flags(tmp_path, flags):
    path = tmp_path / "book.prc"
    path.write_bytes(mobi_book(mobi6(), flags=flags))
    assert load_document(path).chapters[0].paragraphs[1].endswith("xß and the and the rest.")


def test_azw3_reads_the_first_flow_of_its_parts_in_order(tmp_path):
    path = tmp_path / "book.azw3"
    path.write_bytes(mobi_book(KF8, version=8, css=CSS))
    doc = load_document(path)
    assert doc.source_format == "azw3" and doc.title == "Zoë's Kindle Book" and doc.cover == JPEG
    assert chapters(doc) == [("Erstes Kapitel", ["Zoë und die Straße."]), ("第二章", ["中文的文字。"])]


def test_a_joint_file_is_read_from_its_kf8_part(tmp_path):
    path = tmp_path / "kindlegen.azw"
    path.write_bytes(mobi_book(KF8, version=8, css=CSS, joint_with=mobi6()))
    doc = load_document(path)
    assert chapters(doc) == [("Erstes Kapitel", ["Zoë und die Straße."]), ("第二章", ["中文的文字。"])]
    assert doc.cover == JPEG  # the cover record belongs to the old part


def test_mobi_without_headings_starts_chapters_at_chapter_words(tmp_path):
    html = ("<body><p>Chapter 1</p><p>First text.</p><mbp:pagebreak/><p>CHAPTER II</p><p>Second text.</p>"
            "<mbp:pagebreak/><p>More of it, without a title.</p></body>")
    path = tmp_path / "plain.mobi"
    path.write_bytes(mobi_book(html))
    assert chapters(load_document(path)) == [("Chapter 1", ["First text."]),
                                             ("CHAPTER II", ["Second text.", "More of it, without a title."])]


def test_a_plain_palmdoc_book_is_text(tmp_path):
    text = "Chapter 1\n\nIt was <not> markup & Zoë.\n\nChapter 2\n\nFinal words.".encode("cp1252")
    record0 = bytes.fromhex("0002 0000") + len(text).to_bytes(4, "big") + b"\x00\x01\x10\x00\x00\x05\x00\x00"
    path = tmp_path / "doc.prc"
    path.write_bytes(palmdb([record0, palmdoc_compress(text)], kind=b"TEXtREAd"))
    doc = load_document(path)
    assert chapters(doc) == [("Chapter 1", ["It was <not> markup & Zoë."]), ("Chapter 2", ["Final words."])]
    assert doc.title == "Test_Book"


def test_the_record_codecs():
    data = ("Zoë und die Straße. " * 200 + "日本語 ").encode()[:4096]
    assert palmdoc(palmdoc_compress(data)) == data
    code = Huffman([b"the ", b"and ", b"the and "])  # the last phrase is stored compressed
    reader = HuffCdic(*(lambda r: (r[0], r[1:]))(code.records()))
    text = b"the cat and the and dog \xc3\xa9 " * 40
    assert reader.unpack(code.compress(text)) == text
    text = ("x" * 4095 + "ßy").encode()  # the first record ends inside "ß"
    records = text_records(text, 2, 3)
    assert records[0].endswith(b"\x9f\x01" + b"\x12\x34\x83")  # its overlap byte and count, an index entry
    assert b"".join(palmdoc(strip_trailing(r, 3)) for r in records) == text


# ---------------------------------------------------------------- ODT, RTF, FB2

def test_odt_headings_styles_title_lists_tables_and_notes(tmp_path):
    path = make_odt(tmp_path / "book.odt")
    doc = load_document(path)
    assert (doc.title, doc.author, doc.language, doc.source_format) == ("The ODT Book", "Zoë Writer", "de", "odt")
    assert chapters(doc) == [
        ("Chapter Eins", ["Die Straße, ein Weg.", "A section", "Section text.", "Item one", "Item two"]),
        ("第二章", ["中文单元格"]),
    ]
    kept = load_document(path, IngestOptions(skip_footnotes=False))
    assert kept.chapters[0].paragraphs[:2] == ["Die Straße, ein Weg.", "A footnote."]


def test_odt_title_style_is_the_title_without_metadata(tmp_path):
    path = make_odt(tmp_path / "b.odt")
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist() if n != "meta.xml"}
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    assert load_document(path).title == "Zoë's Title Paragraph"


def test_rtf_styles_code_pages_unicode_and_info(tmp_path):
    path = tmp_path / "book.rtf"
    path.write_text(RTF, encoding="latin-1")
    doc = load_document(path)
    assert (doc.title, doc.author, doc.source_format) == ("The RTF Book", "Zoë Writer", "rtf")
    assert chapters(doc) == [("Chapter Zoë", [
        "Die Straße, “quoted” and 😀. End.", "日本語 und Привет", "link text", "Second Heading",
        "Two 日 fallbacks, tab line. bin"])]
    kept = load_document(path, IngestOptions(skip_footnotes=False))
    assert kept.chapters[0].paragraphs[1] == "A footnote."


def test_rtf_without_styles(tmp_path):
    plain = tmp_path / "plain.rtf"
    plain.write_text(r"{\rtf1\ansi Just one\par paragraph after another.\par}", encoding="ascii")
    assert chapters(load_document(plain)) == [("", ["Just one", "paragraph after another."])]
    worded = tmp_path / "worded.rtf"
    worded.write_text(r"{\rtf1\ansi\pard Chapter 1\par Text one.\par Chapter 2\par Text two.\par}", encoding="ascii")
    assert chapters(load_document(worded)) == [("Chapter 1", ["Text one."]), ("Chapter 2", ["Text two."])]


def test_fb2_sections_titles_metadata_cover_and_notes(tmp_path):
    path = tmp_path / "book.fb2"
    path.write_bytes(fb2_bytes())
    doc = load_document(path)
    assert (doc.title, doc.author, doc.language, doc.source_format) == ("Das FB2 Buch", "Zoë Straße, Ghost", "de",
                                                                        "fb2")
    assert doc.cover.startswith(b"\xff\xd8\xff") and doc.cover_mime == "image/jpeg"
    assert chapters(doc) == [
        ("Teil Eins. Kapitel 1. Der Anfang", ["Ein Motto.", "Zoë ging über die Straße.", "Erste Zeile", "Zweite Zeile"]),
        ("Kapitel 2", ["第二章的文字。"]),
    ]
    kept = load_document(path, IngestOptions(skip_footnotes=False))
    assert "Die Fußnote." in kept.chapters[-1].paragraphs and "Zoë ging über die Straße.[1]" in kept.chapters[0].paragraphs


def test_fb2_zip_and_legacy_encodings(tmp_path):
    with zipfile.ZipFile(tmp_path / "book.fb2.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("inner/book.fb2", fb2_bytes())
    assert load_document(tmp_path / "book.fb2.zip").chapters[1].paragraphs == ["第二章的文字。"]
    for encoding, text in (("windows-1251", "Привет, мир."), ("gbk", "中文的文字。"), ("shift_jis", "日本語です。")):
        path = tmp_path / f"{encoding}.fb2"
        path.write_bytes(fb2_bytes(encoding, text))
        doc = load_document(path)
        assert doc.chapters[1].paragraphs == [text] and doc.author == "Zoë Straße, Ghost", encoding


# ---------------------------------------------------------------- names and content

def test_the_new_endings_are_read_and_listed(tmp_path):
    names = {"a.mobi": "mobi", "a.azw": "mobi", "a.AZW3": "mobi", "a.prc": "mobi", "a.odt": "odt", "a.rtf": "rtf",
             "a.fb2": "fb2", "a.fb2.zip": "fb2"}
    assert {n: guess_format(Path(n), b"") for n in names} == names
    assert {".mobi", ".azw", ".azw3", ".prc", ".odt", ".rtf", ".fb2", ".fb2.zip"} <= READ_SUFFIXES


def test_the_new_formats_are_known_by_their_content(tmp_path):
    (tmp_path / "b.rtf").write_text(RTF, encoding="latin-1")
    (tmp_path / "b.fb2").write_bytes(fb2_bytes())
    (tmp_path / "b.azw3").write_bytes(mobi_book(KF8, version=8, css=CSS))
    make_odt(tmp_path / "b.odt")
    with zipfile.ZipFile(tmp_path / "b.fb2.zip", "w") as z:
        z.writestr("book.fb2", fb2_bytes())
    for name, fmt in (("b.rtf", "rtf"), ("b.fb2", "fb2"), ("b.azw3", "azw3"), ("b.odt", "odt"), ("b.fb2.zip", "fb2")):
        renamed = tmp_path / f"mystery-{name}.bin"
        shutil.copy(tmp_path / name, renamed)
        assert load_document(renamed).source_format == fmt, name
