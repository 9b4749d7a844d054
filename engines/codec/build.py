"""Install-time codec engine builds with a manifest, and the loader that picks a built engine.

    build_engines(model_dir, cache_dir, device="auto", ...) -> manifest dict
    load_built_codec(engine_or_model_dir, cache_dir, device, batch_size=1) -> codec backend
    runtime_codec(engine, n_slots, choice) -> the backend the runner's CodecStreams decodes with

The cache folder holds the exported ONNX step graph (`codec_step.onnx`), a TensorRT plan on NVIDIA
machines with TensorRT, the inductor cache of the compiled torch codec (`inductor/`), and
`manifest.json`: model identity (codec weights hash), device name and capability, driver and
library versions, precision, profile shapes, parity errors, speeds and the backend ranking. The
loader rebuilds when the manifest no longer matches (new model, different GPU, new driver, torch or
TensorRT) and falls back, with a log line saying why, to the next engine and finally to the eager
torch codec. Backends: engines.codec.backend_{torch,compiled,onnx,trt}; the cache folder, the manifest's
format and the checks of whether it still fits: engines.codec.manifest.
"""
from __future__ import annotations

import contextlib
import json
import logging
import time
from functools import partial
from pathlib import Path

import torch

from engines.names import RUNTIME_CODECS

from engines.device.detect import detect_platform, resolve_device
from engines.model.checkpoint import DTYPES
from engines.codec.manifest import (COMPILED, FORMAT, INDUCTOR_DIR, MANIFEST, codec_dir,
                                    default_cache_dir, model_identity, read_manifest, stale_reasons, unusable_reason)
from engines.codec.parity import speed, stream_parity

log = logging.getLogger(__name__)

STEP_ONNX = "codec_step.onnx"
PARITY_TOL = {"fp32": 1e-3, "fp16": 5e-2, "bf16": 1e-1}  # max abs vs the torch codec, waveform in [-1, 1]


def default_backends(device: str) -> tuple[str, ...]:
    """What `build_engines` tries when not told: ONNX Runtime on the CPU; TensorRT and the compiled
    torch codec on NVIDIA GPUs (the compiled codec on the CPU only on request: a long compile for a
    gain ONNX Runtime mostly gives too)."""
    dev = device.split(":")[0]
    return {"cpu": ("onnxruntime",), "cuda": ("tensorrt", COMPILED)}.get(dev, ())


def default_compile_dtypes(device: str) -> tuple[str, ...]:
    """Dtypes the compiled codec is warmed for: the engine's dtype picks the graph at run time."""
    return ("float32", "bfloat16") if device.startswith("cuda") else ("float32",)


def _make(entry: dict, cache_dir: Path, decoder, batch_size: int, device: str, threads: int = 0):
    spf = decoder.samples_per_frame
    if entry["backend"] == "onnxruntime":
        from engines.codec.backend_onnx import OnnxCodec

        return OnnxCodec(cache_dir / entry["file"], batch_size, spf, threads=threads)
    if entry["backend"] == "tensorrt":
        from engines.codec.backend_trt import TrtCodec

        return TrtCodec(cache_dir / entry["file"], batch_size, spf, device)
    from engines.codec.backend_torch import TorchCodec

    if entry["backend"] == COMPILED:
        return TorchCodec(decoder, batch_size, compile=True, cache_dir=cache_dir / entry.get("cache", INDUCTOR_DIR))
    return TorchCodec(decoder, batch_size)


@contextlib.contextmanager
def _matmul_tf32(on: bool | None):
    saved = torch.backends.cuda.matmul.allow_tf32
    if on is not None:
        torch.backends.cuda.matmul.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


@contextlib.contextmanager
def _true_fp32():
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _build_compiled(model_dir, cache: Path, dev: str, dtypes, benchmark: bool) -> dict:
    """Compile the torch codec step for `dev` in each of `dtypes` into cache/inductor (the compile
    is what install time is for: a later process finds the generated code there) and check it
    against the eager torch codec on the same device and dtype. Raises when a compile fails."""
    from engines.codec.backend_compiled import MIN_ROWS
    from engines.codec.backend_torch import TorchCodec
    from engines.codec.parity import ragged_parity
    from engines.codec.decoder import load_codec_decoder

    entry = {"backend": COMPILED, "cache": INDUCTOR_DIR, "precision": "model dtype",
             "mode": "inductor, whole step, dynamic batch and frames (pushes padded to >= 2)",
             "torch": torch.__version__, "dtypes": {}}
    ind = cache / INDUCTOR_DIR
    # inductor keys its cache on the fp32 matmul precision (TF32 or not) too: on a GPU, compile for
    # both, so a process finds its code whichever the runtime sets
    tf32_variants = (False, True) if dev.startswith("cuda") else (None,)
    for name in dtypes:
        dec = load_codec_decoder(codec_dir(model_dir), dev, DTYPES[name].dtype)
        secs = 0.0
        for tf32 in tf32_variants:
            with _matmul_tf32(tf32):
                codec = TorchCodec(dec, MIN_ROWS, compile=True, cache_dir=ind)
                secs += codec.warm()
            if codec.fallback_reason:
                raise RuntimeError(f"{name}: {codec.fallback_reason}")
        mk = lambda b, dec=dec: TorchCodec(dec, b, compile=True, cache_dir=ind)  # noqa: E731
        with _true_fp32():  # compare the compile, not TF32 rounding (cuDNN convs use TF32 by default)
            err = ragged_parity(lambda b, dec=dec: TorchCodec(dec, b), mk, dec)
        tol = PARITY_TOL[DTYPES[name].short]
        info = {"compile_seconds": round(secs, 1), "parity_max_abs": err, "parity_ok": err <= tol,
                "parity_vs": f"eager torch codec, {dev}, {name}, TF32 off",
                "variants": ["matmul TF32 off", "matmul TF32 on"] if tf32_variants[0] is not None else ["cpu"]}
        if benchmark and name == dtypes[0]:
            info["speed"] = {"torch": speed(lambda b, dec=dec: TorchCodec(dec, b), dec),
                             COMPILED: speed(mk, dec)}
        entry["dtypes"][name] = info
        log.info("compiled codec %s on %s: %.1f s, max abs vs eager %.3g", name, dev, secs, err)
    first = entry["dtypes"][dtypes[0]]
    entry["parity_max_abs"] = max(d["parity_max_abs"] for d in entry["dtypes"].values())
    entry["parity_ok"] = all(d["parity_ok"] for d in entry["dtypes"].values())
    if "speed" in first:
        key = "cpu_speed" if dev == "cpu" else "gpu_speed"
        entry[key] = first["speed"][COMPILED]
        entry["eager_" + key] = first["speed"]["torch"]
    return entry


def build_engines(model_dir: str | Path, cache_dir: str | Path | None = None, device: str = "auto",
                  max_batch: int = 8, chunk_frames=(1, 2, 4, 8), precision: str = "auto",
                  backends=None, benchmark: bool = True, force: bool = False, compile_dtypes=None) -> dict:
    """Build the codec engines this machine can run into `cache_dir`; returns the manifest.

    `backends`: subset of ("onnxruntime", "tensorrt", "torch-compiled") to try (None: the defaults
    of the device, `default_backends`). Up-to-date builds are kept unless `force`. `precision`
    'auto' = fp16 for TensorRT, fp32 elsewhere. `compile_dtypes`: the dtypes the compiled torch
    codec is built for (None: float32 and bfloat16 on CUDA, float32 on the CPU).
    """
    from engines.codec.decoder import load_codec_decoder

    t0 = time.time()
    cache = Path(cache_dir) if cache_dir else default_cache_dir(model_dir)
    dev, plat, ident = resolve_device(device), detect_platform(device), model_identity(model_dir)
    want = set(default_backends(dev) if backends is None else backends)
    dtypes = tuple(compile_dtypes or default_compile_dtypes(dev))
    bad = set(dtypes) - set(DTYPES)
    if bad:
        raise ValueError(f"compile dtypes must be among {sorted(DTYPES)}, got {sorted(bad)}")
    old = read_manifest(cache)
    opts = (old or {}).get("options", {})
    if not force and not stale_reasons(old, plat, ident) and opts.get("max_batch") == max_batch \
            and opts.get("backends", sorted(want)) == sorted(want) \
            and (COMPILED not in want or opts.get("compile_dtypes") == list(dtypes)):
        log.info("codec engines in %s are up to date", cache)
        return old
    cache.mkdir(parents=True, exist_ok=True)
    ref = load_codec_decoder(codec_dir(model_dir), "cpu", torch.float32)
    engines, skipped = [{"backend": "torch", "precision": "fp32" if dev == "cpu" else "model dtype"}], {}
    use_ort = "onnxruntime" in want and dev == "cpu"
    use_trt = "tensorrt" in want and dev.startswith("cuda")
    onnx_ok = bool(plat["onnx"]) and ((use_ort and plat["onnxruntime"]) or (use_trt and plat["tensorrt"]))
    if onnx_ok:
        from engines.codec.export import export_step, step_input_names, step_output_names

        export_step(ref, cache / STEP_ONNX)
        io = {"inputs": step_input_names(ref), "outputs": step_output_names(ref)}
    elif not plat["onnx"] and (use_ort or use_trt):
        skipped["onnx"] = "missing library: onnx is not installed (pip install 'tts-appliance[onnx]')"
    if use_ort:
        if plat["onnxruntime"] and onnx_ok:
            engines.append({"backend": "onnxruntime", "file": STEP_ONNX, "precision": "fp32",
                            "providers": ["CPUExecutionProvider"], "axes": {"batch": "dynamic", "frames": "dynamic"},
                            "n_inputs": len(io["inputs"]), "n_outputs": len(io["outputs"])})
        elif not plat["onnxruntime"]:
            skipped["onnxruntime"] = "missing library: onnxruntime is not installed"
    if use_trt:
        if not plat["tensorrt"]:
            skipped["tensorrt"] = "missing library: tensorrt is not installed"
        elif onnx_ok:
            from engines.codec.backend_trt import build_plan

            prec = "fp16" if precision == "auto" else precision
            plan = f"codec_step.{prec}.plan"
            try:
                info = build_plan(cache / STEP_ONNX, cache / plan, ref.config, max_batch, chunk_frames, prec)
                engines.append({"backend": "tensorrt", "file": plan, **info})
            except Exception as exc:  # a failed TensorRT build must not stop the install
                log.warning("TensorRT build failed, the torch codec will be used on this GPU: %s", exc)
                skipped["tensorrt"] = f"build failed: {exc}"
    if COMPILED in want:
        from engines.codec.backend_compiled import unavailable_reason

        why = unavailable_reason(dev)
        if why:
            log.warning("compiled torch codec not built: %s; the eager torch codec will be used", why)
            skipped[COMPILED] = why
        else:
            try:
                engines.append(_build_compiled(model_dir, cache, dev, dtypes, benchmark))
            except Exception as exc:  # a failed compile must not stop the install
                log.warning("compiled torch codec failed to build (%s): the eager torch codec will be used", exc)
                skipped[COMPILED] = f"build failed: {exc}"
    if dev.startswith("npu"):
        skipped["npu"] = ("no prebuilt Ascend engine yet: the torch codec runs on the NPU "
                          "(graphs: engines.device.graphs.NPUGraph)")
    for e in engines:  # parity of every engine against the fp32 torch codec, and CPU speed
        if e["backend"] in ("torch", COMPILED):  # the compiled codec was checked against eager above
            continue
        run_dev = dev if e["backend"] == "tensorrt" else "cpu"
        mk = lambda b, e=e: _make(e, cache, ref, b, run_dev, threads=torch.get_num_threads())  # noqa: E731
        e["parity_max_abs"] = stream_parity(mk, ref)
        e["parity_ok"] = e["parity_max_abs"] <= PARITY_TOL.get(e.get("precision", "fp32"), 1e-3)
        if not e["parity_ok"]:
            log.warning("%s codec differs from torch by %.3g (max abs): it will not be used",
                        e["backend"], e["parity_max_abs"])
    if benchmark and dev == "cpu":
        for e in engines:
            if e.get("parity_ok", True) and "cpu_speed" not in e:
                e["cpu_speed"] = speed(lambda b, e=e: _make(e, cache, ref, b, "cpu",
                                                            threads=torch.get_num_threads()), ref)
    ranking = _rank(engines, dev)
    manifest = {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "build_seconds": round(time.time() - t0, 1), "model": ident, "model_dir": str(model_dir),
                "platform": plat, "options": {"device": dev, "max_batch": max_batch,
                                              "chunk_frames": sorted(set(chunk_frames)), "precision": precision,
                                              "backends": sorted(want), "compile_dtypes": list(dtypes)},
                "engines": engines, "ranking": ranking, "skipped": skipped}
    tmp = cache / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    tmp.replace(cache / MANIFEST)
    log.info("codec engines for %s built in %s (%.0f s): use %s%s", Path(model_dir).name, cache,
             manifest["build_seconds"], " > ".join(ranking),
             "".join(f"; {k} skipped: {v}" for k, v in skipped.items()))
    return manifest


def _rank(engines: list[dict], dev: str) -> list[str]:
    """Backends in the order the loader tries them: the fastest measured on CPU; on a GPU TensorRT
    first, then the compiled torch codec before the eager one unless it measured slower."""
    ok = [e for e in engines if e.get("parity_ok", True)]
    if dev == "cpu":
        ok.sort(key=lambda e: -e.get("cpu_speed", {}).get("audio_s_per_s", 0.0))
        return [e["backend"] for e in ok]
    ok.sort(key=lambda e: ({"tensorrt": 0, COMPILED: 1}.get(e["backend"], 2)))
    names = [e["backend"] for e in ok]
    comp = next((e for e in ok if e["backend"] == COMPILED), None)
    if comp and "gpu_speed" in comp and comp["gpu_speed"]["audio_s_per_s"] < comp["eager_gpu_speed"]["audio_s_per_s"]:
        names.remove(COMPILED)
        names.insert(names.index("torch") + 1, COMPILED)
        log.warning("the compiled torch codec measured slower than eager here: ranked after it")
    return names


def load_built_codec(engine_or_model_dir, cache_dir: str | Path | None = None, device: str = "auto",
                     batch_size: int = 1, rebuild: bool = True, threads: int | None = None, row_threads: int = 1):
    """The best codec backend built for this model and machine, rebuilding or falling back as needed.

    `engine_or_model_dir`: a TTSEngine (its `.root` and `.decoder` are used) or a checkpoint folder.
    Falls back to the torch codec (logged with the reason) when nothing else can run; the eager torch
    codec, ranked first or fallen back to, decodes a call's rows on `row_threads` threads (CPU).
    """
    from engines.codec.backend_torch import TorchCodec

    engine = None if isinstance(engine_or_model_dir, (str, Path)) else engine_or_model_dir
    model_dir = Path(engine.root if engine is not None else engine_or_model_dir)
    dev = resolve_device(device if engine is None or device != "auto" else str(engine.device))
    cache = Path(cache_dir) if cache_dir else default_cache_dir(model_dir)
    if engine is not None:
        decoder = engine.decoder
    else:
        from engines.codec.decoder import load_codec_decoder

        decoder = load_codec_decoder(codec_dir(model_dir), dev, torch.float32)
    eager = partial(TorchCodec, decoder, batch_size, row_threads=row_threads)  # ranked first or fallen back to
    plat, ident = detect_platform(dev), model_identity(model_dir)
    manifest = read_manifest(cache)
    why = stale_reasons(manifest, plat, ident)
    if why and rebuild:
        log.warning("codec engines in %s must be rebuilt: %s", cache, "; ".join(why))
        try:
            opts = (manifest or {}).get("options", {})
            manifest = build_engines(model_dir, cache, dev, max_batch=max(batch_size, opts.get("max_batch", 8)),
                                     chunk_frames=opts.get("chunk_frames", (1, 2, 4, 8)),
                                     precision=opts.get("precision", "auto"), backends=opts.get("backends"),
                                     compile_dtypes=opts.get("compile_dtypes"), force=True)
        except Exception as exc:
            log.warning("rebuilding the codec engines failed (%s): using the torch codec", exc)
            return eager()
    elif why:
        log.warning("codec engines in %s do not fit (%s): using the torch codec", cache, "; ".join(why))
        return eager()
    by_name = {e["backend"]: e for e in manifest["engines"]}
    for name in manifest["ranking"]:
        entry = by_name[name]
        if name == "torch":
            break
        reason = unusable_reason(entry, plat, cache)
        if reason is None:
            try:
                codec = _make(entry, cache, decoder, batch_size, dev,
                              threads=torch.get_num_threads() if threads is None else threads)
                if name == COMPILED:
                    codec.warm()  # traces now, loading the generated code from the cache
                    if codec.fallback_reason:
                        raise RuntimeError(codec.fallback_reason)
                log.info("codec backend: %s (%s)", name, cache / entry.get("file", entry.get("cache", "")))
                return codec
            except Exception as exc:
                reason = f"failed to load: {exc}"
        log.warning("codec engine %s not used: %s; falling back", name, reason)
    log.info("codec backend: torch (%s)", "ranked first by the build" if manifest["ranking"][:1] == ["torch"]
             else "fallback")
    return eager()


RUNTIME_CHOICES = RUNTIME_CODECS


def codec_choice(choice: str, cache: Path | None) -> str:
    """runtime.codec decided: "auto" -> "built" when `build-engines` left a manifest in the engine cache
    folder `cache`, else "torch"; any other choice as given. The one place auto is decided: the daemon's
    settings (appliance.settings) put the result in each EngineSpec, `runtime_codec` applies it."""
    if choice != "auto":
        return choice
    return "built" if cache is not None and (Path(cache) / MANIFEST).is_file() else "torch"


def runtime_codec(engine, n_slots: int, choice: str = "torch", cache_dir: str | Path | None = None,
                  fast: bool | None = None, row_threads: int = 1, decoder=None):
    """The codec backend the runner decodes its slot table with (engines.runtime.stream.CodecStreams).

    `choice`:
    - "torch": the eager torch codec on the engine's decoder (the default, as before backends existed);
    - "torch-compiled": the compiled torch codec, its inductor cache in the engine cache folder (so
      what `build-engines` compiled is loaded, not generated again); eager, with a log line saying
      why, when compiling cannot work here;
    - "built": the first usable engine `build-engines` ranked for this model and machine
      (`load_built_codec` without rebuilding: stale or missing builds fall back to eager torch, logged);
    - "auto": "built" when a manifest exists in the cache folder, else "torch".
    `cache_dir`: the engine cache folder (default: `default_cache_dir(engine.root)`).
    `fast`: the eager torch codec runs its upsampling stack channels-last and fused (engines.codec.fast);
    None: on CUDA. `row_threads`: the eager torch codec on the CPU decodes a call's rows in that many groups
    at once, on threads of their own (engines.codec.streaming.StreamingCodecDecoder). `decoder`: the torch codecs'
    decoder (default the engine's; engines.codec.dtype.lane_decoder gives it in bf16).
    """
    from engines.codec.backend_torch import TorchCodec

    if choice not in RUNTIME_CHOICES:
        raise ValueError(f"codec backend must be one of {', '.join(RUNTIME_CHOICES)}, got {choice!r}")
    root = getattr(engine, "root", None)
    decoder = decoder if decoder is not None else engine.decoder
    eager = partial(TorchCodec, decoder, n_slots, row_threads=row_threads)
    cache = Path(cache_dir) if cache_dir else default_cache_dir(root) if root else None
    if choice == "auto":
        choice = codec_choice(choice, cache)
        log.info("codec backend auto -> %s (%s)", choice, cache / MANIFEST if cache is not None else "no cache folder")
    if choice == "torch":
        return eager(fast=fast)
    if choice == COMPILED:
        try:
            codec = TorchCodec(decoder, n_slots, compile=True,
                               cache_dir=cache / INDUCTOR_DIR if cache is not None else None)
        except RuntimeError as exc:
            log.warning("%s: using the eager torch codec", exc)
            return eager()
        codec.warm()  # falls back to eager itself, with a log line, when the compile fails
        return codec
    if root is None and cache_dir is None:
        log.warning("codec backend 'built': the engine has no checkpoint folder to find builds for; using torch")
        return eager()
    return load_built_codec(engine, cache, batch_size=n_slots, rebuild=False, row_threads=row_threads)
