"""TTSEngine: a loaded checkpoint that turns SynthesisRequests into audio (the eager reference path)."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from engines.api import SynthesisRequest, SynthesisResult
from engines.model.sampling import SamplingParams
from engines.model.checkpoint import load_weights, resolve_dtype, weights_hash
from engines.model.config import CodecConfig
from engines.catalog import VOICE_SUFFIX, Catalog  # noqa: F401 - VOICE_SUFFIX re-exported
from engines.model.errors import BadInput, LanguageNotSupported, UnsupportedMode, VoiceNotFound
from engines.model.generate import generate
from engines.model.prompt import PromptBuilder, PromptSpec
from engines.model.text import expected_seconds
from engines.model.tokenizer import TextTokenizer
from engines.model.voice import reference_cut

log = logging.getLogger(__name__)

FRAMES_PER_S = 12.5


def runaway_frames(text: str, floor_s: float = 10.0, factor: float = 4.0) -> int:
    """Frame limit for `text`: `factor` x its expected duration (engines.model.text), at least `floor_s`
    seconds, + 1 for the official max_new_tokens convention."""
    return int(FRAMES_PER_S * max(floor_s, factor * expected_seconds(text))) + 1


class TTSEngine(Catalog):
    """A Qwen3-TTS checkpoint on one device: what it offers (`Catalog`: `sample_rate`, `model_type`,
    `voices`, `languages`) and `model_id` (folder name + weights hash: what cached audio is keyed by).
    """

    def __init__(self, root: Optional[Path], cfg, weights, tokenizer, codec_cfg, decoder, defaults,
                 device, dtype: torch.dtype, voices_dir: Optional[Path] = None, model_id: str = ""):
        super().__init__(root, cfg, codec_cfg, voices_dir)
        self.device, self.dtype = torch.device(device), dtype
        self.weights, self.talker = weights, weights.talker
        self.tokenizer, self.decoder, self.defaults = tokenizer, decoder, defaults
        self._encoder = None
        self.prompts = PromptBuilder(self.cfg, self.tokenizer, self.talker)
        self.model_id = model_id

    @classmethod
    def load(cls, model_path, device: str = "cpu", dtype="float32", voices_dir=None) -> "TTSEngine":
        """Load a checkpoint folder in the official layout onto `device` in `dtype`."""
        from engines.codec.decoder import load_codec_decoder

        root, dev = Path(model_path), torch.device(device)
        dt = resolve_dtype(dtype, dev)
        cfg, weights = load_weights(root, dev, dt)
        if cfg.test_model:
            log.warning("test model: %s (%s); pass a real checkpoint (--model, model.path) for speech",
                        cfg.test_model, root)
        model_id = f"{root.name}:{weights_hash(root / 'model.safetensors')}:{str(dt).split('.')[-1]}"
        return cls(root, cfg, weights, TextTokenizer.from_dir(root), CodecConfig.from_dir(root / "speech_tokenizer"),
                   load_codec_decoder(root / "speech_tokenizer", dev, dt), SamplingParams.from_generation_config(root),
                   dev, dt, Path(voices_dir) if voices_dir else None, model_id)

    # ----- voice cloning ---------------------------------------------------------------------
    def _codec_encoder(self):
        if self._encoder is None:
            from engines.codec.encoder import load_codec_encoder

            self._encoder = load_codec_encoder(self.root / "speech_tokenizer", self.device, torch.float32)
        return self._encoder

    def make_voice(self, ref_audio, ref_text: Optional[str] = None, x_vector_only: bool = False):
        """Clone a voice from reference audio (Base checkpoints). Returns a ClonedVoice (save() it to reuse)."""
        from engines.model.voice import make_cloned_voice

        if self.model_type != "base":
            raise UnsupportedMode(f"reference audio needs a Base checkpoint; this one is {self.model_type}")
        if not x_vector_only and not (ref_text and ref_text.strip()):
            x_vector_only = True  # no transcript: clone from the speaker embedding alone
        return make_cloned_voice(self.weights.speaker_encoder, None if x_vector_only else self._codec_encoder(),
                                 ref_audio, ref_text=ref_text, x_vector_only=x_vector_only, model_config=self.cfg)

    # ----- request resolution ----------------------------------------------------------------
    def _language_id(self, language: Optional[str]) -> Optional[int]:
        lang = (language or "auto").strip().lower()
        if lang not in self.languages:
            raise LanguageNotSupported(language, self.languages)
        return None if lang == "auto" else self.cfg.talker.codec_language_id[lang]

    def resolve(self, req: SynthesisRequest) -> tuple[PromptSpec, Optional[torch.Tensor]]:
        """Validate a request against this checkpoint -> (prompt spec, reference codes to prepend or None)."""
        if not req.text or not req.text.strip():
            raise BadInput("text is empty: give some text to speak")
        lang_id, tc, mt = self._language_id(req.language), self.cfg.talker, self.model_type
        if req.instruct and not self.supports_instruct:
            raise UnsupportedMode(f"this {self.cfg.tts_model_size or ''} {mt} checkpoint does not take "
                                  "instructions; use a 1.7B CustomVoice or a VoiceDesign checkpoint")
        if req.ref_audio and mt != "base":
            raise UnsupportedMode(f"reference audio needs a Base checkpoint; this one is {mt}")
        spec = PromptSpec(text=req.text, language_id=lang_id, instruct=req.instruct or None,
                          non_streaming=req.non_streaming_text if req.non_streaming_text is not None
                          else mt != "base")
        if mt == "custom_voice":
            if not req.voice:
                raise VoiceNotFound("(none given)", self.voices)
            name = req.voice.strip().lower()
            if name not in tc.spk_id:
                raise VoiceNotFound(req.voice, self.voices)
            spec.speaker_id = tc.spk_id[name]
            dialect = tc.spk_is_dialect.get(name, False)
            if dialect and (req.language or "auto").lower() in ("chinese", "auto"):
                spec.language_id = tc.codec_language_id[dialect]
        elif mt == "voice_design":
            if req.voice:
                raise UnsupportedMode("VoiceDesign checkpoints have no named voices: describe the voice "
                                      "with an instruction instead")
            if not req.instruct:
                log.warning("VoiceDesign without an instruction: the model picks an arbitrary voice")
        else:
            if req.ref_audio:
                voice = self.make_voice(req.ref_audio, req.ref_text)
            elif req.voice is not None and not isinstance(req.voice, str):  # a ClonedVoice made earlier
                voice = req.voice
                self._check_voice(voice, "the given voice")
            elif req.voice:
                voice = self._load_voice(req.voice)
            else:
                raise BadInput("a Base checkpoint clones a voice: give reference audio (--ref-audio, with "
                               "--ref-text for best results) or a saved voice")
            spec.speaker_embedding = voice.spk_embedding
            if not voice.x_vector_only:
                spec.ref_text, spec.ref_codes = voice.ref_text, voice.ref_codes
        return spec, spec.ref_codes

    def sampling(self, sp: SamplingParams, text: Optional[str] = "") -> SamplingParams:
        """Every setting of one request resolved: the request's, else the checkpoint's (generation_config.json);
        a random seed when none is given; without an explicit max_new_tokens the frame limit is the
        runaway guard for `text` (enforced on the device even if EOS never comes), or the checkpoint's
        limit when the text is not known yet (None: text still arriving)."""
        r = sp.over(self.defaults)
        seed = sp.seed if sp.seed is not None else int.from_bytes(os.urandom(4), "little")
        limit = sp.max_new_tokens or (self.defaults.max_new_tokens if text is None
                                      else min(self.defaults.max_new_tokens, runaway_frames(text)))
        return SamplingParams(**{**r.to_dict(), "seed": seed, "max_new_tokens": limit})

    # ----- synthesis ---------------------------------------------------------------------------
    @torch.no_grad()
    def generate_codes(self, requests: list[SynthesisRequest], fp8: bool = False):
        """Codes only: list of (Generated, reference codes or None); `fp8`: the talker's key/value cache as
        float8 with scales (the runtime's `kv_cache="fp8"`)."""
        resolved = [self.resolve(r) for r in requests]
        prompts = [self.prompts.build(spec) for spec, _ in resolved]
        outs = generate(self.talker, prompts, [self.sampling(r.sampling, r.text) for r in requests], fp8)
        return [(o, ref) for o, (_, ref) in zip(outs, resolved)]

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, ref_codes: Optional[torch.Tensor] = None) -> np.ndarray:
        """Frames `[F, 16]` -> float32 audio; reference codes are prepended for context, then cut off."""
        full = codes if ref_codes is None else torch.cat([ref_codes.cpu(), codes], dim=0)
        if full.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        wav = self.decoder(full.T[None].to(self.device))[0, 0].float().cpu().numpy()
        if ref_codes is not None:
            wav = wav[reference_cut(ref_codes.shape[0], full.shape[0], wav.shape[0]):]
        return wav.astype(np.float32)

    def synthesize(self, requests: list[SynthesisRequest]) -> list[SynthesisResult]:
        """Text -> audio for a batch of requests (sampling settings and seeds per request)."""
        results = []
        for gen, ref in self.generate_codes(requests):
            results.append(SynthesisResult(audio=self.decode(gen.codes, ref), sample_rate=self.sample_rate,
                                           codes=gen.codes.numpy(), finished_by_eos=gen.finished_by_eos))
        return results
