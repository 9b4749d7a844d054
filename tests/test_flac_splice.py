"""A FLAC book made of its chapters' FLAC frames (audio.flac_splice), not encoded again: the same samples as
the chapters one after the other, read back by libsndfile, ffmpeg (CRCs checked) and the reference `flac -t`;
seekable; every frame's CRC-16 and header CRC-8 right; chapter files from libsndfile and from ffmpeg alike;
files that cannot be spliced said in one line."""
from __future__ import annotations

import io
import shutil
import subprocess

import numpy as np
import pytest
import soundfile as sf

from audio.encode import SoundFileEncoder
from audio.flac_splice import FlacSplice, SpliceError, coded_number, crc8, crc16
from jobs.assemble import BookWriter
from jobs.chapter_tags import write_chapter_tags

SR = 24000
decoders = pytest.mark.decoders


def speechlike(seconds: float, seed: int) -> np.ndarray:
    """Bursts of tones and noise with pauses, 16-sample aligned lengths or not (as `seconds` says)."""
    rng = np.random.default_rng(seed)
    n = int(SR * seconds)
    t = np.arange(n) / SR
    env = (np.sin(2 * np.pi * 3.1 * t) > -0.2).astype(np.float32)
    x = 0.3 * np.sin(2 * np.pi * (140 + 40 * seed) * t) + rng.normal(0, 0.04, n)
    return (x * env).astype(np.float32)


def libsndfile_flac(path, audio: np.ndarray, title: str = "c") -> np.ndarray:
    enc = SoundFileEncoder(path, SR, "flac", {"title": title})
    enc.write(audio)
    enc.close()
    return sf.read(path, dtype="int16")[0]


def ffmpeg_flac(path, audio: np.ndarray) -> np.ndarray:
    pcm = (np.clip(audio, -1, 1) * 32767).round().astype("<i2")
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "s16le", "-ar", str(SR), "-ac", "1", "-i", "pipe:0",
                    "-c:a", "flac", str(path)], input=pcm.tobytes(), check=True)
    return sf.read(path, dtype="int16")[0]


def splice(out_path, paths, tags=None) -> None:
    with open(out_path, "wb") as f:
        s = FlacSplice(f, SR, tags or {"title": "Book", "artist": "Someone"})
        for p in paths:
            s.append(p)
        s.close()


def frames(data: bytes, start: int) -> list[bytes]:
    """The spliced stream's frames: each ends where the next header numbered with its first sample begins (a
    test-side parser, independent of the splicer's)."""
    out, pos = [], start
    while pos < len(data):
        nxt = data.find(b"\xff\xf9", pos + 8)
        want = _number_at(data, pos) + _blocksize(data, pos)
        while nxt >= 0 and _number_at(data, nxt) != want:
            nxt = data.find(b"\xff\xf9", nxt + 1)
        nxt = len(data) if nxt < 0 else nxt
        out.append(data[pos:nxt])
        pos = nxt
    return out


def _blocksize(data: bytes, pos: int) -> int:
    code, n = data[pos + 2] >> 4, len(coded_number(_number_at(data, pos)))
    if code == 6:
        return data[pos + 4 + n] + 1
    if code == 7:
        return int.from_bytes(data[pos + 4 + n:pos + 6 + n], "big") + 1
    return {1: 192, **{c: 576 << (c - 2) for c in range(2, 6)}, **{c: 256 << (c - 8) for c in range(8, 16)}}[code]


def _number_at(data: bytes, pos: int) -> int:
    first, i = data[pos + 4], pos + 5
    if first < 0x80:
        return first
    more = 0
    while first & (0x40 >> more):
        more += 1
    n = first & (0x3F >> more)
    for k in range(more):
        n = (n << 6) | (data[i + k] & 0x3F)
    return n


@pytest.fixture(scope="module")
def chapters(tmp_path_factory):
    """Chapter files as the book writes them (libsndfile), one tiny, one past the splicer's read block."""
    d = tmp_path_factory.mktemp("chapters")
    lengths = [3.0, 0.004, 125.3, 7.77, 260.0]
    paths, pcm = [], []
    for k, seconds in enumerate(lengths):
        p = d / f"{k:02d}.flac"
        pcm.append(libsndfile_flac(p, speechlike(seconds, k), f"Chapter {k}"))
        paths.append(p)
    assert (d / "04.flac").stat().st_size > 1 << 22  # (more than one READ_BLOCK)
    return paths, pcm


def test_a_spliced_book_is_its_chapters_one_after_the_other(tmp_path, chapters):
    paths, pcm = chapters
    book = tmp_path / "book.flac"
    splice(book, paths)
    want = np.concatenate(pcm)
    got, sr = sf.read(book, dtype="int16")
    assert sr == SR and np.array_equal(got, want)
    with sf.SoundFile(book) as f:  # seeking (libFLAC's search by the frames' sample numbers)
        assert f.frames == want.size and f.title == "Book" and f.artist == "Someone"
        for pos in (0, 1, 72_000 + 5, 72_000 + 96, want.size // 2 + 333, want.size - 700, 3_000_001):
            f.seek(pos)
            assert np.array_equal(f.read(600, dtype="int16"), want[pos:pos + 600]), pos


def test_every_frame_has_its_checksums_and_number(tmp_path, chapters):
    paths, pcm = chapters
    short = paths[:4]  # (the CRCs here are computed in Python: a shorter book)
    book = tmp_path / "book.flac"
    splice(book, short)
    data = book.read_bytes()
    total = sum(p.size for p in pcm[:4])
    start = data.index(b"\xff\xf9")
    sample = 0
    for frame in frames(data, start):
        assert frame[:2] == b"\xff\xf9" and _number_at(frame, 0) == sample
        n = len(coded_number(sample))
        hlen = 4 + n + {6: 1, 7: 2}.get(frame[2] >> 4, 0)
        assert crc8(frame[:hlen]) == frame[hlen]
        assert crc16(frame[:-2]) == int.from_bytes(frame[-2:], "big")
        sample += _blocksize(frame, 0)
    assert sample == total


@decoders
def test_ffmpeg_and_the_reference_decoder_accept_it(tmp_path, chapters):
    if not (shutil.which("ffmpeg") and shutil.which("flac")):
        pytest.skip("ffmpeg and flac (apt-get install ffmpeg flac) decode the book here")
    paths, pcm = chapters
    book = tmp_path / "book.flac"
    splice(book, paths)
    r = subprocess.run(["ffmpeg", "-v", "error", "-err_detect", "crccheck+bitstream+buffer+explode", "-i", str(book),
                        "-f", "s16le", "-"], capture_output=True)
    assert r.returncode == 0 and not r.stderr, r.stderr[-500:]
    assert np.array_equal(np.frombuffer(r.stdout, "<i2"), np.concatenate(pcm))
    r = subprocess.run(["flac", "-t", "-s", str(book)], capture_output=True, text=True)  # every CRC, every frame
    assert r.returncode == 0, r.stderr[-500:]
    write_chapter_tags(book, "flac", [("One", 0.0, 3.0), ("Two", 3.0, 9.0)])  # the marks the book gets after
    assert np.array_equal(sf.read(book, dtype="int16")[0], np.concatenate(pcm))
    assert subprocess.run(["flac", "-t", "-s", str(book)], capture_output=True).returncode == 0


@decoders
def test_chapters_from_another_encoder_splice_too(tmp_path):
    """FLAC from ffmpeg (its own blocksize, its own metadata) beside libsndfile's: one stream of both."""
    if not shutil.which("ffmpeg"):
        pytest.skip("ffmpeg (apt-get install ffmpeg) writes the other encoder's chapters")
    a, b, c = tmp_path / "a.flac", tmp_path / "b.flac", tmp_path / "c.flac"
    pcm = [ffmpeg_flac(a, speechlike(4.2, 1)), libsndfile_flac(b, speechlike(2.5, 2)),
           ffmpeg_flac(c, speechlike(1.3, 3))]
    splice(tmp_path / "book.flac", [a, b, c])
    assert np.array_equal(sf.read(tmp_path / "book.flac", dtype="int16")[0], np.concatenate(pcm))


def test_what_cannot_be_spliced_is_said(tmp_path):
    (tmp_path / "not.flac").write_bytes(b"RIFF....WAVEfmt ")
    other = tmp_path / "other.flac"
    sf.write(other, np.zeros(4800, np.float32), 48000, format="FLAC", subtype="PCM_16")
    ok = tmp_path / "ok.flac"
    libsndfile_flac(ok, speechlike(3.0, 4))
    cut, short = tmp_path / "cut.flac", tmp_path / "short.flac"
    whole = ok.read_bytes()
    cut.write_bytes(whole[:whole.rfind(b"\xff\xf8")])  # its last frame gone
    short.write_bytes(ok.read_bytes()[:-7])  # its last frame cut short
    for path, says in ((tmp_path / "not.flac", "not a FLAC file"), (other, "48000 Hz"),
                       (cut, "its frames hold .* samples, its STREAMINFO says"), (short, "its last frame is cut")):
        with pytest.raises(SpliceError, match=says):
            FlacSplice(io.BytesIO(), SR, {}).append(path)


def test_a_flac_book_takes_its_chapters_frames(tmp_path, monkeypatch):
    """BookWriter: a FLAC book is its chapter files spliced (no spool, no second encoding); each chapter ends on
    a whole number of 16 samples, so only the book's last frame may be shorter."""
    import audio.encode as encode

    encoded = []
    real = encode.SoundFileEncoder.write

    def spy(self, audio):
        encoded.append(audio.size)
        real(self, audio)

    monkeypatch.setattr(encode.SoundFileEncoder, "write", spy)
    w = BookWriter(tmp_path, SR, "flac")
    for n, seconds in enumerate((1.00003, 2.5, 0.7), 1):
        w.add_chapter(f"Chapter {n}", [(speechlike(seconds, n), 250), (speechlike(0.3, n + 5), 0)])
    path, outs, codec = w.finish()
    book, _ = sf.read(path, dtype="int16")
    chapters = [sf.read(o.path, dtype="int16")[0] for o in outs]
    assert codec == "PCM_16" and np.array_equal(book, np.concatenate(chapters))
    assert all(c.size % 16 == 0 for c in chapters)
    assert sum(encoded) == book.size  # the audio was encoded once: into the chapter files
    assert [round(o.end_s - o.start_s, 4) for o in outs] == [round(c.size / SR, 4) for c in chapters]
