"""Write an engine's weights as a checkpoint folder in the official Qwen3-TTS layout.

Used to hand the random real-shape weights of `benchmarks.dummy_engine.dummy_engine` to the official
`qwen-tts` package (benchmarks/official_baseline.py), so both run the very same numbers:

    python -m benchmarks.dummy_checkpoint --dummy 0.6b --seed 0 --device cuda --out /tmp/dummy-0.6b

Folder written (what `Qwen3TTSModel.from_pretrained` and our `TTSEngine.load` read):
    config.json, generation_config.json, model.safetensors (talker.*; names are the official ones),
    vocab.json, merges.txt, tokenizer_config.json (copied from the engine's tokenizer folder),
    speech_tokenizer/{config.json, model.safetensors, preprocessor_config.json}.

The codec's `decoder.*` tensors are the engine's, written in float32 as the released speech_tokenizer has them
(readers of the official layout, the pure-C peer of benchmarks/peer_cpu.py among them, take them as float32;
`--codec-dtype model` writes the engine's dtype instead). The codec encoder (`encoder.*`, a Mimi encoder used
only to encode reference audio for voice cloning, never by CustomVoice generation or decoding) is not
part of the engine: the tiny test codec's encoder and its config are copied in as a placeholder, so
the folder loads strictly. Only no-dependency libraries are used (torch, safetensors): no qwen-tts.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engines.model.config import TEST_MODEL_KEY, CodecConfig, ModelConfig
from engines.model.sampling import OFFICIAL_DEFAULTS

REPO = Path(__file__).resolve().parents[1]
TINY_CODEC = REPO / "tests" / "data" / "tiny" / "codec"  # placeholder encoder weights + config
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")


def _plain(value):
    """Dataclass field value -> JSON value (tuples to lists, mappings to dicts)."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict) or hasattr(value, "items"):
        return {k: _plain(v) for k, v in dict(value).items()}
    return value


def _fields(obj, skip=()) -> dict:
    return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.name not in skip}


def mrope_section(head_dim: int) -> list[int]:
    """Interleaved multimodal-RoPE split of head_dim/2 frequencies into (t, h, w) streams.

    [24, 20, 20] for head_dim 128 (the real checkpoints), [4, 2, 2] for 16 (the tiny ones). All three
    position streams carry the same value in the official generate, so the split does not change results.
    """
    half = head_dim // 2
    side = half * 5 // 16
    return [half - 2 * side, side, side]


def model_config_json(cfg: ModelConfig, dtype: torch.dtype) -> dict:
    """Root config.json (model_type qwen3_tts) for `cfg`, every field the official classes need spelled out
    (the official defaults differ from the real checkpoints: 32 code groups, control ids 4196+, ...)."""
    t = cfg.talker
    talker = _fields(t, skip=("code_predictor",))
    talker.update(
        model_type="qwen3_tts_talker",
        code_predictor_config=dict(_fields(t.code_predictor), model_type="qwen3_tts_talker_code_predictor"),
        rope_scaling={"interleaved": True, "mrope_section": mrope_section(t.head_dim), "rope_type": "default"},
    )
    root = _fields(cfg, skip=("talker", "speaker_encoder", "test_model"))
    if cfg.test_model:  # a test checkpoint stays labelled as one (engines.model.config.TEST_MODEL_KEY)
        root[TEST_MODEL_KEY] = cfg.test_model
    root.update(
        architectures=["Qwen3TTSForConditionalGeneration"],
        model_type="qwen3_tts",
        dtype=str(dtype).split(".")[-1],
        talker_config=talker,
        speaker_encoder_config=_fields(cfg.speaker_encoder),  # no "model_type" key: the package's reload bug
    )
    return root


def codec_config_json(codec_cfg: CodecConfig, encoder_config: dict, dtype: torch.dtype) -> dict:
    """speech_tokenizer/config.json: the engine's decoder settings and `encoder_config`."""
    root = _fields(codec_cfg, skip=("decoder", "encoder"))
    root.update(
        architectures=["Qwen3TTSTokenizerV2Model"],
        model_type="qwen3_tts_tokenizer_12hz",
        dtype=str(dtype).split(".")[-1],
        encoder_config=encoder_config,
        decoder_config=_fields(codec_cfg.decoder),
    )
    return root


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _host(state: dict[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    return {prefix + k: v.detach().to("cpu").contiguous() for k, v in state.items()}


def write_checkpoint(engine, out: str | Path, tokenizer_dir: str | Path,
                     encoder_source: str | Path = TINY_CODEC, codec_dtype: torch.dtype | None = None) -> Path:
    """Write `engine` (a TTSEngine: cfg, weights, decoder, codec_cfg, defaults, dtype) to folder `out`.

    `tokenizer_dir` holds the text tokenizer files the engine was built with. `encoder_source` is a
    speech_tokenizer folder whose `encoder.*` tensors and encoder_config are copied (placeholder).
    Tensors are written in their current dtype, so a bf16 engine gives a bf16 checkpoint bit for bit;
    `codec_dtype`: the codec decoder's tensors in that dtype instead (the released codec is float32).
    """
    out, tokenizer_dir, encoder_source = Path(out), Path(tokenizer_dir), Path(encoder_source)
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", model_config_json(engine.cfg, engine.dtype))
    _write_json(out / "generation_config.json", (engine.defaults or OFFICIAL_DEFAULTS).to_dict())
    save_file(_host(engine.weights.state_dict()), str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, out / name)

    write_codec(engine.decoder, engine.codec_cfg, out / "speech_tokenizer", encoder_source, codec_dtype or engine.dtype)
    return out


def write_codec(decoder, codec_cfg: CodecConfig, st: str | Path, encoder_source: str | Path = TINY_CODEC,
                dtype: torch.dtype = torch.float32) -> Path:
    """A speech_tokenizer folder `st` in the official layout: `decoder`'s tensors (as `decoder.*`, in `dtype`) and
    `codec_cfg`'s decoder settings, with the encoder of `encoder_source` as a placeholder (see the module)."""
    st, encoder_source = Path(st), Path(encoder_source)
    st.mkdir(parents=True, exist_ok=True)
    enc_cfg = json.loads((encoder_source / "config.json").read_text(encoding="utf-8"))["encoder_config"]
    _write_json(st / "config.json", codec_config_json(codec_cfg, enc_cfg, dtype))
    shutil.copyfile(encoder_source / "preprocessor_config.json", st / "preprocessor_config.json")
    tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in _host(decoder.state_dict(), "decoder.").items()}
    with safe_open(str(encoder_source / "model.safetensors"), framework="pt") as f:
        for k in f.keys():
            if k.startswith("encoder."):
                tensors[k] = f.get_tensor(k).contiguous()
    save_file(tensors, str(st / "model.safetensors"), metadata={"format": "pt"})
    return st


def write_dummy_checkpoint(shape: str, out: str | Path, device="cpu", dtype="bfloat16", seed: int = 0,
                           codec_dtype: str | None = "float32"):
    """Build `dummy_engine(shape, device, dtype, seed)` (the benchmark's weights) and write it to `out` (the codec
    in `codec_dtype`, float32 as released; None: the engine's dtype).

    Returns (folder, engine). The random fill runs on `device`: CPU and CUDA generators give different
    numbers, so use the device the engine benchmark runs on to get its exact weights.
    """
    from benchmarks.dummy_engine import TOKENIZER_DIR, dummy_engine

    engine = dummy_engine(shape, device, dtype, seed)
    from engines.model.checkpoint import resolve_dtype

    cdt = None if codec_dtype in (None, "model") else resolve_dtype(codec_dtype)
    return write_checkpoint(engine, out, TOKENIZER_DIR, codec_dtype=cdt), engine


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dummy", choices=["0.6b", "1.7b"], required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="where the random fill runs (cuda = the benchmark's weights)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--codec-dtype", default="float32",
                    help="the codec decoder's tensors (float32 as released; 'model': --dtype)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    write_dummy_checkpoint(args.dummy, args.out, args.device, args.dtype, args.seed, args.codec_dtype)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
