"""`tts-appliance build-engines`: install-time codec engine builds (see engines.codec.build)."""
from __future__ import annotations

import json
import logging

import click

from engines.names import CODEC_BACKENDS as BACKENDS
from engines.names import AUTO, DTYPE_NAMES, DTYPE_SHORT

from appliance.cli_common import settings

log = logging.getLogger(__name__)
BUILDABLE = tuple(b for b in BACKENDS if b != "torch")  # the eager torch codec needs no build


def _ints(ctx, param, value: str) -> tuple[int, ...]:
    try:
        out = tuple(sorted({int(v) for v in value.split(",") if v.strip()}))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated frame counts like 1,2,4,8, got {value!r}") from None
    if not out or min(out) < 1:
        raise click.BadParameter("chunk sizes must be positive frame counts")
    return out


@click.command("build-engines")
@click.option("--model", "model", type=click.Path(),
              help="Folder of a Qwen3-TTS checkpoint (official layout; default: model.path of the config, else "
                   "$TTS_APPLIANCE_MODEL).")
@click.option("--cache", "cache", type=click.Path(file_okay=False),
              help="Engine cache folder (default: MODEL's folder in runtime.engine_cache of the config, else in "
                   "$TTS_APPLIANCE_ENGINE_CACHE, else in ~/.cache/tts-appliance/engines).")
@click.option("--device", help="auto, cpu, cuda[:N] or npu[:N] (default: model.device of the config, auto).")
@click.option("--max-batch", default=8, show_default=True, help="Most concurrent streams (TensorRT profiles).")
@click.option("--chunk-frames", default="1,2,4,8", show_default=True, callback=_ints,
              help="Frame counts per streaming push (one TensorRT profile each).")
@click.option("--precision", default="auto", show_default=True,
              type=click.Choice([AUTO, *DTYPE_SHORT.values()]),
              help="TensorRT precision (auto = fp16); CPU engines are always fp32.")
@click.option("--backends", default="auto", show_default=True,
              help="Which engines to try building: auto (onnxruntime on CPU; tensorrt and torch-compiled on "
                   f"NVIDIA GPUs) or a comma list of {', '.join(BUILDABLE)}.")
@click.option("--compile-dtypes", default="auto", show_default=True,
              help="Dtypes the compiled torch codec is built for: auto (float32,bfloat16 on CUDA, float32 on "
                   f"CPU) or a comma list of {', '.join(DTYPE_NAMES)} (use the daemon's model.dtype).")
@click.option("--benchmark/--no-benchmark", default=True, show_default=True,
              help="Time the engines against the eager torch codec and rank the faster first.")
@click.option("--force", is_flag=True, help="Rebuild even when the manifest matches this machine and model.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def build_engines_cmd(model, cache, device, max_batch, chunk_frames, precision, backends, compile_dtypes, benchmark,
                      force, as_json):
    """Build the codec engines this machine can run (ONNX Runtime on CPU; TensorRT and the compiled
    torch codec on NVIDIA GPUs)."""
    from appliance.config import ConfigError
    from engines.codec.build import build_engines
    from engines.codec.manifest import default_cache_dir

    cfg = settings(model=model, device=device)
    try:
        model = cfg.require_model()
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    device = cfg.model.device
    wanted = None if backends.strip() == "auto" else tuple(b.strip() for b in backends.split(",") if b.strip())
    bad = set(wanted or ()) - set(BUILDABLE)
    if bad:
        raise click.BadParameter(f"unknown backends {sorted(bad)}; use auto or {', '.join(BUILDABLE)}",
                                 param_hint="--backends")
    dtypes = None if compile_dtypes.strip() == "auto" else \
        tuple(d.strip() for d in compile_dtypes.split(",") if d.strip())
    if dtypes is not None and (not dtypes or set(dtypes) - set(DTYPE_NAMES)):
        raise click.BadParameter(f"use auto or a comma list of {', '.join(DTYPE_NAMES)}, got {compile_dtypes!r}",
                                 param_hint="--compile-dtypes")
    cache = cache or str(default_cache_dir(model, cfg.runtime.engine_cache))
    manifest = build_engines(model, cache, device=device, max_batch=max_batch, chunk_frames=chunk_frames,
                             precision=precision, backends=wanted, benchmark=benchmark, force=force,
                             compile_dtypes=dtypes)
    if as_json:
        click.echo(json.dumps(manifest, indent=2))
        return
    plat = manifest["platform"]
    click.echo(f"engines in {cache} for {plat['device']} ({plat['device_name']}):")
    for e in manifest["engines"]:
        extra = [f"{k}={e[k]}" for k in ("file", "cache", "precision", "parity_max_abs") if k in e]
        for key in ("cpu_speed", "gpu_speed"):
            if key in e:
                extra.append(f"{e[key]['audio_s_per_s']} audio-s/s")
                if "eager_" + key in e:
                    extra.append(f"(eager {e['eager_' + key]['audio_s_per_s']})")
        for name, d in e.get("dtypes", {}).items():
            extra.append(f"{name}: compiled in {d['compile_seconds']} s, max abs vs eager {d['parity_max_abs']:.2g}")
        click.echo(f"  {e['backend']:<14} {' '.join(extra)}")
    for name, why in manifest.get("skipped", {}).items():
        click.echo(f"  {name:<14} skipped: {why}")
    click.echo(f"order of use: {' > '.join(manifest['ranking'])}")

