"""The narrated EPUB (format epub, jobs.narrated): an EPUB 3 input comes back as itself with its sentences in
id'd spans and Media Overlays, any other input as a simple EPUB of its text with the same overlays.

End to end with the REAL engine on the tiny checkpoint (`submit --format epub --wait`, in this process): every
text ref resolves to an id in its XHTML, every clip begins where the segment's cue in its chapter's .vtt does
and the clips tile the chapter's audio (each ends where the next begins, from 0 to the audio's end: the pauses
are heard), the durations are the audio's, the input's bytes come back once the inserted tags are taken out,
and epubcheck (Debian's package) finds no error and no warning (marker `epubcheck`: a skip where it is missing,
a failure where $TTS_APPLIANCE_REQUIRE_SYSTEM_TESTS=1, as .ci/run sets it as root). The books are narrated once
per session (`narrated`, tests/conftest.py); their accessibility, language and read-along text:
tests/test_narrated_access.py.
"""
from __future__ import annotations

import posixpath
import re
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path
from urllib.parse import unquote

import pytest
import soundfile as sf

from epub_util import (CH1, CH2, OPF, SMIL, clock_ms, epubcheck, epubcheck_missing, make_epub, metadata, overlays,
                       vtt_cues)

PREFIX = "tts-narration"


def _unwrapped(data: bytes) -> bytes:
    """A narrated XHTML file without the narration's spans (and their end tags) and stylesheet link."""
    out, stack, at = [], [], 0
    for m in re.finditer(rb'<span id="' + PREFIX.encode() + rb'-s[0-9-]+">|<span\b[^>]*>|</span\s*>', data):
        if m.group().startswith(b"</"):
            ours = stack.pop()
        else:
            ours = m.group().startswith(b'<span id="' + PREFIX.encode())
            stack.append(ours)
        if ours:
            out.append(data[at:m.start()])
            at = m.end()
    out.append(data[at:])
    return re.sub(rb'<link rel="stylesheet" type="text/css" href="[./]*' + PREFIX.encode() + rb'/narration.css"/>\n',
                  b"", b"".join(out))


def _audio_ms(path: Path) -> int:
    """How long a chapter's audio file plays, in ms, as a decoder reads it."""
    info = sf.info(str(path))
    return round(info.frames * 1000 / info.samplerate)


def _check_narration(src: Path, manifest: dict, out_dir: Path) -> dict:
    """Every check that holds for any input's narrated EPUB; returns {span id: the bytes it wraps}."""
    epub_path = Path(manifest["output"]["epub"])
    assert epub_path.parent == out_dir and epub_path.suffix == ".epub"
    epub = zipfile.ZipFile(epub_path)
    assert epub.infolist()[0].filename == "mimetype" and epub.infolist()[0].compress_type == zipfile.ZIP_STORED
    _, opf, found = overlays(epub)
    assert found, "no file carries a media overlay"
    segments = {e["index"]: (c, e) for c in manifest["chapters"] for e in c["segments"]}
    cues = {c["index"]: vtt_cues(Path(c["subtitles"][1])) for c in manifest["chapters"] if c["subtitles"]}
    cue_of = {}  # segment index -> its cue (the chapter's segments with audio, in order)
    for c in manifest["chapters"]:
        timed = [e["index"] for e in c["segments"] if e["start_s"] is not None]
        cue_of.update(zip(timed, cues.get(c["index"], [])))
    metas = metadata(opf)
    assert metas[("media:active-class", None)]
    wrapped, narrated, total = {}, set(), 0
    clips: dict[str, list[tuple[int, int]]] = {}  # audio member -> its clips, in reading order
    for overlay, (smil_path, doc_path) in found.items():
        doc = epub.read(doc_path)
        ids = {e.get("id") for e in ET.fromstring(doc).iter() if e.get("id")}
        length = 0
        for par in ET.fromstring(epub.read(smil_path)).iter(SMIL + "par"):
            text, audio = par.find(SMIL + "text"), par.find(SMIL + "audio")
            target, _, frag = text.get("src").partition("#")
            assert posixpath.normpath(posixpath.join(posixpath.dirname(smil_path), unquote(target))) == doc_path
            assert frag in ids, f"{text.get('src')} does not resolve"
            index = int(frag.rsplit("-s", 1)[1])
            chapter, entry = segments[index]
            cue = cue_of[index]
            begin, end = clock_ms(audio.get("clipBegin")), clock_ms(audio.get("clipEnd"))
            member = posixpath.normpath(posixpath.join(posixpath.dirname(smil_path), unquote(audio.get("src"))))
            assert epub.read(member) == Path(chapter["file"]).read_bytes()  # the chapter's own audio file
            # its sentence and the pause after it: begins where its cue does (the chapter's first at 0)
            assert audio.get("clipBegin") == (cue[0] if member in clips else "00:00:00.000"), (entry, cue)
            assert end >= clock_ms(cue[1]) and end > begin, (entry, cue)
            assert cue[2] == " ".join(entry["original"].split())
            clips.setdefault(member, []).append((begin, end))
            length += end - begin
            narrated.add(index)
        assert clock_ms(metas[("media:duration", "#" + overlay)][0]) == length
        total += length
        body = doc
        for m in re.finditer(rb'<span id="(' + PREFIX.encode() + rb'-s[0-9-]+)">', body):
            depth, at = 1, m.end()
            for t in re.finditer(rb"<span\b[^>]*>|</span\s*>", body[at:]):
                depth += -1 if t.group().startswith(b"</") else 1
                if depth == 0:
                    wrapped[m.group(1).decode()] = body[at:at + t.start()]
                    break
    for chapter in manifest["chapters"]:  # the clips of each chapter's audio tile it: no moment is in no clip
        [tiles] = [t for member, t in clips.items() if epub.read(member) == Path(chapter["file"]).read_bytes()]
        ends = round((chapter["book_end_s"] - chapter["book_start_s"]) * 1000)
        assert tiles[0][0] == 0 and all(a[1] == b[0] for a, b in zip(tiles, tiles[1:])), tiles
        assert abs(tiles[-1][1] - ends) <= 1, (tiles[-1], ends)  # the manifest's times, rounded to 1 ms
        assert abs(tiles[-1][1] - _audio_ms(Path(chapter["file"]))) <= 30, "the mp3 plays as long as its clips"
    assert clock_ms(metas[("media:duration", None)][0]) == total == sum(b - a for t in clips.values() for a, b in t)
    spoken = {i for i, (_, e) in segments.items() if e["status"] == "done"}
    assert narrated == spoken, f"segments without a par: {sorted(spoken - narrated)}"
    return wrapped


def test_an_epub_comes_back_as_itself_narrated(narrated):
    src, manifest, out_dir = narrated[".epub"]
    wrapped = _check_narration(src, manifest, out_dir)
    original, epub = zipfile.ZipFile(src), zipfile.ZipFile(manifest["output"]["epub"])
    for name in original.namelist():  # the book's own files: unchanged once the narration's tags are out
        data = epub.read(name)
        if name.endswith(".xhtml"):
            ET.fromstring(data)  # still well-formed
            assert _unwrapped(data) == original.read(name), name
        elif name.endswith(".opf"):
            assert data != original.read(name)
        else:
            assert data == original.read(name), name
    text = {k: re.sub(rb"\s+", b" ", v).decode() for k, v in wrapped.items()}
    by_text = {" ".join(e["original"].split()): e["index"] for c in manifest["chapters"] for e in c["segments"]}
    title = by_text["The Morning"]
    assert text[f"{PREFIX}-s{title}"] == "The <em>Morning</em>"  # the heading's own text, its <em> taken in whole
    crossing = by_text["Nobody at the table spoke a word at breakfast."]  # begins inside <em>, ends outside
    assert text[f"{PREFIX}-s{crossing}"] == "Nobody at the table"
    assert text[f"{PREFIX}-s{crossing}-2"] == "spoke a word at breakfast."
    holding = by_text["Tom & Anna left early, long before the others had woken."]
    assert text[f"{PREFIX}-s{holding}"] == "Tom &amp; Anna left <i>early</i>, long before the others had woken."
    marker = by_text["He waited by the door."]  # the footnote marker the text dropped stays in place
    assert text[f"{PREFIX}-s{marker}"] == 'He waited<a epub:type="noteref" href="#n1">1</a> by the door.'


def test_any_other_input_becomes_a_simple_narrated_epub(narrated):
    src, manifest, out_dir = narrated[".md"]
    wrapped = _check_narration(src, manifest, out_dir)
    text = {k: v.decode() for k, v in wrapped.items()}
    assert "A short note to start." in text.values() and "First Steps" in text.values()
    assert "in another voice" in text.values()  # a voice tag's run is a sentence of its own; no tag in the text
    epub = zipfile.ZipFile(manifest["output"]["epub"])
    assert not any(b"[voice=" in epub.read(n) for n in epub.namelist())


def test_a_text_file_becomes_a_simple_narrated_epub(narrated):
    src, manifest, out_dir = narrated[".txt"]
    wrapped = _check_narration(src, manifest, out_dir)
    assert b"Chapter 1: The Beginning" in wrapped.values() and b"Nobody looked up." in wrapped.values()


@pytest.mark.epubcheck
@pytest.mark.parametrize("kind", [".epub", ".md", ".txt"])
def test_epubcheck_finds_no_error_and_no_warning(narrated, kind):
    if epubcheck_missing():
        pytest.skip(epubcheck_missing())
    errors, warnings, out = epubcheck(Path(narrated[kind][1]["output"]["epub"]))
    assert not errors and not warnings, out


@pytest.mark.epubcheck
def test_the_test_input_is_a_valid_epub(tmp_path):
    """The input the narration tests start from passes epubcheck itself (so what they check is ours)."""
    if epubcheck_missing():
        pytest.skip(epubcheck_missing())
    errors, warnings, out = epubcheck(make_epub(tmp_path / "in.epub"))
    assert not errors and not warnings, out


def test_positions_cross_the_sandbox_and_point_at_the_bytes(tmp_path):
    from jobs.ingest import load_document
    from jobs.ingest.isolate import load_document_isolated

    path = make_epub(tmp_path / "b.epub")
    doc = load_document_isolated(path)
    assert doc == load_document(path)  # the same document, positions included, from the child
    z = zipfile.ZipFile(path)
    sources = [s for c in doc.chapters for s in [c.title_source, *c.sources] if s]
    assert len(sources) == 6
    for s in sources:
        data = z.read(s.doc)
        for run in s.runs:
            assert data[run.start:run.end].decode() == run.raw
        for e in s.elements:
            assert data[e.open:e.open + 1] == b"<" and data[e.close - 1:e.close] == b">"
    package = doc.package
    opf = z.read(package.opf)
    assert package.problem is None and package.prefix == PREFIX
    assert opf[package.manifest_end:].startswith(b"</manifest>")
    assert opf[package.metadata_end:].startswith(b"</metadata>")
    assert {k: opf[v:v + 3] for k, v in package.items.items()} == {
        "OEBPS/text/ch1.xhtml": b"/>\n", "OEBPS/text/ch2.xhtml": b" />"}
    assert all(z.read(d)[at:].startswith(b"</head>") for d, at in package.heads.items())


def test_an_epub_that_cannot_carry_the_narration_becomes_a_new_epub(tmp_path, caplog):
    """An EPUB 2, one with overlays already, one whose files are not UTF-8: a simple EPUB of the text."""
    from jobs.ingest import load_document
    from jobs.narrated.prepare import prepare_narration
    from jobs.settings import JobSpec
    from jobs.submit import document_chapters

    old = make_epub(tmp_path / "old.epub", {"OEBPS/content.opf": OPF.replace('version="3.0"', 'version="2.0"')})
    taken = make_epub(tmp_path / "taken.epub", {"OEBPS/content.opf": OPF.replace(
        'href="text/ch1.xhtml"', 'href="text/ch1.xhtml" media-overlay="mo"')})
    wide = make_epub(tmp_path / "wide.epub", {f"OEBPS/text/{name}.xhtml": text.replace(
        'encoding="UTF-8"', 'encoding="UTF-16"').encode("utf-16") for name, text in (("ch1", CH1), ("ch2", CH2))})
    for path, why in ((old, "it is EPUB 2.0"), (taken, "it has media overlays"),
                      (wide, "none of its text could be found")):
        doc = load_document(path)
        assert path is wide or doc.package.problem.startswith(why)
        chapters = document_chapters(doc, JobSpec(format="epub", language="english"))
        with caplog.at_level("INFO"):
            entry = prepare_narration(tmp_path / "home", doc, chapters, path, "en", "T", None)
        assert entry["generated"] and why in caplog.text
        assert all(s.metadata.get("source") for _, segs in chapters for s in segs)


def test_a_file_changed_after_it_was_read_is_refused(tmp_path):
    from jobs.errors import IngestError
    from jobs.ingest import load_document
    from jobs.narrated.prepare import prepare_narration
    from jobs.settings import JobSpec
    from jobs.submit import document_chapters

    path = make_epub(tmp_path / "b.epub")
    doc = load_document(path)
    chapters = document_chapters(doc, JobSpec(format="epub", language="english"))
    make_epub(path, {"OEBPS/text/ch1.xhtml": CH1.replace("grey", "gray")})
    with pytest.raises(IngestError, match="changed while it was read; submit it again"):
        prepare_narration(tmp_path / "home", doc, chapters, path, "en", "T", None)


def test_markup_that_is_not_plainly_well_formed_gets_no_positions():
    from jobs.ingest.xmlscan import scan

    assert scan("<p>a <em>b</p></em>") is None  # tags out of place
    assert scan("<p>a < b</p>") is None  # a stray <
    assert scan('<!DOCTYPE x [<!ENTITY e "<b>">]><p>&e;</p>') is None  # entities that could expand to markup
    found = scan('<?xml version="1.0"?>\n<p id="x">a <em>b</em> c<br/></p>\n')
    assert [found.runs[i][2] for i in range(len(found.runs))] == [1, 2, 1]
    assert found.elements[2][3:5] == [found.runs[1][0], found.runs[1][1]]


def test_epub_is_a_book_format_of_the_cli_the_sidecar_and_the_api():
    from click.testing import CliRunner

    from appliance.cli import cli
    from jobs.settings import JobSpec, audio_format

    assert JobSpec.parse({"format": "epub"}).format == "epub"  # POST /v1/jobs
    assert JobSpec.from_dict({"format": "EPUB"}).format == "epub"  # a sidecar
    assert audio_format("epub") == "mp3" and audio_format("flac") == "flac"
    assert "epub" in CliRunner().invoke(cli, ["submit", "--help"]).output


def test_clips_tile_their_audio_whatever_is_not_highlighted():
    """`tile`: per audio file, in time order, each clip runs to the next one's begin (a sentence left unwrapped,
    here the one at 900-1400 ms, is heard within the clip before it), the first from 0, the last to the end."""
    from jobs.narrated.smil import Par, duration_ms, tile

    pars = [Par("b.xhtml", "s4", "2.mp3", 0, 700), Par("a.xhtml", "s1", "1.mp3", 0, 400),
            Par("a.xhtml", "s2", "1.mp3", 600, 800), Par("a.xhtml", "s3", "1.mp3", 1500, 1900),
            Par("b.xhtml", "s5", "2.mp3", 900, 1300)]
    tiled = tile(pars, {"1.mp3": 2400, "2.mp3": 1800})
    assert [(p.span_id, p.begin_ms, p.end_ms) for p in tiled] == [
        ("s4", 0, 900), ("s1", 0, 600), ("s2", 600, 1500), ("s3", 1500, 2400), ("s5", 900, 1800)]
    assert duration_ms(tiled) == 2400 + 1800
