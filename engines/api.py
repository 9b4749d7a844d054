"""Public engine API: the request and result types (importable without loading the engine).

    from engines.engine import TTSEngine   # a loaded checkpoint (the eager reference path)
    engine = TTSEngine.load("path/to/Qwen3-TTS-12Hz-0.6B-CustomVoice", device="cpu", dtype="float32")
    [result] = engine.synthesize([SynthesisRequest(text="Hello.", voice="vivian", language="english")])
    result.audio  # float32 numpy array, mono, engine.sample_rate Hz
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol, runtime_checkable

import numpy as np

from engines.model.sampling import SamplingParams  # noqa: F401 - part of the public API


@dataclass(frozen=True)
class SynthesisRequest:
    """One piece of text to speak.

    voice: a CustomVoice speaker name, a saved cloned voice (a `.voice` file, or a name in the voices
    folder), a `ClonedVoice` already made (engines.model.voice; cloned once, reused per request), or None.
    instruct: VoiceDesign description or 1.7B CustomVoice style instruction.
    ref_audio / ref_text: Base voice cloning (ref_text given -> ICL mode, else x-vector only).
    text_feed: text still arriving (engines.runtime.text_feed.TextFeed; EngineRunner only): the request is
    spoken in streaming-text mode as its words come, `text` is ignored.
    """

    text: str
    voice: Optional[object] = None  # str | ClonedVoice
    language: str = "auto"
    instruct: Optional[str] = None
    ref_audio: Optional[str] = None
    ref_text: Optional[str] = None
    non_streaming_text: Optional[bool] = None  # None: the official default for the mode
    sampling: SamplingParams = field(default_factory=SamplingParams)
    text_feed: Optional[object] = None


@dataclass
class SynthesisResult:
    audio: np.ndarray  # [samples] float32 in [-1, 1]
    sample_rate: int
    codes: np.ndarray  # [frames, 16] int64
    finished_by_eos: bool


@dataclass(frozen=True)
class EngineSpec:
    """Everything one engine needs to load on one device: the daemon's settings decide it once
    (appliance.config), `engines.load.load_runner` loads it, in this process or in an engine process
    of its own (`engines.process`).

    max_slots: a number, or "auto" (what fits in the device's free memory, engines.runtime.memory).
    warmup: a short request spoken once after start-up (None: none), so the first real one pays for nothing.
    """

    model: str
    device: str = "cpu"
    dtype: str = "auto"
    voices_dir: Optional[str] = None
    threads: int = 0  # torch CPU threads (0: torch's choice)
    codec_threads: int = 0  # CPU: threads a codec call's rows are split over, off the loop's (0: the codec runs in the loop's)
    idle_threads: int = 0  # CPU: the loop's torch threads while no codec call runs (0: `threads` always)
    max_slots: object = "auto"  # int | "auto"
    max_queue: int = 16
    max_context: int = 2048
    codec: str = "torch"
    codec_fast: Optional[bool] = None
    codec_windows: Optional[bool] = None  # the batch codec lane's calls over windows of its rows (None: off on the CPU)
    attn_kernel: Optional[bool] = None
    sample_kernel: Optional[bool] = None
    layer_kernel: Optional[bool] = None
    kv_cache: str = "auto"  # the talker's key/value cache: auto, model (the model's dtype) or fp8
    attn_split: Optional[bool] = None  # the talker's decode attention split over programs per row (None: auto)
    linear: str = "auto"  # the decoder layers' weights: auto, model (the model's dtype), fp16 or int8 (CPU; int8 lossy)
    codec_dtype: str = "auto"  # the codec lanes' dtype: auto (bf16 on a CPU with bf16 dot instructions), model, bfloat16
    prefill_graphs: bool = True
    engine_cache: Optional[str] = None
    prepare: bool = True  # capture every device graph before serving
    warmup: Optional[SynthesisRequest] = None


@runtime_checkable
class Engine(Protocol):
    """What the appliance uses of an engine, wherever it runs: `engines.runtime.runner.EngineRunner` in this
    process, `engines.process.proxy.EngineProcess` in a process of its own (the daemon's default). Streams
    submit at priority 0 and batch work above it; a handle (`engines.runtime.stream.StreamHandle`) yields the
    request's float32 PCM chunks as they are made, `cancel()`s it and gives its whole `result()`."""

    device: object
    settings: dict  # what auto became: device, dtype, max_context, max_slots and why

    @property
    def sample_rate(self) -> int: ...

    @property
    def model_id(self) -> str: ...

    @property
    def max_slots(self) -> int: ...

    @property
    def running(self) -> bool: ...  # serving requests now

    @property
    def alive(self) -> bool: ...  # serving, and its loop makes progress

    def submit(self, request: SynthesisRequest, priority: int = 0): ...  # -> StreamHandle; EngineBusy when full

    def synthesize(self, requests: list, priority: int = 1) -> list: ...  # whole results, waits for room

    def clone_voice(self, ref_audio, ref_text: Optional[str] = None): ...  # -> ClonedVoice (Base checkpoints)

    def stats(self, fresh: bool = True) -> dict: ...  # active_slots, queued, steps, frames, loop timings, ...

    def stop(self, timeout: Optional[float] = None) -> None: ...
