"""A cloned voice: what voice cloning extracts from reference audio, saved to a small reusable file.

`make_cloned_voice` mirrors the official `create_voice_clone_prompt`: the x-vector comes from the
speaker encoder on the 24 kHz reference; in ICL mode (x_vector_only=False, reference text required)
the reference codes [T, 16] from the codec encoder are kept too.

File format: safetensors (no pickle). Tensors `spk_embedding` [H] and, for ICL, `ref_codes` [T, 16];
the safetensors metadata header holds `format`="tts-appliance-voice" and `voice`=JSON of the rest.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from engines.model.audio import AudioSource, load_audio
from engines.model.errors import BadInput, UnsupportedMode

log = logging.getLogger(__name__)

FORMAT = "tts-appliance-voice"
FORMAT_VERSION = 1


def reference_cut(n_ref: int, n_frames: int, n_samples: int) -> int:
    """Samples of reference audio to cut off the decode of a cloned voice's `n_ref` reference frames followed by
    the generated ones (`n_frames` in all, `n_samples` decoded): the official package's proportional cut
    int(ref_len / total_len * len(wav)), the same float operations. With n_samples = n_frames * samples per
    frame that is n_ref * samples per frame, or one sample less where the division rounds down (13 of 23)."""
    return int(n_ref / max(n_frames, 1) * n_samples)


@dataclass
class ClonedVoice:
    spk_embedding: torch.Tensor  # [H] speaker x-vector, fed to the talker as one embedding row
    ref_codes: Optional[torch.Tensor] = None  # [T, 16] int64 reference codes (ICL mode only)
    ref_text: Optional[str] = None  # transcript of the reference audio (ICL mode)
    x_vector_only: bool = False
    model_type: str = "base"  # tts_model_type of the checkpoint that made it
    model_size: str = ""  # tts_model_size, e.g. "0.6b" / "1.7b"
    hidden_size: int = 0  # talker hidden size it was made for (= len(spk_embedding))
    num_code_groups: int = 16
    format_version: int = FORMAT_VERSION
    extra: dict = field(default_factory=dict)  # free-form JSON-able notes (name, source file, ...)

    @property
    def icl_mode(self) -> bool:
        return not self.x_vector_only

    def __post_init__(self):
        if self.spk_embedding.dim() != 1:
            raise BadInput(f"speaker embedding must be 1-D, got shape {tuple(self.spk_embedding.shape)}")
        if not self.hidden_size:
            self.hidden_size = int(self.spk_embedding.shape[0])
        if self.icl_mode and (self.ref_codes is None or not self.ref_text):
            raise BadInput("an ICL voice needs reference codes and reference text; "
                           "give the transcript of the reference audio or use x_vector_only")
        if self.ref_codes is not None and (self.ref_codes.dim() != 2 or self.ref_codes.shape[1] != self.num_code_groups):
            raise BadInput(f"reference codes must be [T, {self.num_code_groups}], got {tuple(self.ref_codes.shape)}")

    def check_fits(self, hidden_size: int, model_type: str = "base", num_code_groups: int = 16,
                   model_size: str | None = None, name: str = "voice") -> None:
        """Raise BadInput/UnsupportedMode when this voice cannot be used with the given model."""
        if model_type != "base":
            raise UnsupportedMode(f"{name}: cloned voices need a Base checkpoint; this one is {model_type!r}")
        if int(self.spk_embedding.shape[0]) != hidden_size or self.hidden_size != hidden_size:
            raise BadInput(f"{name} was made for a model with hidden size {self.hidden_size} "
                           f"(size {self.model_size or '?'}); this model has hidden size {hidden_size}"
                           f"{f' (size {model_size})' if model_size else ''}: re-create the voice with this model")
        if self.ref_codes is not None and num_code_groups != self.num_code_groups:
            raise BadInput(f"{name} has {self.num_code_groups} codebooks per frame; this model uses {num_code_groups}")
        if model_size and self.model_size and model_size.lower() != self.model_size.lower():
            log.warning("%s was made with a %s model and is used with a %s model", name, self.model_size, model_size)

    def _meta(self) -> dict[str, Any]:
        return dict(ref_text=self.ref_text, x_vector_only=self.x_vector_only, model_type=self.model_type,
                    model_size=self.model_size, hidden_size=self.hidden_size,
                    num_code_groups=self.num_code_groups, format_version=self.format_version, extra=self.extra)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the voice atomically to `path` (safetensors); returns the path."""
        from safetensors.torch import save_file

        path = Path(path)
        tensors = {"spk_embedding": self.spk_embedding.detach().cpu().contiguous()}
        if self.ref_codes is not None:
            tensors["ref_codes"] = self.ref_codes.detach().cpu().to(torch.int64).contiguous()
        meta = {"format": FORMAT, "voice": json.dumps(self._meta(), ensure_ascii=False)}
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            save_file(tensors, tmp, metadata=meta)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return path

    @staticmethod
    def load(path: str | os.PathLike) -> "ClonedVoice":
        """Read a voice written by `save`; BadInput (naming the file) when it is missing or not a voice."""
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise BadInput(f"voice file not found: {path}")
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                header = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
            if header.get("format") != FORMAT:
                raise ValueError("not a tts-appliance voice file")
            meta = json.loads(header["voice"])
        except Exception as exc:
            raise BadInput(f"cannot read voice file {path} ({exc}); re-create the voice from its reference audio") from exc
        version = int(meta.get("format_version", 0))
        if version > FORMAT_VERSION:
            raise BadInput(f"voice file {path} has format version {version}; this software reads up to "
                           f"{FORMAT_VERSION}: upgrade it or re-create the voice")
        if "spk_embedding" not in tensors:
            raise BadInput(f"voice file {path} has no speaker embedding; re-create the voice")
        keys = ("ref_text", "x_vector_only", "model_type", "model_size", "hidden_size", "num_code_groups", "extra")
        return ClonedVoice(spk_embedding=tensors["spk_embedding"], ref_codes=tensors.get("ref_codes"),
                           format_version=version, **{k: meta[k] for k in keys if k in meta})


def make_cloned_voice(speaker_encoder, codec_encoder, ref_audio: AudioSource, ref_text: Optional[str] = None,
                      x_vector_only: bool = False, model_config=None) -> ClonedVoice:
    """Build a ClonedVoice from reference audio (path, bytes, file object or (array, sr)).

    speaker_encoder: engines.model.speaker_encoder.SpeakerEncoder; codec_encoder: CodecEncoder (unused and
    may be None when x_vector_only). model_config: the ModelConfig of the checkpoint (type/size/hidden
    size are recorded; a non-Base checkpoint is refused, as the official does).
    """
    if not x_vector_only and not (ref_text and ref_text.strip()):
        raise BadInput("voice cloning with reference codes (ICL) needs ref_text, the transcript of the "
                       "reference audio; give it, or set x_vector_only to clone from the speaker embedding alone")
    model_type, model_size, hidden, groups = "base", "", None, 16
    if model_config is not None:
        model_type, model_size = model_config.tts_model_type, model_config.tts_model_size
        hidden, groups = model_config.talker.hidden_size, model_config.talker.num_code_groups
        if model_type != "base":
            raise UnsupportedMode(f"voice cloning needs a Base checkpoint; this one is {model_type!r}")
    wav = load_audio(ref_audio, target_sr=24000)  # [S] float32 at 24 kHz
    emb = speaker_encoder.extract_speaker_embedding(wav).detach().cpu()  # [enc_dim]
    codes = None
    if not x_vector_only:
        if codec_encoder is None:
            raise BadInput("ICL voice cloning needs the codec encoder (speech_tokenizer) to be loaded")
        codes = codec_encoder.encode_one(torch.from_numpy(wav)).cpu()  # [T, 16]
    voice = ClonedVoice(spk_embedding=emb, ref_codes=codes, ref_text=ref_text, x_vector_only=bool(x_vector_only),
                        model_type=model_type, model_size=model_size, hidden_size=int(emb.shape[0]),
                        num_code_groups=codes.shape[1] if codes is not None else 16)
    if hidden is not None:
        voice.check_fits(hidden, model_type, groups, model_size=model_size)
    log.info("cloned voice: %d-d x-vector, %s", emb.shape[0],
             f"{codes.shape[0]} reference frames" if codes is not None else "x-vector only")
    return voice
