"""Encoding audio chunk by chunk for streamed HTTP responses.

`StreamEncoder(fmt, sample_rate)`: `push(float32 chunk)` returns the encoded bytes ready now,
`finish()` the rest, `close()` drops an unfinished stream. A push for flac/mp3/opus may take a
millisecond or two: `blocking` says whether a caller on an event loop should run it in a thread
(pushes of one encoder must not overlap; a lock makes a late `close()` wait for a running push).

pcm   signed 16-bit little-endian mono, as is
wav   44-byte header with the "unknown length" sizes (0xFFFFFFFF), then 16-bit samples
flac, mp3, opus (Ogg)
      libsndfile (bundled with the soundfile wheel) encodes into a forward-only sink whose bytes
      are handed out as soon as the encoder writes them. The header fix-ups libsndfile makes on
      close would rewrite bytes already sent, so they are dropped, leaving the usual values of a
      streamed file: FLAC STREAMINFO with total samples 0 ("unknown") and no MD5, MP3 without the
      Xing/LAME tag (decoders keep the encoder delay and padding, about 1100 samples at 24 kHz).
      libsndfile emits FLAC in 4096-sample blocks (the first audio frame after ~0.17 s of audio at
      24 kHz), MP3 frame by frame, and Ogg pages every OGG_PAGE_MS.
aac   AAC in ADTS frames (what OpenAI's `aac` is), from an ffmpeg child fed 16-bit PCM (`FfmpegPipe`);
      ADTS has no length header, so a stream and a whole file are the same bytes.

`encode_whole(audio, sample_rate, fmt)`: one complete file with exact length headers (WAV sizes, FLAC
totals, MP3 Xing/LAME tag: `audio.encode.encode_bytes`; aac through the same ffmpeg child).
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import threading

import numpy as np

from audio.encode import OPUS_RATES, SOUNDFILE, encode_bytes, pcm16, wav_header

log = logging.getLogger(__name__)

# the formats of the speech API (OpenAI's response_format) -> their Content-Type
CONTENT_TYPES = {"pcm": "audio/pcm", "wav": "audio/wav", "flac": "audio/flac", "mp3": "audio/mpeg", "opus": "audio/ogg",
                 "aac": "audio/aac"}
# libsndfile major format and subtype of the coded formats
CODED = {fmt: SOUNDFILE[fmt] for fmt in ("flac", "mp3", "opus")}
OGG_PAGE_MS = 60.0  # libsndfile's default Ogg page latency is 1000 ms: too late for a stream
_SFC_SET_OGG_PAGE_LATENCY_MS = 0x1302  # sndfile.h (libsndfile >= 1.1)


class EncoderUnavailable(RuntimeError):
    """This machine cannot encode the format (the message says what to install or choose)."""


class ForwardSink:
    """A write-only file for libsndfile's virtual I/O that hands bytes out as they are written.

    Writes at or after the first byte not yet taken are kept; writes to bytes already taken (header
    fix-ups at close) cannot reach the client any more and are counted in `dropped`.
    """

    def __init__(self):
        self.sent = 0                 # bytes handed out by take()
        self.pos = 0
        self.dropped = 0
        self.first_write = 0          # size of the first write (the MP3 placeholder frame)
        self._pending = bytearray()   # bytes [sent, sent + len)

    @property
    def size(self) -> int:
        return self.sent + len(self._pending)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self.pos, self.size)[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:  # libsndfile's writers used here never read back
        return b""

    def write(self, data) -> int:
        data = bytes(data)
        n, start = len(data), self.pos
        if not self.first_write:
            self.first_write = n
        if start < self.sent:
            skip = min(n, self.sent - start)
            self.dropped += skip
            data, start = data[skip:], start + skip
        if data:
            off = start - self.sent
            if off > len(self._pending):
                self._pending.extend(bytes(off - len(self._pending)))
            self._pending[off:off + len(data)] = data
        self.pos += n
        return n

    def take(self) -> bytes:
        out = bytes(self._pending)
        self.sent += len(out)
        self._pending.clear()
        return out


class FfmpegPipe:
    """AAC (ADTS) from an ffmpeg child: 16-bit PCM goes to its stdin, a thread gathers what it writes to
    stdout (so a full stdout pipe never blocks a write), `take()` hands it out."""

    BITRATE = "64k"

    def __init__(self, sample_rate: int):
        ffmpeg = shutil.which("ffmpeg")
        if not ffmpeg:
            raise EncoderUnavailable("aac is encoded by ffmpeg, which is not installed: apt install ffmpeg, "
                                     "or choose mp3, opus, flac, wav or pcm")
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [ffmpeg, "-hide_banner", "-v", "error", "-probesize", "32", "-analyzeduration", "0", "-f", "s16le", "-ar", str(sample_rate), "-ac", "1", "-i", "pipe:0",
             "-c:a", "aac", "-b:a", self.BITRATE, "-f", "adts", "-flush_packets", "1", "pipe:1"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err)
        self._out = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._gather, name="ffmpeg-aac", daemon=True)
        self._reader.start()

    def _gather(self) -> None:
        fd = self.proc.stdout.fileno()
        while data := os.read(fd, 65536):
            with self._lock:
                self._out += data

    def write(self, pcm: bytes) -> None:
        try:
            self.proc.stdin.write(pcm)
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise RuntimeError(f"ffmpeg (aac) stopped: {self._error()}") from None

    def take(self) -> bytes:
        with self._lock:
            out = bytes(self._out)
            self._out.clear()
        return out

    def finish(self) -> bytes:
        """End of input: wait for ffmpeg to flush and exit; the last bytes."""
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self._reader.join()
        if self.proc.wait() != 0:
            raise RuntimeError(f"ffmpeg (aac) failed: {self._error()}")
        self._err.close()
        return self.take()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._reader.join()
        for f in (self.proc.stdin, self._err):
            try:
                f.close()
            except OSError:
                pass

    def _error(self) -> str:
        self._err.seek(0)
        return self._err.read().decode(errors="replace").strip()[-500:] or f"exit status {self.proc.poll()}"


def encode_whole(audio: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """`audio` as one complete file in `fmt` (any format of StreamEncoder)."""
    if fmt != "aac":
        return encode_bytes(audio, sample_rate, fmt)
    enc = StreamEncoder(fmt, sample_rate)
    try:
        return enc.push(audio) + enc.finish()
    finally:
        enc.close()


def _is_placeholder_frame(frame: bytes) -> bool:
    """LAME's first frame before its Xing/LAME tag is filled in: an MPEG header then only zeros."""
    return len(frame) > 4 and frame[0] == 0xFF and frame[1] & 0xE0 == 0xE0 and not any(frame[4:])


class StreamEncoder:
    def __init__(self, fmt: str, sample_rate: int):
        if fmt not in ("pcm", "wav", "aac") and fmt not in CODED:
            raise ValueError(f"cannot stream {fmt!r}; formats: pcm, wav, aac, {', '.join(CODED)}")
        self.fmt, self.sample_rate = fmt, sample_rate
        self.blocking = fmt in CODED or fmt == "aac"
        self.samples = 0
        self._lock = threading.Lock()
        self._started = self._done = False
        self._sink = self._file = self._pipe = None
        if fmt in CODED:
            self._open()
        elif fmt == "aac":
            self._pipe = FfmpegPipe(sample_rate)

    def _open(self) -> None:
        import soundfile as sf

        major, sub = CODED[self.fmt]
        if self.fmt == "opus" and self.sample_rate not in OPUS_RATES:
            raise EncoderUnavailable(f"opus needs a sample rate of 8, 12, 16, 24 or 48 kHz, not {self.sample_rate} Hz; "
                                     "choose flac, mp3, wav or pcm")
        self._sink = ForwardSink()
        try:
            self._file = sf.SoundFile(self._sink, "w", samplerate=self.sample_rate, channels=1, format=major,
                                      subtype=sub)
        except (RuntimeError, ValueError, TypeError) as exc:  # LibsndfileError is a RuntimeError
            raise EncoderUnavailable(
                f"cannot encode {self.fmt}: libsndfile {sf.__libsndfile_version__} says {exc}; update it "
                "(pip install -U soundfile brings libsndfile >= 1.1 with MP3 and Opus) or choose pcm, wav or flac"
            ) from None
        if self.fmt == "opus":
            self._set_page_latency(sf)

    def _set_page_latency(self, sf) -> None:
        try:  # soundfile has no wrapper for this command: its cffi handles are the way in
            value = sf._ffi.new("double *", OGG_PAGE_MS)
            sf._snd.sf_command(self._file._file, _SFC_SET_OGG_PAGE_LATENCY_MS, value, sf._ffi.sizeof("double"))
        except AttributeError as exc:
            log.warning("cannot shorten Ogg pages (%s): opus streams arrive in ~1 s pieces", exc)

    def push(self, chunk) -> bytes:
        """Encode one float32 chunk; returns the bytes that are ready (may be empty)."""
        audio = np.asarray(chunk, dtype=np.float32).reshape(-1)
        with self._lock:
            if self._done:
                raise RuntimeError("push after finish/close")
            self.samples += len(audio)
            if self._pipe is not None:
                self._pipe.write(pcm16(audio))
                return self._pipe.take()
            if self._file is None:
                head = b"" if self._started or self.fmt == "pcm" else wav_header(self.sample_rate)
                self._started = True
                return head + pcm16(audio)
            if len(audio):  # FLAC gets the very samples pcm/wav send (libsndfile rounds differently)
                self._file.write(np.frombuffer(pcm16(audio), "<i2") if self.fmt == "flac" else audio)
            return self._take()

    def finish(self) -> bytes:
        """Flush the encoder; returns the last bytes of the stream."""
        with self._lock:
            if self._done:
                return b""
            self._done = True
            if self._pipe is not None:
                return self._pipe.finish()
            if self._file is None:
                head = b"" if self._started or self.fmt == "pcm" else wav_header(self.sample_rate)
                self._started = True
                return head
            self._file.close()
            if self._sink.dropped:
                log.debug("%s stream: %d header bytes could not be updated after sending", self.fmt,
                          self._sink.dropped)
            return self._take()

    def close(self) -> None:
        """Release the encoder without finishing (client gone, error); safe to call twice."""
        with self._lock:
            if self._done:
                return
            self._done = True
            if self._pipe is not None:
                self._pipe.kill()
            if self._file is not None:
                try:
                    self._file.close()
                except Exception as exc:  # the stream is being dropped anyway
                    log.debug("closing an abandoned %s encoder: %s", self.fmt, exc)

    def _take(self) -> bytes:
        data = self._sink.take()
        if self.fmt == "mp3" and self._sink.sent == len(data) and data:  # the first bytes of the stream
            first = data[:self._sink.first_write]
            if _is_placeholder_frame(first):
                data = data[len(first):]
        return data
