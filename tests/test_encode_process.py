"""A book's file is encoded in a process of its own (audio.encode_process): the same file the encoder writes in
this process, its failures in one line, nothing left running after an abort or when its parent goes away."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from audio.encode import EncodeError, SoundFileEncoder
from audio.encode_process import AUDIO, ProcessEncoder
from jobs.assemble import BookWriter

SR = 24000
TAGS = {"title": "A title", "artist": "An author", "album": "A book"}
MARKS = [("One", 0.0, 4.0), ("Two", 4.0, 9.0)]


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(SR * seconds))
    return (0.4 * np.sin(t * 2 * np.pi * 220 / SR) * np.exp(-t / (SR * 20))).astype(np.float32)


@pytest.mark.parametrize("fmt", ["flac", "wav", "mp3", "opus"])
def test_the_child_writes_what_the_encoder_writes_here(tmp_path, fmt):
    if fmt == "mp3" and "MP3" not in sf.available_formats():
        pytest.skip("this libsndfile cannot write MP3")
    audio = tone(9.0)
    enc = ProcessEncoder(tmp_path / f"child.{fmt}", SR, fmt, TAGS)
    for i in range(0, audio.size, 50_000):  # blocks of any length
        enc.write(audio[i:i + 50_000])
    codec = enc.close(MARKS)
    here = SoundFileEncoder(tmp_path / f"here.{fmt}", SR, fmt, TAGS)
    here.write(audio)
    assert codec == here.close(MARKS) and enc.proc.returncode == 0
    a, sr_a = sf.read(tmp_path / f"child.{fmt}", dtype="float32")
    b, sr_b = sf.read(tmp_path / f"here.{fmt}", dtype="float32")
    assert sr_a == sr_b and np.array_equal(a, b) and a.size >= audio.size * 0.99
    if fmt in ("flac", "wav", "mp3"):  # (an Ogg stream has a random serial number)
        assert (tmp_path / f"child.{fmt}").read_bytes() == (tmp_path / f"here.{fmt}").read_bytes()
    if fmt == "flac":
        with sf.SoundFile(tmp_path / f"child.{fmt}") as f:
            assert (f.title, f.artist, f.album) == ("A title", "An author", "A book")


def test_a_failure_in_the_child_is_one_line(tmp_path):
    enc = ProcessEncoder(tmp_path / "no" / "such" / "folder" / "book.flac", SR, "flac", TAGS)
    with pytest.raises(EncodeError, match="^encoding book.flac: .*book.flac") as info:
        enc.write(tone(1.0))
        enc.close()
    assert "\n" not in str(info.value) and enc.proc.returncode == 1
    with pytest.raises(EncodeError, match="unknown format"):  # told here, before a child starts
        ProcessEncoder(tmp_path / "book.xyz", SR, "xyz", TAGS)


def test_an_abort_leaves_no_child(tmp_path):
    enc = ProcessEncoder(tmp_path / "book.flac", SR, "flac", TAGS)
    enc.write(tone(2.0))
    enc.abort()
    assert enc.proc.returncode is not None


def test_the_child_stops_when_its_parent_goes_away(tmp_path):
    """A pipe that ends without the close message (the daemon killed): the child stops, exit 1."""
    args = json.dumps({"path": str(tmp_path / "book.flac"), "sample_rate": SR, "fmt": "flac", "tags": TAGS})
    proc = subprocess.Popen([sys.executable, "-m", "audio.encode_process", args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    data = tone(1.0).tobytes()
    proc.stdin.write(AUDIO + len(data).to_bytes(8, "little") + data)
    proc.stdin.close()
    assert proc.wait(120) == 1 and proc.stdout.read() == b""  # (a failure guard, not a speed limit)


def test_a_book_file_is_written_by_a_child(tmp_path, monkeypatch):
    """BookWriter's book goes through a ProcessEncoder (its chapters stay here), and equals its chapters joined."""
    started = []
    real = ProcessEncoder.__init__

    def spy(self, *a, **k):
        started.append(a[0])
        real(self, *a, **k)

    monkeypatch.setattr(ProcessEncoder, "__init__", spy)
    w = BookWriter(tmp_path, SR, "flac")
    for n in (1, 2):
        w.add_chapter(f"Chapter {n}", [(tone(1.5), 300), (tone(0.5), 0)])
    path, outs, codec = w.finish()
    assert len(started) == 1 and codec == "PCM_16"
    book, _ = sf.read(path, dtype="float32")
    chapters = np.concatenate([sf.read(o.path, dtype="float32")[0] for o in outs])
    assert np.array_equal(book, chapters) and book.size > SR * 4
