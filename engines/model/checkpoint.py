"""Loading a Qwen3-TTS checkpoint folder (official layout) straight to the device.

    root/config.json, generation_config.json, model.safetensors, vocab.json, merges.txt,
         tokenizer_config.json, speech_tokenizer/{config.json, model.safetensors, preprocessor_config.json}

Weights are read with safetensors onto the target device and dtype, into modules built on the meta
device, with strict key checking: a missing or unexpected key is an error naming the file.
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from engines.names import AUTO, DTYPE_SHORT
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from engines.model.config import ModelConfig
from engines.model.errors import CheckpointError

log = logging.getLogger(__name__)


class DType(NamedTuple):
    dtype: torch.dtype
    short: str  # the name engine builds use (TensorRT precision, parity tolerances)


# The one table of dtype names: config, command line and engine builds take their choices from it
# (resolve_dtype also accepts the short names).
DTYPES = {name: DType(getattr(torch, name), short) for name, short in DTYPE_SHORT.items()}




def resolve_dtype(dtype, device=None) -> torch.dtype:
    """A torch dtype from a name of DTYPES (long or short), "auto" (bfloat16 on an accelerator, float32 on
    the CPU; `device` says which) or a torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).lower()
    if name == AUTO:
        return torch.float32 if device is None or str(device).startswith("cpu") else torch.bfloat16
    for long_name, d in DTYPES.items():
        if name in (long_name, d.short):
            return d.dtype
    raise CheckpointError(f"unknown dtype {dtype!r}; use one of {AUTO}, {', '.join(DTYPES)}")


def read_safetensors(path: Path, device, prefix: str = "") -> dict[str, torch.Tensor]:
    """Tensors of `path` whose names start with `prefix` (prefix stripped), loaded onto `device`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"missing checkpoint file: {path}")
    try:
        tensors = load_file(str(path), device=str(device))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"corrupt checkpoint file {path}: {exc}") from exc
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def load_module(build: Callable[[], nn.Module], state: dict[str, torch.Tensor], source: Path,
                device, dtype: torch.dtype, keep_fp32: tuple[str, ...] = ()) -> nn.Module:
    """Build a module on the meta device and fill it from `state` (strict), cast to `dtype`.

    Parameters whose names start with one of `keep_fp32` stay float32.
    """
    with torch.device("meta"):
        module = build()
    expected = set(module.state_dict().keys())
    missing, unexpected = expected - state.keys(), state.keys() - expected
    if missing or unexpected:
        raise CheckpointError(
            f"{source}: weights do not match the model described by its config.json "
            f"(missing: {sorted(missing)[:8]}{'...' if len(missing) > 8 else ''}; "
            f"unexpected: {sorted(unexpected)[:8]}{'...' if len(unexpected) > 8 else ''}). "
            "Is the checkpoint complete and of the Qwen3-TTS 12 Hz family?")
    cast = {k: ((v.float() if k.startswith(keep_fp32) else v.to(dtype)) if v.is_floating_point() else v)
            for k, v in state.items()}
    module.load_state_dict(cast, strict=True, assign=True)
    for name, buf in module.named_buffers():  # non-persistent buffers still on meta: rebuild them
        if buf.is_meta:
            raise CheckpointError(f"internal: buffer {name} was not initialised from {source}")
    return module.to(device).eval()


def weights_hash(path: Path, limit: int = 1 << 20) -> str:
    """Short identity of a weights file: size plus sha256 of its header and first MiB (fast on big files)."""
    path = Path(path)
    h = hashlib.sha256(str(path.stat().st_size).encode())
    with path.open("rb") as f:
        h.update(f.read(limit))
    return h.hexdigest()[:16]


class Qwen3TTSWeights(nn.Module):
    """The modules of `model.safetensors`: `talker` and, for Base checkpoints, `speaker_encoder`."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        from engines.model.talker import Talker

        self.talker = Talker(cfg.talker)
        if cfg.tts_model_type == "base":
            from engines.model.speaker_encoder import SpeakerEncoder

            self.speaker_encoder = SpeakerEncoder(cfg.speaker_encoder)
        else:
            self.speaker_encoder = None


def model_folder(root: str | Path) -> Path:
    """`root` as a Path; CheckpointError saying what to pass when there is no such folder."""
    root = Path(root)
    if not root.is_dir():
        raise CheckpointError(f"model folder not found: {root} (pass the folder of a downloaded "
                              "Qwen3-TTS checkpoint with --model)")
    return root


def load_weights(root: str | Path, device="cpu", dtype="float32") -> tuple[ModelConfig, Qwen3TTSWeights]:
    """Config + weights of `root/model.safetensors` on `device` in `dtype` (speaker encoder kept fp32)."""
    root = model_folder(root)
    cfg = ModelConfig.from_dir(root)
    path = root / "model.safetensors"
    state = read_safetensors(path, device)
    model = load_module(lambda: Qwen3TTSWeights(cfg), state, path, device, resolve_dtype(dtype),
                        keep_fp32=("speaker_encoder.",))
    log.info("loaded %s (%s %s) on %s as %s", root.name, cfg.tts_model_size or "?", cfg.tts_model_type,
             device, dtype)
    return cfg, model
