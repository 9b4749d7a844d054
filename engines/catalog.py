"""What a checkpoint offers, read from its config files alone (no weights): a process that serves an
engine living elsewhere (the daemon's front, `engines.process`) answers from here.

    cat = Catalog.from_dir("path/to/checkpoint", voices_dir="voices")
    cat.voices, cat.languages, cat.model_type, cat.sample_rate, cat.streams_text("me")
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from engines.model.config import CodecConfig, ModelConfig
from engines.model.errors import VoiceNotFound

VOICE_SUFFIX = ".voice"  # a saved cloned voice in the voices folder: NAME.voice


class Catalog:
    """The checkpoint at `root` (`cfg`, `codec_cfg`) and the saved voices in `voices_dir`."""

    def __init__(self, root: Optional[Path], cfg: ModelConfig, codec_cfg: CodecConfig,
                 voices_dir: Optional[Path] = None):
        self.root, self.cfg, self.codec_cfg = root, cfg, codec_cfg
        self.voices_dir = Path(voices_dir) if voices_dir else None
        self._saved_voices: dict = {}  # path -> ((mtime_ns, size), ClonedVoice)

    @classmethod
    def from_dir(cls, root, voices_dir=None) -> "Catalog":
        root = Path(root)
        return cls(root, ModelConfig.from_dir(root), CodecConfig.from_dir(root / "speech_tokenizer"), voices_dir)

    @property
    def sample_rate(self) -> int:
        return self.codec_cfg.output_sample_rate

    @property
    def model_type(self) -> str:
        return self.cfg.tts_model_type

    @property
    def supports_instruct(self) -> bool:
        """VoiceDesign always; CustomVoice only on the larger (1.7B) checkpoints, as the official package."""
        size = self.cfg.tts_model_size
        return self.model_type == "voice_design" or (self.model_type == "custom_voice" and size not in "0b6")

    @property
    def test_model(self) -> str:
        """Why this checkpoint makes no speech ("random weights: ..."), for test checkpoints; else ""."""
        return self.cfg.test_model

    @property
    def languages(self) -> list[str]:
        return self.cfg.talker.languages

    @property
    def voices(self) -> list[str]:
        """CustomVoice speakers, or the saved cloned voices of a Base checkpoint."""
        if self.model_type == "custom_voice":
            return sorted(self.cfg.talker.spk_id)
        if self.model_type == "base" and self.voices_dir and self.voices_dir.is_dir():
            return sorted(p.name[: -len(VOICE_SUFFIX)] for p in self.voices_dir.glob(f"*{VOICE_SUFFIX}"))
        return []

    def voice_file(self, name: str) -> Path:
        """The file of the saved voice `name` in the voices folder (whether it exists or not)."""
        if self.voices_dir is None:
            raise ValueError("no voices folder is set (model.voices_dir)")
        return self.voices_dir / f"{name}{VOICE_SUFFIX}"

    def voice_path(self, name: str) -> Path:
        """Where the voice a request names lives: a file path as given, else NAME.voice in the voices folder."""
        path = Path(name)
        if path.is_file() or self.voices_dir is None:
            return path
        return self.voice_file(name)

    def _load_voice(self, name: str):
        """A saved voice by file path or name in the voices folder; read once per file version."""
        from engines.model.voice import ClonedVoice

        path = self.voice_path(name)
        if not path.is_file():
            raise VoiceNotFound(name, self.voices)
        st = path.stat()
        stamp = (st.st_mtime_ns, st.st_size)
        hit = self._saved_voices.get(str(path))
        if hit is not None and hit[0] == stamp:
            return hit[1]
        voice = ClonedVoice.load(path)
        self._check_voice(voice, str(name))
        self._saved_voices[str(path)] = (stamp, voice)
        return voice

    def _check_voice(self, voice, name: str) -> None:
        voice.check_fits(self.cfg.talker.hidden_size, self.model_type, self.cfg.talker.num_code_groups,
                         self.cfg.tts_model_size, name=name)

    def streams_text(self, voice=None) -> bool:
        """Whether text that is still arriving can be spoken with `voice` (streaming-text mode): every voice
        but one cloned with its reference text (ICL puts the whole text beside the reference codes)."""
        if self.model_type != "base" or not voice:
            return True
        cloned = voice if not isinstance(voice, str) else self._load_voice(voice)
        return bool(cloned.x_vector_only)
