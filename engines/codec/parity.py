"""Checks shared by the engine build and the benchmarks: streaming parity and decode speed.

`make(batch)` is any factory returning a codec backend (engines.codec.backend) for `batch` streams;
`decoder` is the fp32 torch CodecDecoder the backend was built from (the reference).
"""
from __future__ import annotations

import logging
import math
import time
from typing import Callable

import torch

log = logging.getLogger(__name__)
SAMPLE_RATE = 24000


def snr_db(ref, got) -> float:
    """How far `got` is from `ref` (arrays of audio): the signal-to-error ratio in dB."""
    err = float(((got - ref) ** 2).sum())
    return float(10 * math.log10(float((ref ** 2).sum()) / max(err, 1e-30)))


def random_codes(decoder, batch: int, frames: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, decoder.config.codebook_size, (batch, decoder.config.num_quantizers, frames), generator=g)


def stream_parity(make: Callable, decoder, schedule=(1, 3, 8, 2), batch: int = 2, seed: int = 0) -> float:
    """Max abs difference between the backend streaming `schedule` and the one-shot torch decode."""
    codes = random_codes(decoder, batch, sum(schedule), seed)
    p = next(decoder.parameters())
    with torch.inference_mode():
        ref = decoder(codes.to(p.device)).float().cpu()
    backend, outs, i = make(batch), [], 0
    for n in schedule:
        outs.append(backend.push(codes[..., i:i + n]).float().cpu())
        i += n
    err = float((torch.cat(outs, dim=-1) - ref).abs().max())
    log.info("%s parity over chunks %s: max abs %.3g", getattr(backend, "name", "?"), list(schedule), err)
    return err


# (rows pushed, frames) per step, and which rows get fewer valid frames: prefix pushes of fewer rows
# than the backend holds, one-row and one-frame pushes (the compiled step pads those), idle rows
RAGGED = ((3, 1), (3, 4), (1, 1), (2, 3), (3, 8), (1, 5), (3, 2), (2, 16))


def ragged_parity(make_ref: Callable, make_test: Callable, decoder, schedule=RAGGED, batch: int = 3,
                  seed: int = 0) -> float:
    """Max abs difference between two backends fed the same ragged streaming schedule.

    Every step pushes the first b rows with n frames and per-row valid counts in [0, n] (some rows
    idle); a row is reset midway and another moved onto a free row, as the runtime does. Only the
    valid samples are compared. Use it for backends of the same device and dtype (the compiled vs
    the eager torch codec), where one-shot decodes would differ by kernel choice, not by bug.
    """
    g = torch.Generator().manual_seed(seed)
    ref, test = make_ref(batch), make_test(batch)
    spf, err = decoder.samples_per_frame, 0.0
    for step, (b, n) in enumerate(schedule):
        codes = torch.randint(0, decoder.config.codebook_size, (b, decoder.config.num_quantizers, n), generator=g)
        nv = torch.randint(0, n + 1, (b,), generator=g)
        nv[0] = n
        a, t = ref.push(codes, nv).float().cpu(), test.push(codes, nv).float().cpu()
        for r in range(b):
            m = int(nv[r]) * spf
            if m:
                err = max(err, float((a[r, :, :m] - t[r, :, :m]).abs().max()))
        if step == len(schedule) // 2:
            rows = torch.zeros(batch, dtype=torch.bool)
            rows[min(1, batch - 1)] = True
            for c in (ref, test):
                c.reset(rows)
                c.move(0, batch - 1)
    if ref.frames_decoded.tolist() != test.frames_decoded.tolist():
        raise AssertionError(f"frame counters differ: {ref.frames_decoded.tolist()} vs {test.frames_decoded.tolist()}")
    log.info("%s vs %s over a ragged schedule: max abs %.3g", getattr(test, "name", "?"),
             getattr(ref, "name", "?"), err)
    return err


def _sync(backend) -> None:
    dev = getattr(backend, "device", None)
    if dev is not None and torch.device(dev).type == "cuda":
        torch.cuda.synchronize(dev)


def speed(make: Callable, decoder, chunk: int = 4, batch: int = 1, seconds: float = 1.0,
          min_reps: int = 3) -> dict:
    """Streaming decode speed: pushes of `chunk` frames on `batch` rows, timed for ~`seconds`.

    Reports audio-seconds per second from the median push time (robust to other load on a shared
    machine) and from the fastest push. GPU backends are synchronised around every push.
    """
    backend = make(batch)
    codes = random_codes(decoder, batch, chunk, seed=1)
    backend.push(codes)  # warm-up (allocations, lazy init, compilation)
    _sync(backend)
    times, t_end = [], time.perf_counter() + seconds
    while len(times) < min_reps or time.perf_counter() < t_end:
        t = time.perf_counter()
        backend.push(codes)
        _sync(backend)
        times.append(time.perf_counter() - t)
    times.sort()
    med, best = times[len(times) // 2], times[0]
    audio = batch * chunk * decoder.samples_per_frame / SAMPLE_RATE
    res = {"audio_s_per_s": round(audio / med, 3), "audio_s_per_s_best": round(audio / best, 3),
           "ms_per_push": round(1e3 * med, 2), "pushes": len(times), "chunk_frames": chunk, "batch": batch,
           "threads": torch.get_num_threads()}
    log.info("%s speed: %s", getattr(backend, "name", "?"), res)
    return res
