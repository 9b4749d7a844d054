"""The book file of a FLAC book: encoded again from its chapters' audio (how every format but flac is made)
against spliced from its chapter files' frames (audio.flac_splice, what a FLAC book does).

    python -m benchmarks.book_file [--chapters 100] [--seconds 60] [--noise 0.05] [--reps 3] [--json out.json]

Chapter files are written first (libsndfile FLAC, 16-bit, 24 kHz, as the book writer does); each repetition times
both ways over the same chapters (the encoding from their float32 audio, as a spool holds it), and checks the
two books decode to the same samples. Audio:
bursts of tones over noise of `--noise` (the random-weight model's audio is noise-like: 0.3).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from audio.encode import SoundFileEncoder
from audio.flac_splice import FlacSplice

SR = 24000


def chapter_audio(seconds: float, noise: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(SR * seconds)) / SR
    env = (np.sin(2 * np.pi * 2.7 * t) > -0.3).astype(np.float32)
    return ((0.3 * np.sin(2 * np.pi * (120 + seed % 50) * t) + rng.normal(0, noise, t.size)) * env).astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chapters", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="book-file-"))
    paths = []
    for k in range(a.chapters):
        p = d / f"{k:03d}.flac"
        enc = SoundFileEncoder(p, SR, "flac", {"title": f"Chapter {k}"})
        enc.write(chapter_audio(a.seconds, a.noise, k))
        enc.close()
        paths.append(p)
    audio_s = a.chapters * a.seconds
    rows = []
    for rep in range(a.reps):
        encoded, t0 = 0.0, time.perf_counter()
        enc = SoundFileEncoder(d / "encoded.flac", SR, "flac", {"title": "Book"})
        encoded += time.perf_counter() - t0
        for k in range(a.chapters):  # the chapters' float32 audio, as the spool gives it (made again, not timed)
            audio = chapter_audio(a.seconds, a.noise, k)
            t0 = time.perf_counter()
            enc.write(audio)
            encoded += time.perf_counter() - t0
        t0 = time.perf_counter()
        enc.close()
        encoded += time.perf_counter() - t0
        t0 = time.perf_counter()
        with open(d / "spliced.flac", "wb") as f:
            s = FlacSplice(f, SR, {"title": "Book"})
            for p in paths:
                s.append(p)
            s.close()
        spliced = time.perf_counter() - t0
        rows.append({"encoded_s": round(encoded, 3), "spliced_s": round(spliced, 3),
                     "encoded_x_rt": round(audio_s / encoded), "spliced_x_rt": round(audio_s / spliced),
                     "ratio": round(encoded / spliced, 2)})
        print(f"rep {rep}: encoded {encoded:.2f} s ({audio_s / encoded:,.0f}x real time), spliced {spliced:.2f} s "
              f"({audio_s / spliced:,.0f}x), x{encoded / spliced:.2f}")
    same = np.array_equal(sf.read(d / "encoded.flac", dtype="int16")[0], sf.read(d / "spliced.flac", dtype="int16")[0])
    print(f"{a.chapters} chapters x {a.seconds:g} s; the two books decode to the same samples: {same}")
    if a.json:
        Path(a.json).write_text(json.dumps({"benchmark": "book file: encoded against spliced", "args": vars(a),
                                            "audio_s": audio_s, "same_samples": same, "reps": rows}, indent=1))
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


if __name__ == "__main__":
    main()
