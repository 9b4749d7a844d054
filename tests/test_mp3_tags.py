"""MP3 books' ID3 tags (audio.id3): title, artist and album in UTF-8 read back exactly, and chapter marks in
chapter order, as mutagen and ffprobe read them. (The tags were libsndfile's ID3v1, UTF-8 bytes flagged Latin-1:
"ZoÃ« MÃ¼ller"; and mutagen saved the CHAP frames shortest first, so ffprobe listed a later chapter first.)"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import soundfile as sf

from audio.encode import encode
from audio.id3 import CTOC_MAX, write_id3
from jobs.assemble import BookMeta, assemble_book

pytestmark = pytest.mark.skipif("MP3" not in sf.available_formats(), reason="this libsndfile cannot write MP3")
SR = 24000
TITLE, AUTHOR = "Straße der Bücher", "Zoë Müller"
# lengths that a size-ordered writer would shuffle: the longest first, the shortest in the middle
CHAPTERS = ["Der allererste und bei weitem längste Abschnitt", "Zwei", "Größe und Maß", "Ende, Œuvre, 終わり"]


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(SR * seconds)) / SR
    return (0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    out = tmp_path_factory.mktemp("mp3book")
    chapters = [(title, [(tone(0.3 + 0.1 * i), 200)]) for i, title in enumerate(CHAPTERS)]
    return assemble_book(out, chapters, SR, "mp3", BookMeta(title=TITLE, author=AUTHOR))


def text_of(tags, frame_id: str) -> str:
    from mutagen.id3 import Encoding

    [frame] = tags.getall(frame_id)
    assert frame.encoding in (Encoding.UTF8, Encoding.UTF16), (frame_id, frame.encoding)  # not Latin-1
    return frame.text[0]


def test_text_tags_read_back_exactly(book):
    from mutagen.id3 import ID3

    path, outs, _ = book
    tags = ID3(path)
    assert (text_of(tags, "TIT2"), text_of(tags, "TPE1"), text_of(tags, "TALB")) == (TITLE, AUTHOR, TITLE)
    for out in outs:  # each chapter's own file: its title, the book's author and album, no chapter marks
        own = ID3(out.path)
        assert (text_of(own, "TIT2"), text_of(own, "TPE1"), text_of(own, "TALB")) == (out.title, AUTHOR, TITLE)
        assert not own.getall("CHAP") and not own.getall("CTOC")


def test_chapter_frames_are_in_chapter_order(book):
    from mutagen.id3 import ID3, CTOCFlags

    path, outs, _ = book
    tags = ID3(path)
    chaps = tags.getall("CHAP")  # in the order the frames stand in the file
    assert [c.sub_frames["TIT2"].text[0] for c in chaps] == CHAPTERS
    assert [(c.start_time, c.end_time) for c in chaps] == [(round(o.start_s * 1000), round(o.end_s * 1000))
                                                           for o in outs]
    [toc] = tags.getall("CTOC")
    assert toc.flags == CTOCFlags.TOP_LEVEL | CTOCFlags.ORDERED
    assert toc.child_element_ids == [c.element_id for c in chaps]
    data, sr = sf.read(str(path))  # the tag in front leaves a playable file of the book's length
    assert data.shape[0] / sr == pytest.approx(outs[-1].end_s, abs=0.12)


@pytest.mark.skipif(not shutil.which("ffprobe"), reason="ffprobe not installed (apt install ffmpeg)")
def test_ffprobe_lists_the_chapters_in_order(book):
    path, outs, _ = book
    probe = subprocess.run(["ffprobe", "-v", "error", "-show_chapters", "-show_format", "-of", "json", str(path)],
                           capture_output=True, text=True, check=True)
    info = json.loads(probe.stdout)
    assert [c["tags"]["title"] for c in info["chapters"]] == CHAPTERS
    assert [float(c["start_time"]) for c in info["chapters"]] == pytest.approx([o.start_s for o in outs], abs=0.001)
    tags = info["format"]["tags"]
    assert (tags["title"], tags["artist"], tags["album"]) == (TITLE, AUTHOR, TITLE)


def test_more_chapters_than_one_ctoc_holds(tmp_path):
    """A CTOC lists at most 255 entries: the top-level one lists ordered CTOCs of up to 255 chapters each.
    Writing the tag keeps the file's mode and replaces the tag it had."""
    from mutagen.id3 import ID3, CTOCFlags

    path = tmp_path / "many.mp3"
    encode(path, tone(3.0), SR, "mp3")
    os.chmod(path, 0o640)
    n = CTOC_MAX + 45
    chapters = [(f"Kapitel {i + 1}", i * 0.01, (i + 1) * 0.01) for i in range(n)]
    write_id3(path, {"title": "Erst"}, chapters[:3])
    write_id3(path, {"title": TITLE, "artist": AUTHOR}, chapters)
    assert (path.stat().st_mode & 0o777) == 0o640
    tags = ID3(path)
    assert [c.sub_frames["TIT2"].text[0] for c in tags.getall("CHAP")] == [t for t, _, _ in chapters]
    tocs = {t.element_id: t for t in tags.getall("CTOC")}
    top = tocs.pop("toc")
    assert top.flags == CTOCFlags.TOP_LEVEL | CTOCFlags.ORDERED and top.child_element_ids == ["toc1", "toc2"]
    listed = tocs["toc1"].child_element_ids + tocs["toc2"].child_element_ids
    assert len(tocs["toc1"].child_element_ids) == CTOC_MAX
    assert listed == [c.element_id for c in tags.getall("CHAP")]
    assert text_of(tags, "TIT2") == TITLE and text_of(tags, "TPE1") == AUTHOR
    assert sf.info(str(path)).duration == pytest.approx(3.0, abs=0.12)
