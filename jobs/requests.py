"""What a claimed segment asks of the engine: what its job shares (`JobContext`, worked out once per job),
its own voice, its audio key (the same key is the same audio: synthesized once, cached) and its
SynthesisRequest.

The worker (jobs.worker) calls these on the segment rows it claims; a row keeps what was worked out for it
under `_job` (its JobContext), `_voice` (`segment_voice`) and `_seed` (set by `synthesis_request`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from jobs.guard import attempt_seed
from jobs.settings import JobSpec, file_digest, segment_key


@dataclass
class JobContext:
    """What every segment of one job shares, worked out once per job by the worker."""

    spec: JobSpec
    ref_digest: Optional[str] = None  # sha256 of the reference audio (part of each segment's audio key)
    voice: Any = None  # the voice cloned from the reference audio
    error: Optional[Exception] = None  # the job cannot be synthesized (e.g. unusable reference audio)


def job_context(row: dict, clone: Optional[Callable] = None) -> JobContext:
    """The job of a claimed segment row: spec parsed, reference audio hashed and its voice cloned with
    `clone(ref_audio, ref_text)` (the engine's `clone_voice`; None: the engine cannot clone)."""
    spec = JobSpec.from_dict(json.loads(row["spec"]))
    ctx = JobContext(spec, ref_digest=file_digest(spec.ref_audio))
    if spec.ref_audio and clone is not None:
        try:
            ctx.voice = clone(spec.ref_audio, spec.ref_text)
        except Exception as exc:  # unreadable / unusable reference audio: the whole job fails
            ctx.error = exc
    return ctx


def segment_voice(row: dict) -> Optional[str]:
    """The voice a segment row names for itself (inline tag or chapter voice), else None: the job's."""
    meta = row.get("metadata")
    return (json.loads(meta) if isinstance(meta, str) else meta or {}).get("voice")


def audio_key(row: dict, model_id: str) -> str:
    """The audio key of a segment row (its `_job` and `_voice` worked out) on the checkpoint `model_id`."""
    ctx, voice = row["_job"], row["_voice"]
    if voice:  # a [voice=...] tag or the chapter's voice: this segment's own speaker, nothing cloned
        return segment_key(row["text"], replace(ctx.spec, voice=voice, ref_audio=None, ref_text=None),
                           row["seed"], model_id)
    return segment_key(row["text"], ctx.spec, row["seed"], model_id, ctx.ref_digest)


def synthesis_request(row: dict):
    """The SynthesisRequest of a segment row (its `_job` and `_voice` worked out), with the seed of its
    attempt (jobs.guard.attempt_seed, kept in `row["_seed"]`)."""
    from engines.api import SamplingParams, SynthesisRequest

    ctx: JobContext = row["_job"]
    spec = ctx.spec
    row["_seed"] = attempt_seed(row["seed"], row["guard_failures"])
    sampling = SamplingParams(**{**spec.sampling, "seed": row["_seed"]})
    voice = row["_voice"]  # the segment's own voice, read from its metadata (segment_voice)
    if voice:
        return SynthesisRequest(text=row["text"], voice=voice, language=spec.language, instruct=spec.instruct,
                                sampling=sampling)
    if ctx.voice is not None:  # cloned once for the job
        return SynthesisRequest(text=row["text"], voice=ctx.voice, language=spec.language,
                                instruct=spec.instruct, sampling=sampling)
    return SynthesisRequest(text=row["text"], voice=spec.voice, language=spec.language, instruct=spec.instruct,
                            ref_audio=spec.ref_audio, ref_text=spec.ref_text, sampling=sampling)
