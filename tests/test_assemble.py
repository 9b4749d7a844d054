"""Joining, loudness, formats and atomic writes of jobs.assemble (encoding: audio.encode)."""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
import soundfile as sf

from audio import encode as encode_mod
from audio.encode import encode
from jobs.assemble import AssemblyError, BookMeta, JoinSettings, assemble_book, atomic_path, join, rms_db

SR = 24000


def tone(seconds, amp, freq=220.0):
    """A cosine: starts at full amplitude, so a naive join would click."""
    t = np.arange(int(SR * seconds)) / SR
    return (amp * np.cos(2 * np.pi * freq * t)).astype(np.float32)


PIECES = [(tone(0.5, 0.05), 300), (tone(0.7, 0.6, 330), 150), (tone(0.4, 0.2, 180), 500)]


def test_duration_is_segments_plus_pauses():
    audio, spans = join(PIECES, SR)
    expected = sum(a.size for a, _ in PIECES) + sum(int(SR * p / 1000) for _, p in PIECES)
    assert audio.size == expected
    assert spans[1][0] == pytest.approx((PIECES[0][0].size + SR * 0.3) / SR)
    assert spans[2][1] - spans[2][0] == pytest.approx(0.4)


def test_no_clicks_at_joins():
    audio, spans = join(PIECES, SR)
    naive = np.concatenate([a for a, _ in PIECES])
    assert np.abs(np.diff(naive)).max() > 0.3  # the cosines would click when butted together
    for start, end in spans:
        for edge in (int(start * SR), int(end * SR)):
            window = audio[max(0, edge - 48): edge + 48]
            assert np.abs(np.diff(window)).max() < 0.06, "sample jump at a join"
    assert audio[int(spans[0][1] * SR) + 10] == 0.0  # the pause is silence


def test_loudness_consistent_and_peaks_limited():
    loud = [(tone(0.5, 1.6), 100)]  # beyond full scale before levelling
    audio, spans = join(PIECES + loud, SR, JoinSettings(target_rms_db=-6.0))
    assert np.abs(audio).max() < 1.0
    audio, spans = join(PIECES, SR)
    levels = [rms_db(audio[int(s * SR) + 480: int(e * SR) - 480]) for s, e in spans]
    assert max(levels) - min(levels) < 1.5
    assert all(abs(x - JoinSettings().target_rms_db) < 1.5 for x in levels)


def test_failed_segment_is_skipped():
    audio, spans = join([(tone(0.5, 0.1), 0), (None, 300), (tone(0.5, 0.1), 0)], SR)
    assert spans[1] is None and audio.size == 2 * int(SR * 0.5)


@pytest.mark.parametrize("fmt", ["wav", "flac", "opus", "mp3"])
def test_formats_readable_with_right_duration(tmp_path, fmt):
    if fmt == "mp3" and "MP3" not in sf.available_formats():
        pytest.skip("this libsndfile cannot write MP3")
    chapters = [("Opening", PIECES), ("The End", PIECES[:2])]
    book, outs, codec = assemble_book(tmp_path, chapters, SR, fmt, BookMeta(title="My Book", author="A. Writer"))
    assert book.name == f"My Book.{fmt}" and book.is_file()
    if fmt == "opus":
        assert codec == "OPUS"
    data, sr = sf.read(str(book))
    tol = 0.001 if fmt in ("wav", "flac") else 0.12  # lossy codecs pad a little
    assert data.shape[0] / sr == pytest.approx(outs[-1].end_s, abs=tol)
    for ch in outs:
        d, r = sf.read(str(ch.path))
        assert d.shape[0] / r == pytest.approx(ch.end_s - ch.start_s, abs=tol)
    assert [p.name for p in sorted((tmp_path / "chapters").iterdir())] == [f"01 - Opening.{fmt}", f"02 - The End.{fmt}"]
    assert not [p for p in tmp_path.rglob(".*")], "temp files left behind"


@pytest.mark.skipif(not shutil.which("ffmpeg"), reason="ffmpeg not installed (apt install ffmpeg)")
def test_m4b_has_chapters_and_metadata(tmp_path):
    cover = _png()
    chapters = [("Opening", PIECES), ("The End", PIECES[:2])]
    book, outs, codec = assemble_book(tmp_path, chapters, SR, "m4b",
                                      BookMeta("My Book", "A. Writer", cover, "image/png"))
    probe = subprocess.run(["ffprobe", "-v", "error", "-show_chapters", "-show_format", "-show_streams",
                            "-of", "json", str(book)], capture_output=True, text=True, check=True)
    info = json.loads(probe.stdout)
    assert [c["tags"]["title"] for c in info["chapters"]] == ["Opening", "The End"]
    assert float(info["chapters"][1]["start_time"]) == pytest.approx(outs[1].start_s, abs=0.01)
    assert info["format"]["tags"]["title"] == "My Book" and info["format"]["tags"]["artist"] == "A. Writer"
    assert float(info["format"]["duration"]) == pytest.approx(outs[-1].end_s, abs=0.1)
    assert any(s.get("disposition", {}).get("attached_pic") for s in info["streams"])


@pytest.mark.parametrize("fmt", ["mp3", "flac", "opus"])
def test_book_files_carry_chapter_marks(tmp_path, fmt):
    """mp3: ID3 CHAP frames under a CTOC; flac and opus: CHAPTERnnn / CHAPTERnnnNAME comments (mutagen)."""
    import mutagen

    if fmt == "mp3" and "MP3" not in sf.available_formats():
        pytest.skip("this libsndfile cannot write MP3")
    chapters = [("Opening", PIECES), ("The End", PIECES[:2])]
    book, outs, _ = assemble_book(tmp_path, chapters, SR, fmt, BookMeta(title="My Book", author="A. Writer"))
    tags = mutagen.File(book).tags
    if fmt == "mp3":
        chaps = sorted(tags.getall("CHAP"), key=lambda c: c.start_time)
        assert [c.sub_frames["TIT2"].text[0] for c in chaps] == ["Opening", "The End"]
        assert [(c.start_time, c.end_time) for c in chaps] == [(round(o.start_s * 1000), round(o.end_s * 1000))
                                                               for o in outs]
        [toc] = tags.getall("CTOC")
        assert toc.child_element_ids == [c.element_id for c in chaps]
    else:
        assert tags["CHAPTER001NAME"] == ["Opening"] and tags["CHAPTER002NAME"] == ["The End"]
        assert tags["CHAPTER001"] == ["00:00:00.000"]
        start = round(outs[1].start_s * 1000)
        assert tags["CHAPTER002"] == [f"00:00:{start // 1000:02d}.{start % 1000:03d}"]
        assert tags["TITLE"] == ["My Book"]  # the tags libsndfile wrote stay
    data, sr = sf.read(str(book))  # still a playable file of the same length
    assert data.shape[0] / sr == pytest.approx(outs[-1].end_s, abs=0.12)
    chapter_file = mutagen.File(outs[0].path).tags  # a chapter's own file has no marks
    assert not (chapter_file and (chapter_file.getall("CHAP") if fmt == "mp3" else "CHAPTER001" in chapter_file))


def test_job_format_names_match_the_speech_api():
    from appliance.http_speech import FORMATS as API
    from jobs.settings import FORMATS, JobSpec, audio_format

    # one name per format: opus is Ogg Opus in both; a narrated EPUB's audio is mp3
    assert {audio_format(f) for f in FORMATS} - {"m4b"} <= set(API) and audio_format("epub") == "mp3"
    assert JobSpec(format="ogg").format == "opus"  # the earlier name, in stored jobs and sidecars


def test_m4b_without_ffmpeg_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(encode_mod.shutil, "which", lambda name: None)
    with pytest.raises(AssemblyError, match=r"ffmpeg not found: install it \(apt install ffmpeg\) or choose flac/mp3"):
        encode(tmp_path / "b.m4b", tone(0.2, 0.1), SR, "m4b")


def test_mp3_unsupported_is_clear(tmp_path, monkeypatch):
    monkeypatch.setattr(encode_mod.sf, "available_formats", lambda: {"WAV": "WAV"})
    with pytest.raises(AssemblyError, match="cannot write MP3"):
        encode(tmp_path / "b.mp3", tone(0.2, 0.1), SR, "mp3")


def test_atomic_write_leaves_old_file_on_error(tmp_path):
    final = tmp_path / "out.wav"
    final.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(final) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("crash mid-write")
    assert final.read_bytes() == b"old" and list(tmp_path.iterdir()) == [final]


def _png() -> bytes:
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + b"\xff\x00\x00" * 8 for _ in range(8))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 8, 8, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


@pytest.mark.skipif(not shutil.which("ffprobe"), reason="ffmpeg not installed (apt install ffmpeg)")
@pytest.mark.parametrize("fmt", ["m4b", "mp3", "flac", "opus"])
def test_each_chapter_file_is_titled_with_its_chapter(tmp_path, fmt):
    """A chapter's own file: its title the chapter's, its album the book's, its artist the author (as ffprobe,
    and so players, read them); the book file: the book's title."""
    if fmt == "mp3" and "MP3" not in sf.available_formats():
        pytest.skip("this libsndfile cannot write MP3")
    chapters = [("Opening", PIECES), ("The End", PIECES[:2])]
    book, outs, _ = assemble_book(tmp_path, chapters, SR, fmt, BookMeta(title="My Book", author="A. Writer"))

    def tags(path):
        probe = subprocess.run(["ffprobe", "-v", "error", "-show_format", "-show_streams", "-of", "json", str(path)],
                               capture_output=True, text=True, check=True)
        info = json.loads(probe.stdout)
        found = {**info["format"].get("tags", {}), **info["streams"][0].get("tags", {})}  # ogg: the stream's
        return {k.lower(): v for k, v in found.items() if k.lower() in ("title", "album", "artist")}

    assert [tags(o.path) for o in outs] == [{"title": o.title, "album": "My Book", "artist": "A. Writer"}
                                            for o in outs]
    assert tags(book) == {"title": "My Book", "album": "My Book", "artist": "A. Writer"}
