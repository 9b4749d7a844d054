"""Bad MOBI/AZW3, ODT, RTF and FB2 files: truncated, wrong magic, encrypted (DRM, passwords), zip bombs
inside .odt and .fb2.zip, XML entity bombs and external entities. Each gets a one-line reason and the file is
kept as it was, read directly, through the sandboxed child, and by the inbox (to failed/ with its reason)."""
from __future__ import annotations

import hashlib
import io
import re
import zipfile

import pytest
from ebook_util import RTF, fb2_bytes, make_odt
from inbox_util import inbox_env, ticks_until
from mobi_util import mobi_book
from test_ingest_ebooks import KF8, mobi6

from jobs.errors import IngestError
from jobs.ingest import load_document

DRM = (r"MOBI/AZW e-book is DRM-protected \(encrypted\); remove the DRM with the tool of your store/library and "
       r"submit again")
LAUGHS = ('<?xml version="1.0"?><!DOCTYPE FictionBook [<!ENTITY a "aaaaaaaaaa">'
          '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">'
          '<!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;"><!ENTITY e "&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;">]>'
          '<FictionBook><body><section><p>&e;&e;&e;&e;&e;&e;&e;&e;</p></section></body></FictionBook>')
EXTERNAL = ('<?xml version="1.0"?><!DOCTYPE FictionBook [<!ENTITY secret SYSTEM "file:///etc/passwd">]>'
            "<FictionBook><body><section><p>&secret;</p></section></body></FictionBook>")
PARAMETER = ('<?xml version="1.0"?><!DOCTYPE FictionBook [<!ENTITY % remote SYSTEM "http://example.org/x.dtd">'
             "%remote;]><FictionBook><body><section><p>x</p></section></body></FictionBook>")


def _zip(members: dict) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _odt(tmp_path, **kw) -> bytes:
    return make_odt(tmp_path / "source.odt", **kw).read_bytes()


def _kf8_part_encrypted() -> bytes:
    """A joint file whose old part is plain and whose KF8 part (the record after BOUNDARY) is encrypted."""
    data = mobi_book(KF8, version=8, joint_with=mobi6())
    at = data.index(b"BOUNDARY") + len(b"BOUNDARY") + 12  # the KF8 header record's encryption type
    return data[:at] + b"\x00\x02" + data[at + 2:]


def _huff_broken() -> bytes:
    return mobi_book(mobi6(), compression=17480).replace(b"HUFF\x00\x00\x00\x18", b"HUFX\x00\x00\x00\x18")


BAD = {  # name: (content, its tmp_path -> content; the reason's pattern)
    "cut.mobi": (lambda t: mobi_book(mobi6())[:300], r"MOBI/AZW3 file is truncated"),
    "cut-text.azw3": (lambda t: (lambda b: b[:len(b) * 2 // 3])(mobi_book(KF8, version=8)),
                      r"MOBI/AZW3 file is truncated"),
    "words.mobi": (lambda t: b"Just words pretending to be a Kindle book. " * 9, r"not a MOBI/AZW3 e-book"),
    "drm.mobi": (lambda t: mobi_book(mobi6(), encryption=2), DRM),
    "drm.azw3": (lambda t: mobi_book(KF8, version=8, encryption=1), DRM),
    "drm-kf8-part.azw": (lambda t: _kf8_part_encrypted(), DRM),
    "kfx.azw": (lambda t: b"\xeaDRMION\xee" + bytes(200), r"DRM-protected Kindle KFX book, not MOBI/AZW3; remove the DRM"),
    "topaz.azw": (lambda t: b"TPZ0" + bytes(200), r"Kindle Topaz book, not MOBI/AZW3; convert it"),
    "huff.mobi": (lambda t: _huff_broken(), r"MOBI/AZW3 file is damaged \(its HUFF record is not one\)"),
    "bomb.odt": (lambda t: _odt(t, extra={"Pictures/zeros.bin": b"\0" * (20 << 20)}), r"zip bomb"),
    "entities.odt": (lambda t: _odt(t, content=LAUGHS.replace("FictionBook", "office:document-content")),
                     r"ODT file's content.xml declares XML entities \(<!ENTITY>\), which are never expanded"),
    "locked.odt": (lambda t: _odt(t, manifest="<manifest:file-entry manifest:full-path=\"content.xml\">"
                                              "<manifest:encryption-data/></manifest:file-entry>"),
                   r"ODT file is password-protected \(encrypted\)"),
    "sheet.odt": (lambda t: _odt(t, mimetype="spreadsheet"), r"OpenDocument 'spreadsheet' file, not a text document"),
    "cut.odt": (lambda t: _odt(t)[:400], r"ODT file is not a valid zip archive"),
    "words.odt": (lambda t: b"Plain words, no zip.", r"ODT file is not a valid zip archive"),
    "no-content.odt": (lambda t: _zip({"mimetype": "application/vnd.oasis.opendocument.text"}), r"has no content.xml"),
    "words.rtf": (lambda t: b"Hello, not RTF at all.", r"not RTF \(it does not begin with \{\\rtf\)"),
    "cut.rtf": (lambda t: RTF.encode("latin-1")[:len(RTF) // 2], r"RTF file is truncated or damaged"),
    "laughs.fb2": (lambda t: LAUGHS.encode(), r"FB2 file declares XML entities \(<!ENTITY>\)"),
    "external.fb2": (lambda t: EXTERNAL.encode(), r"FB2 file declares XML entities"),
    "parameter.fb2": (lambda t: PARAMETER.encode(), r"FB2 file declares XML entities"),
    "cut.fb2": (lambda t: fb2_bytes()[:700], r"FB2 file is not valid XML \(.*\); it is damaged or truncated"),
    "page.fb2": (lambda t: b"<?xml version='1.0'?><html><body><p>x</p></body></html>", r"not a FictionBook 2 book"),
    "bomb.fb2.zip": (lambda t: _zip({"book.fb2": fb2_bytes() + b" " * (20 << 20)}), r"zip bomb"),
    "laughs.fb2.zip": (lambda t: _zip({"book.fb2": LAUGHS}), r"FB2 file declares XML entities"),
    "readme.fb2.zip": (lambda t: _zip({"readme.txt": "no book here"}), r"holds no \.fb2 book"),
}


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_file_gets_its_reason_and_is_kept(tmp_path, name):
    make, reason = BAD[name]
    path = tmp_path / name
    path.write_bytes(make(tmp_path))
    before = _digest(path)
    with pytest.raises(IngestError, match=reason) as exc:
        load_document(path)
    assert "\n" not in str(exc.value) and path.exists() and _digest(path) == before


def test_the_sandboxed_child_reads_the_new_formats_and_says_why_it_refuses(tmp_path):
    from jobs.ingest.isolate import load_document_isolated

    (tmp_path / "b.azw3").write_bytes(mobi_book(KF8, version=8))
    (tmp_path / "b.fb2").write_bytes(fb2_bytes())
    for path in (tmp_path / "b.azw3", tmp_path / "b.fb2", make_odt(tmp_path / "b.odt")):
        assert load_document_isolated(path) == load_document(path), path.name
    (tmp_path / "drm.mobi").write_bytes(mobi_book(mobi6(), encryption=2))
    with pytest.raises(IngestError, match=DRM):
        load_document_isolated(tmp_path / "drm.mobi")


def test_the_inbox_files_bad_ebooks_in_failed_with_their_reasons(tmp_path):
    paths, q, w = inbox_env(tmp_path, quiet_s=0.3, closed_quiet_s=0.1)
    try:
        names = ("drm.mobi", "laughs.fb2", "locked.odt", "cut.rtf")
        for name in names:
            (paths.inbox / name).write_bytes(BAD[name][0](tmp_path))
        digests = {n: _digest(paths.inbox / n) for n in names}
        (paths.inbox / "good.fb2").write_bytes(fb2_bytes())
        ticks_until(w, lambda: all((paths.failed / f"{n}.reason.txt").exists() for n in names)
                    and len(q.jobs()) == len(names) + 1)
        for name in names:
            kept = paths.failed / name
            assert kept.exists() and _digest(kept) == digests[name], name
            first = (paths.failed / f"{name}.reason.txt").read_text()
            assert re.search(BAD[name][1], first), (name, first)
        assert sorted(j["state"] for j in q.jobs()) == ["failed"] * len(names) + ["queued"]
    finally:
        q.close()

