"""Public engine API: load a checkpoint, turn text into 24 kHz audio.

    engine = TTSEngine.load("path/to/Qwen3-TTS-12Hz-0.6B-CustomVoice", device="cpu", dtype="float32")
    [result] = engine.synthesize([SynthesisRequest(text="Hello.", voice="vivian", language="english")])
    result.audio  # float32 numpy array, mono, engine.sample_rate Hz
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings (official names and defaults)."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_dosample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    seed: Optional[int] = None
    min_new_tokens: int = 2
    max_new_tokens: Optional[int] = None  # None: generation_config.json's value

    @staticmethod
    def greedy(**kw) -> "SamplingParams":
        return SamplingParams(do_sample=False, subtalker_dosample=False, **kw)


@dataclass(frozen=True)
class SynthesisRequest:
    """One piece of text to speak.

    voice: a CustomVoice speaker name, a saved cloned voice (a `.voice` file, or a name in the voices
    folder), or None.
    instruct: VoiceDesign description or 1.7B CustomVoice style instruction.
    ref_audio / ref_text: Base voice cloning (ref_text given -> ICL mode, else x-vector only).
    """

    text: str
    voice: Optional[str] = None
    language: str = "auto"
    instruct: Optional[str] = None
    ref_audio: Optional[str] = None
    ref_text: Optional[str] = None
    non_streaming_text: Optional[bool] = None  # None: the official default for the mode
    sampling: SamplingParams = field(default_factory=SamplingParams)


@dataclass
class SynthesisResult:
    audio: np.ndarray  # [samples] float32 in [-1, 1]
    sample_rate: int
    codes: np.ndarray  # [frames, 16] int64
    finished_by_eos: bool


def __getattr__(name):  # `from engines.api import TTSEngine` without an import cycle
    if name == "TTSEngine":
        from engines.engine import TTSEngine

        return TTSEngine
    raise AttributeError(name)
