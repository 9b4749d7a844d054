"""The chunk-by-chunk encoders behind streamed HTTP speech (no daemon, no model)."""
from __future__ import annotations

import io
import shutil
import struct
import subprocess

import numpy as np
import pytest
import soundfile as sf

from audio.encode import pcm16
from audio.encode_stream import EncoderUnavailable, ForwardSink, StreamEncoder

SR = 24000
CHUNKS = [1920] + [7680] * 5  # the runner's shape: a one-frame first chunk, then bigger ones


def tone() -> np.ndarray:
    n = sum(CHUNKS)
    return (0.3 * np.sin(2 * np.pi * 220 * np.arange(n) / SR)).astype(np.float32)


def stream(fmt: str, with_encoder: bool = False):
    """Encode `tone()` chunk by chunk: (bytes per push, bytes from finish[, the encoder])."""
    enc, x, out, i = StreamEncoder(fmt, SR), tone(), [], 0
    for n in CHUNKS:
        out.append(enc.push(x[i:i + n]))
        i += n
    return (out, enc.finish()) + ((enc,) if with_encoder else ())


def test_forward_sink_hands_out_bytes_and_drops_late_fixups():
    s = ForwardSink()
    assert s.write(b"HEAD....") == 8 and s.take() == b"HEAD...." and s.take() == b""
    s.write(b"abc")
    s.seek(8)
    s.write(b"ABCD")  # rewrites bytes not handed out yet: kept
    s.seek(0)
    s.write(b"head")  # rewrites bytes already handed out: dropped
    assert s.dropped == 4 and s.tell() == 4
    s.seek(0, 2)
    assert s.tell() == 12 and s.take() == b"ABCD"


def test_wav_stream_has_an_unknown_length_header_then_the_pcm():
    out, tail = stream("wav")
    data = b"".join(out) + tail
    assert data[:4] == b"RIFF" and struct.unpack("<I", data[40:44])[0] == 0xFFFFFFFF
    assert data[44:] == pcm16(tone()) and len(out[0]) == 44 + 2 * CHUNKS[0]
    audio, sr = sf.read(io.BytesIO(data), dtype="int16")
    assert sr == SR and len(audio) == sum(CHUNKS)


def test_pcm_stream_is_the_samples():
    out, tail = stream("pcm")
    assert b"".join(out) == pcm16(tone()) and tail == b""


@pytest.mark.parametrize("fmt,magic", [("flac", b"fLaC"), ("mp3", b"\xff"), ("opus", b"OggS")])
def test_coded_streams_give_bytes_before_the_end(fmt, magic):
    out, tail, enc = stream(fmt, with_encoder=True)
    assert out[0].startswith(magic)
    before_end = sum(len(b) for b in out)
    assert before_end > 0.6 * (before_end + len(tail)), [len(b) for b in out] + [len(tail)]
    if fmt == "flac":  # STREAMINFO of a stream: total samples 0 ("unknown")
        assert int.from_bytes(out[0][21:26], "big") & 0xFFFFFFFFF == 0
    if fmt == "mp3":  # LAME's empty tag frame (rewritten on close, impossible in a stream) is left out
        placeholder = enc._sink.first_write
        assert placeholder > 4 and any(out[0][4:placeholder])


def test_opus_stream_decodes_to_the_exact_length():
    out, tail = stream("opus")
    audio, sr = sf.read(io.BytesIO(b"".join(out) + tail))
    assert sr == SR and len(audio) == sum(CHUNKS)


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg not on PATH: it decodes the flac/mp3 streams")
@pytest.mark.parametrize("fmt,pad", [("flac", 0), ("mp3", 3 * 576)])
def test_flac_and_mp3_streams_decode(fmt, pad):
    out, tail = stream(fmt)
    p = subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-f", fmt, "-i", "pipe:0", "-f", "s16le", "pipe:1"],
                       input=b"".join(out) + tail, capture_output=True, timeout=60)
    assert p.returncode == 0 and not p.stderr, p.stderr
    audio = np.frombuffer(p.stdout, "<i2")
    assert 0 <= len(audio) - sum(CHUNKS) <= pad
    if fmt == "flac":
        assert audio.tobytes() == pcm16(tone())


def test_close_without_finish_and_errors_that_say_what_to_do():
    enc = StreamEncoder("mp3", SR)
    enc.push(tone()[:1920])
    enc.close()
    enc.close()
    assert enc.finish() == b""
    with pytest.raises(RuntimeError, match="after finish"):
        enc.push(tone()[:10])
    with pytest.raises(EncoderUnavailable, match="choose flac"):
        StreamEncoder("opus", 44100)
    with pytest.raises(ValueError, match="pcm, wav"):
        StreamEncoder("aiff", SR)


def test_a_libsndfile_that_cannot_write_the_format_gets_a_clear_error(monkeypatch):
    def old_libsndfile(*args, **kwargs):
        raise RuntimeError("Error opening <ForwardSink>: Format not recognised.")

    monkeypatch.setattr(sf, "SoundFile", old_libsndfile)
    with pytest.raises(EncoderUnavailable, match=r"cannot encode mp3.*pip install -U soundfile.*choose pcm, wav or flac"):
        StreamEncoder("mp3", SR)
