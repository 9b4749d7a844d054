"""The engine cache folder of a checkpoint and its manifest: where the built codec engines live, what
`manifest.json` records, and whether they still fit this model and machine.

engines.codec.build writes the manifest (`build_engines`) and loads what it names (`load_built_codec`);
`tts-appliance info` reads it (appliance.info).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

FORMAT = 1
MANIFEST = "manifest.json"
CACHE_ENV = "TTS_APPLIANCE_ENGINE_CACHE"
INDUCTOR_DIR = "inductor"
COMPILED = "torch-compiled"


def codec_dir(path: str | Path) -> Path:
    """The speech_tokenizer folder of a checkpoint folder (or the folder itself if it is one)."""
    path = Path(path)
    return path / "speech_tokenizer" if (path / "speech_tokenizer").is_dir() else path


def default_cache_dir(model_dir: str | Path, root: str | Path | None = None) -> Path:
    """The engine cache folder of a checkpoint: a folder named after it in `root` (runtime.engine_cache), else in
    $TTS_APPLIANCE_ENGINE_CACHE, else in ~/.cache/tts-appliance/engines ($XDG_CACHE_HOME)."""
    root = root or os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") \
        / "tts-appliance" / "engines"
    return Path(root).expanduser() / Path(model_dir).resolve().name


def model_identity(model_dir: str | Path) -> dict:
    from engines.model.checkpoint import weights_hash

    tok = codec_dir(model_dir)
    cfg = hashlib.sha256((tok / "config.json").read_bytes()).hexdigest()[:16]
    return {"codec_weights": weights_hash(tok / "model.safetensors"), "codec_config": cfg}


def read_manifest(cache_dir: str | Path) -> dict | None:
    path = Path(cache_dir) / MANIFEST
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def stale_reasons(manifest: dict | None, plat: dict, ident: dict) -> list[str]:
    """Why the built engines no longer fit this model and machine (empty list: they fit)."""
    if manifest is None:
        return ["no engines built yet"]
    if manifest.get("format") != FORMAT:
        return [f"manifest format {manifest.get('format')} (this code writes {FORMAT})"]
    old, why = manifest.get("platform", {}), []
    if manifest.get("model") != ident:
        why.append(f"new model (codec weights {manifest.get('model', {}).get('codec_weights')} -> "
                   f"{ident['codec_weights']})")
    if old.get("device") != plat["device"]:
        why.append(f"different device ({old.get('device')} -> {plat['device']})")
    elif (old.get("device_name"), old.get("capability")) != (plat["device_name"], plat["capability"]):
        what = "GPU" if plat["device"] == "cuda" else plat["device"].upper()
        why.append(f"different {what} ({old.get('device_name')} -> {plat['device_name']})")
    if plat["device"] == "cuda" and old.get("driver") != plat["driver"]:
        why.append(f"new driver ({old.get('driver')} -> {plat['driver']})")
    if any(e["backend"] == "tensorrt" for e in manifest.get("engines", [])) and plat["tensorrt"] \
            and old.get("tensorrt") != plat["tensorrt"]:
        why.append(f"new TensorRT ({old.get('tensorrt')} -> {plat['tensorrt']})")
    if any(e["backend"] == COMPILED for e in manifest.get("engines", [])) and old.get("torch") != plat["torch"]:
        why.append(f"new torch ({old.get('torch')} -> {plat['torch']}): the compiled codec is checked again")
    return why


def unusable_reason(entry: dict, plat: dict, cache_dir: Path) -> str | None:
    """Why a built engine cannot run here now (missing library or file), else None."""
    b = entry["backend"]
    if b == "onnxruntime" and not plat["onnxruntime"]:
        return "missing library: onnxruntime is not installed (pip install 'tts-appliance[onnx]')"
    if b == "tensorrt" and not plat["tensorrt"]:
        return "missing library: tensorrt is not installed"
    if b == COMPILED:
        from engines.codec.backend_compiled import unavailable_reason

        why = unavailable_reason(plat["device"])
        if why:
            return why
    if entry.get("file") and not (cache_dir / entry["file"]).is_file():
        return f"missing file {cache_dir / entry['file']}"
    if entry.get("parity_ok") is False:
        return f"failed the parity check at build time (max abs {entry.get('parity_max_abs')})"
    return None
