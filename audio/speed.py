"""Speaking speed: audio time-stretched with its pitch kept.

`speed` 0.25-4.0 (1.0: as the model speaks; the range of OpenAI's and vllm-omni's speech APIs) is a setting
of the speech API (streamed through `StreamStretcher`), the WebSockets and jobs (each segment is stretched
when its chapter is assembled, so the cached segment audio stays at the model's pace and subtitles follow
the stretched audio). The stretching is Rubber Band's, from the `pedalboard` wheel (no system library
needed). Within 0.5-2.0 it sounds natural; beyond it the artefacts of any time-stretch grow (slower than
0.5: smeared, echoing consonants; faster than 2.0: clipped syllables), so QUALITY_MIN..QUALITY_MAX is the
range to recommend.
"""
from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)
SPEED_MIN, SPEED_MAX = 0.25, 4.0
QUALITY_MIN, QUALITY_MAX = 0.5, 2.0  # beyond these the stretched speech audibly suffers (module doc)


def check_speed(speed) -> float:
    """`speed` as a float within SPEED_MIN..SPEED_MAX (None: 1.0); else ValueError saying the range."""
    if speed is None:
        return 1.0
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not SPEED_MIN <= speed <= SPEED_MAX:
        raise ValueError(f"speed must be a number from {SPEED_MIN} to {SPEED_MAX} (1.0: the model's own pace), "
                         f"got {speed!r}")
    return float(speed)


def stretch(audio: np.ndarray, sample_rate: int, speed: float) -> np.ndarray:
    """`audio` played `speed` times as fast, pitch kept (Rubber Band through pedalboard); 1.0: unchanged."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if speed == 1.0 or audio.size == 0:
        return audio
    from pedalboard import time_stretch

    out = time_stretch(audio[None, :], float(sample_rate), stretch_factor=float(speed))  # [1, N / speed]
    return np.ascontiguousarray(out[0], dtype=np.float32)


class StreamStretcher:
    """`stretch` for audio that arrives in chunks: `push(chunk)` returns the stretched audio ready now,
    `finish()` the rest.

    Input is stretched in blocks of BLOCK_S seconds that overlap by OVERLAP_S; the overlapping output
    is cross-faded, so block edges do not click. The first output comes once a block is in (or at
    `finish`), so a stream starts up to BLOCK_S of input later than at speed 1."""

    BLOCK_S = 0.4
    OVERLAP_S = 0.05

    def __init__(self, sample_rate: int, speed: float):
        self.sample_rate, self.speed = sample_rate, check_speed(speed)
        self.block = int(self.BLOCK_S * sample_rate)
        self.overlap = int(self.OVERLAP_S * sample_rate)
        self._buf = np.zeros(0, np.float32)  # input not yet stretched (starts with the overlap)
        self._tail = np.zeros(0, np.float32)  # stretched overlap of the previous block, to cross-fade

    def _emit(self, out: np.ndarray, last: bool) -> np.ndarray:
        n = min(self._tail.size, out.size)
        if n:
            fade = np.linspace(0.0, 1.0, n, dtype=np.float32)
            out = out.copy()
            out[:n] = self._tail[:n] * (1 - fade) + out[:n] * fade
        if last:
            self._tail = np.zeros(0, np.float32)
            return out
        keep = min(int(round(self.overlap / self.speed)), out.size)
        self._tail = out[out.size - keep:]
        return out[:out.size - keep]

    def push(self, chunk) -> np.ndarray:
        self._buf = np.concatenate([self._buf, np.asarray(chunk, np.float32).reshape(-1)])
        if self.speed == 1.0:
            out, self._buf = self._buf, np.zeros(0, np.float32)
            return out
        parts = []
        while self._buf.size >= self.block + self.overlap:
            parts.append(self._emit(stretch(self._buf[:self.block + self.overlap], self.sample_rate, self.speed),
                                    last=False))
            self._buf = self._buf[self.block:]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def finish(self) -> np.ndarray:
        rest = stretch(self._buf, self.sample_rate, self.speed) if self._buf.size else np.zeros(0, np.float32)
        self._buf = np.zeros(0, np.float32)
        if not rest.size:
            out, self._tail = self._tail, np.zeros(0, np.float32)
            return out
        return self._emit(rest, last=True)
