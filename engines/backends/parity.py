"""Checks shared by the engine build and the benchmarks: streaming parity and decode speed.

`make(batch)` is any factory returning a codec backend (engines.backends.base) for `batch` streams;
`decoder` is the fp32 torch CodecDecoder the backend was built from (the reference).
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import torch

log = logging.getLogger(__name__)
SAMPLE_RATE = 24000


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


def speed(make: Callable, decoder, chunk: int = 4, batch: int = 1, seconds: float = 1.0,
          min_reps: int = 3) -> dict:
    """Streaming decode speed: pushes of `chunk` frames on `batch` rows, timed for ~`seconds`.

    Reports audio-seconds per second from the median push time (robust to other load on a shared
    machine) and from the fastest push.
    """
    backend = make(batch)
    codes = random_codes(decoder, batch, chunk, seed=1)
    backend.push(codes)  # warm-up (allocations, lazy init)
    times, t_end = [], time.perf_counter() + seconds
    while len(times) < min_reps or time.perf_counter() < t_end:
        t = time.perf_counter()
        backend.push(codes)
        times.append(time.perf_counter() - t)
    times.sort()
    med, best = times[len(times) // 2], times[0]
    audio = batch * chunk * decoder.samples_per_frame / SAMPLE_RATE
    res = {"audio_s_per_s": round(audio / med, 3), "audio_s_per_s_best": round(audio / best, 3),
           "ms_per_push": round(1e3 * med, 2), "pushes": len(times), "chunk_frames": chunk, "batch": batch,
           "threads": torch.get_num_threads()}
    log.info("%s speed: %s", getattr(backend, "name", "?"), res)
    return res
