"""Baseline: the official `qwen-tts` package, timed at a fixed length on the engine benchmark's weights.

    python -m benchmarks.official_baseline --dummy 0.6b --seed 0 --frames 150 --batch 1,8 --json base.json
    python -m benchmarks.official_baseline --model CHECKPOINT_DIR --frames 150 --batch 1,8

Runs in the official package's environment (qwen-tts 0.1.1, transformers 4.57.3) with this repository
importable (run from the repository root). `--dummy SHAPE --seed S` builds the random real-shape weights
with the very function benchmarks/bench.py uses (`benchmarks.dummy_engine.dummy_engine(SHAPE, device, dtype,
S)`), writes them as a checkpoint folder in the official layout (benchmarks/dummy_checkpoint.py) and loads
that folder with `qwen_tts.Qwen3TTSModel.from_pretrained`; then every tensor the official model received
is compared with ours (`weights_check` in the report). Use the benchmark's device: the random fill differs
between CPU and CUDA generators.

What is timed, per batch size, after one warm-up run at that batch size: `Qwen3TTSModel.generate_custom_voice`
(or `generate_voice_design`) end to end: prompt building, `model.generate` (talker + code predictor, the
predictor being a 15-token HF `generate` per frame) and `speech_tokenizer.decode` (the codec, in 300-frame
chunks), waveforms returned as host numpy arrays. So the codec decode IS included in `seconds`; `generate_s`
(talker + predictor alone, synchronised at its end) and `codec_s` are reported next to it.

Fixed length: `eos_token_id` = the checkpoint's codec pad id (2148 on real checkpoints; always suppressed,
so generation never stops early), `max_new_tokens` = frames + 1 (the package returns N-1 frames for N
tokens). The real codec EOS (2150) is not suppressed by the package (random weights sample it now and
then, which would cut an item's codes short): unless --keep-eos, `config.talker_config.codec_eos_token_id`
is set to -1 in memory, which adds 2150 to the suppressed ids and nothing else. Sampling settings come
from generation_config.json (temperature 0.9, top-k 50, repetition penalty 1.05; sub-talker the same).

x-realtime = audio seconds of the whole batch / wall seconds (aggregate; higher is better).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.machinery
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

log = logging.getLogger("official_baseline")

# Same sentence, speaker and language as benchmarks/bench.py's requests.
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the quiet forest."
SPEAKER, LANGUAGE = "vivian", "english"
INSTRUCT = "A calm, clear voice."
FRAME_S = 0.08
CHECKSUM_TENSORS = ("talker.model.layers.0.self_attn.q_proj.weight", "talker.codec_head.weight",
                    "talker.code_predictor.lm_head.14.weight", "decoder.quantizer.rvq_first.vq.layers.0._codebook.embedding_sum")


def stub_torchaudio() -> None:
    """Empty `torchaudio` modules: `import qwen_tts` imports torchaudio, whose wheel often does not match the
    installed torch; only the 25 Hz tokenizer (not used here) needs it. Same stub as tests/fixtures."""
    for name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
            sys.modules[name] = mod
    sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]
    sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


# ---------------------------------------------------------------------------------------------
# Weights: strict name/shape check of the checkpoint files, identity with the engine's tensors
# ---------------------------------------------------------------------------------------------


def file_vs_module(path: Path, module: torch.nn.Module, prefix: str = "") -> dict:
    """Names and shapes in safetensors `path` (keys starting with `prefix`) against `module.state_dict()`."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        have = {k[len(prefix):]: tuple(f.get_slice(k).get_shape()) for k in f.keys() if k.startswith(prefix)}
    want = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    return {"file": str(path), "tensors": len(have),
            "missing": sorted(set(want) - set(have)), "unexpected": sorted(set(have) - set(want)),
            "shape_mismatch": sorted(f"{k}: file {have[k]} model {want[k]}"
                                     for k in set(have) & set(want) if have[k] != want[k])}


def strict_check(root: Path, tts) -> dict:
    """Every tensor of the checkpoint folder against the official modules, by name and shape."""
    res = {"model.safetensors": file_vs_module(root / "model.safetensors", tts.model),
           "speech_tokenizer/model.safetensors": file_vs_module(root / "speech_tokenizer" / "model.safetensors",
                                                                tts.model.speech_tokenizer.model)}
    res["ok"] = not any(r["missing"] or r["unexpected"] or r["shape_mismatch"] for r in res.values())
    return res


def _digest(t: torch.Tensor) -> dict:
    raw = t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {"dtype": str(t.dtype).split(".")[-1], "shape": list(t.shape), "sum": float(t.double().sum()),
            "sha256": hashlib.sha256(raw).hexdigest()[:16]}


def compare_weights(ours: dict[str, torch.Tensor], official: dict[str, torch.Tensor]) -> dict:
    """Bitwise identity (dtype included) of every tensor of `ours` with the same-named official tensor."""
    differ = [k for k in ours if k not in official or official[k].dtype != ours[k].dtype
              or official[k].shape != ours[k].shape or not torch.equal(official[k].to(ours[k].device), ours[k])]
    return {"tensors": len(ours), "identical": len(ours) - len(differ), "differ": sorted(differ)[:20],
            "checksums": {k: {"ours": _digest(ours[k]), "official": _digest(official[k])}
                          for k in CHECKSUM_TENSORS if k in ours and k in official}}


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


class GenerateTimer:
    """Wraps `tts.model.generate` to time talker + predictor alone and record the frames it returns."""

    def __init__(self, model, device: torch.device):
        self.model, self.device, self.orig = model, device, model.generate
        self.start = self.end = 0.0
        self.frames: list[int] = []
        model.generate = self

    def __call__(self, *args, **kwargs):
        sync(self.device)
        self.start = time.perf_counter()
        codes, hidden = self.orig(*args, **kwargs)
        sync(self.device)
        self.end = time.perf_counter()
        self.frames = [int(c.shape[0]) for c in codes]
        return codes, hidden


def synthesize(tts, batch: int, frames: int, stop_id: int, seed: int, instruct: str | None):
    """One batched call of the official wrapper; returns its waveforms and sample rate."""
    torch.manual_seed(seed)
    kw = dict(max_new_tokens=frames + 1, eos_token_id=stop_id)
    if tts.model.tts_model_type == "voice_design":
        return tts.generate_voice_design(text=[TEXT] * batch, instruct=instruct or INSTRUCT,
                                         language=LANGUAGE, **kw)
    return tts.generate_custom_voice(text=[TEXT] * batch, speaker=pick_speaker(tts), language=LANGUAGE,
                                     instruct=instruct, **kw)


def pick_speaker(tts) -> str:
    speakers = sorted(tts.get_supported_speakers() or [])
    return SPEAKER if SPEAKER in speakers else speakers[0]


def time_batch(tts, timer: GenerateTimer, device, batch, frames, stop_id, seed, instruct, repeats) -> dict:
    runs = []
    for r in range(repeats):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        sync(device)
        t0 = time.perf_counter()
        wavs, sr = synthesize(tts, batch, frames, stop_id, seed + r, instruct)
        t1 = time.perf_counter()
        audio = sum(len(w) for w in wavs) / sr
        runs.append({"seconds": t1 - t0, "generate_s": timer.end - timer.start, "codec_s": t1 - timer.end,
                     "audio_s": audio, "frames_per_item": list(timer.frames),
                     "samples_per_item": [len(w) for w in wavs], "sample_rate": sr})
    best = sorted(runs, key=lambda x: x["seconds"])[len(runs) // 2]  # median run
    out = {"batch": batch, **best,
           "x_realtime": best["audio_s"] / best["seconds"],
           "x_realtime_generate_only": best["audio_s"] / best["generate_s"],
           "ms_per_frame_step": 1e3 * best["generate_s"] / frames,
           "repeats": repeats, "seconds_all_runs": [x["seconds"] for x in runs]}
    if device.type == "cuda":
        out["peak_gpu_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def compare_with_engine(res: dict, engine_json: Path) -> dict:
    """Ratios engine / official from a benchmarks/bench.py JSON report (same frames, shape, device expected)."""
    eng = json.loads(Path(engine_json).read_text(encoding="utf-8"))
    out = {"engine_report": str(engine_json), "caveats": [], "ratios": []}
    for key in ("device", "model", "dtype", "frames"):
        if eng.get(key) != res.get(key):
            out["caveats"].append(f"{key}: engine {eng.get(key)!r} vs official {res.get(key)!r}")
    out["caveats"].append("engine figures are closed-loop continuous batching (requests of `frames` frames, "
                          "codec included); official figures are one offline batch call")
    by_c = {a["concurrency"]: a["audio_s_per_s"] for a in eng.get("aggregate", [])}
    for b in res["batches"]:
        row = {"batch": b["batch"], "official_x_realtime": b["x_realtime"]}
        if b["batch"] == 1 and "single" in eng:
            row["engine_single_x_realtime"] = eng["single"]["x_realtime"]
            row["ratio_single"] = eng["single"]["x_realtime"] / b["x_realtime"]
        if b["batch"] in by_c:
            row["engine_audio_s_per_s"] = by_c[b["batch"]]
            row["ratio_aggregate"] = by_c[b["batch"]] / b["x_realtime"]
        out["ratios"].append(row)
    return out


def markdown(r: dict) -> str:
    lines = [f"### official qwen-tts {r['versions']['qwen_tts']} baseline: {r['model']} {r['dtype']} on {r['device']} "
             f"({r['frames']} frames per item, codec decode included)", "",
             "| batch | wall s | audio s | x realtime | generate s (talker+predictor) | codec s |", "|---|---|---|---|---|---|"]
    for b in r["batches"]:
        lines.append(f"| {b['batch']} | {b['seconds']:.2f} | {b['audio_s']:.2f} | {b['x_realtime']:.3f} | "
                     f"{b['generate_s']:.2f} | {b['codec_s']:.2f} |")
    for row in r.get("comparison", {}).get("ratios", []):
        parts = [f"{k} {row[k]:.1f}x" for k in ("ratio_single", "ratio_aggregate") if k in row]
        if parts:
            lines.append(f"\nengine / official at batch {row['batch']}: " + ", ".join(parts))
    return "\n".join(lines) + "\n"


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"torch": torch.__version__}
    for name, dist in (("qwen_tts", "qwen-tts"), ("transformers", "transformers")):
        try:
            out[name] = version(dist)
        except PackageNotFoundError:
            out[name] = "unknown"
    import transformers

    out["transformers_imported"] = transformers.__version__  # the one on sys.path (PYTHONPATH may shadow)
    return out


def model_shape(cfg) -> dict:
    t = cfg.talker_config
    p = t.code_predictor_config
    return {"tts_model_type": cfg.tts_model_type, "tts_model_size": cfg.tts_model_size,
            "talker": {"hidden": t.hidden_size, "layers": t.num_hidden_layers, "ffn": t.intermediate_size,
                       "heads": t.num_attention_heads, "kv_heads": t.num_key_value_heads,
                       "head_dim": getattr(t, "head_dim", None), "vocab": t.vocab_size},
            "code_predictor": {"hidden": p.hidden_size, "layers": p.num_hidden_layers, "ffn": p.intermediate_size,
                               "vocab": p.vocab_size}}


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def import_official():
    """`qwen_tts.Qwen3TTSModel`, imported with the torchaudio stub; the package's import-time notices (it
    prints a flash-attn warning to stdout) go to stderr, keeping stdout for the report."""
    stub_torchaudio()
    with contextlib.redirect_stdout(sys.stderr):
        from qwen_tts import Qwen3TTSModel
    return Qwen3TTSModel


def run(args) -> dict:
    Qwen3TTSModel = import_official()

    from engines.model.checkpoint import resolve_dtype

    logging.getLogger("transformers").setLevel(logging.ERROR)
    logging.getLogger("qwen_tts").setLevel(logging.WARNING)
    device, dtype = torch.device(args.device), resolve_dtype(args.dtype)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batch.split(",")]
    tmp, ours = None, None
    res = {"baseline": "official qwen-tts", "device": device_name(device), "dtype": str(dtype).split(".")[-1],
           "frames": args.frames}
    t_setup = time.perf_counter()
    if args.dummy:
        from benchmarks.dummy_checkpoint import write_dummy_checkpoint

        if args.checkpoint_dir:
            root = Path(args.checkpoint_dir)
        else:
            tmp = tempfile.mkdtemp(prefix="official_baseline_", dir=args.workdir)
            root = Path(tmp)
        log.info("building dummy-%s seed %d on %s and writing it to %s", args.dummy, args.seed, args.device, root)
        _, engine = write_dummy_checkpoint(args.dummy, root, args.device, dtype, args.seed, codec_dtype=None)  # bit for bit
        ours = {**engine.weights.state_dict(), **{"decoder." + k: v for k, v in engine.decoder.state_dict().items()}}
        res["model"] = f"dummy-{args.dummy}"
        res["weights_source"] = (f"benchmarks.dummy_engine.dummy_engine({args.dummy!r}, {args.device!r}, "
                                 f"{res['dtype']!r}, seed={args.seed}) written by benchmarks.dummy_checkpoint")
        res["engine_model_id"] = engine.model_id
        del engine
    else:
        root = Path(args.model)
        if json.loads((root / "config.json").read_text(encoding="utf-8")).get("tts_model_type") == "base":
            raise SystemExit("Base (voice clone) checkpoints need reference audio: give a CustomVoice or "
                             "VoiceDesign one")
        res["model"] = root.name
        res["weights_source"] = str(root)
    try:
        log.info("loading %s with Qwen3TTSModel.from_pretrained (%s, %s)", root, device, dtype)
        kw = {"attn_implementation": args.attn} if args.attn else {}
        tts = Qwen3TTSModel.from_pretrained(str(root), dtype=dtype, device_map=str(device), **kw)
        res["strict_check"] = strict_check(root, tts)
        if ours is not None:
            official = {**tts.model.state_dict(),
                        **{"decoder." + k: v for k, v in tts.model.speech_tokenizer.model.decoder.state_dict().items()}}
            res["weights_check"] = compare_weights(ours, official)
            ours = official = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    if not res["strict_check"]["ok"]:
        raise SystemExit(f"checkpoint tensors do not match the official model: {json.dumps(res['strict_check'])}")
    if "weights_check" in res and res["weights_check"]["differ"]:
        raise SystemExit(f"official weights differ from ours: {res['weights_check']['differ']}")

    cfg = tts.model.config
    res["shape"] = model_shape(cfg)
    res["attn_implementation"] = getattr(cfg, "_attn_implementation", None)
    res["versions"] = versions()
    res["setup_s"] = time.perf_counter() - t_setup
    stop_id = cfg.talker_config.codec_pad_id
    real_eos = cfg.talker_config.codec_eos_token_id
    if not args.keep_eos:
        cfg.talker_config.codec_eos_token_id = -1
    res["fixed_length"] = {
        "max_new_tokens": args.frames + 1, "eos_token_id": stop_id,
        "codec_eos_suppressed": not args.keep_eos, "codec_eos_id": real_eos,
        "note": "eos_token_id = codec pad id (always suppressed); max_new_tokens = frames + 1 because the package "
                "returns N-1 frames" + ("" if args.keep_eos else "; codec EOS added to the suppressed ids "
                                        "(config.talker_config.codec_eos_token_id = -1 in memory)")}
    res["codec_decode"] = ("included in seconds / x_realtime: Qwen3TTSModel.generate_%s = model.generate "
                           "(talker + code predictor) + speech_tokenizer.decode (300-frame chunks) to host numpy; "
                           "generate_s = model.generate alone, codec_s = the rest" %
                           ("voice_design" if tts.model.tts_model_type == "voice_design" else "custom_voice"))
    res["text"], res["language"] = TEXT, LANGUAGE
    res["speaker"] = pick_speaker(tts) if cfg.tts_model_type == "custom_voice" else None
    timer = GenerateTimer(tts.model, device)

    res["batches"] = []
    for b in batches:
        t0 = time.perf_counter()
        synthesize(tts, b, min(args.frames, args.warmup_frames), stop_id, args.seed + 1000, args.instruct)
        log.info("batch %d: warm-up (%d frames) %.1f s", b, min(args.frames, args.warmup_frames), time.perf_counter() - t0)
        row = time_batch(tts, timer, device, b, args.frames, stop_id, args.seed, args.instruct, args.repeats)
        row["warmup_frames"] = min(args.frames, args.warmup_frames)
        bad = [n for n in row["frames_per_item"] if n != args.frames]
        row["fixed_length_ok"] = not bad
        if bad:
            log.warning("batch %d: items produced %s frames, not %d", b, row["frames_per_item"], args.frames)
        log.info("batch %d: %.2f s for %.2f audio s -> %.3fx realtime (generate %.2f s, codec %.2f s)",
                 b, row["seconds"], row["audio_s"], row["x_realtime"], row["generate_s"], row["codec_s"])
        res["batches"].append(row)
    if args.compare:
        res["comparison"] = compare_with_engine(res, Path(args.compare))
    return res


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="checkpoint folder in the official layout (CustomVoice or VoiceDesign)")
    src.add_argument("--dummy", choices=["0.6b", "1.7b"], help="the engine benchmark's random weights of this shape")
    ap.add_argument("--seed", type=int, default=0, help="dummy weights seed (bench.py uses 0); also sampling seed")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--frames", type=int, default=150, help="frames per item (12.5 per audio second)")
    ap.add_argument("--batch", default="1,8", help="comma list of batch sizes")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per batch size (median reported)")
    ap.add_argument("--warmup-frames", type=int, default=20, help="frames of the warm-up run per batch size")
    ap.add_argument("--instruct", default=None, help="instruction (VoiceDesign; 1.7B CustomVoice)")
    ap.add_argument("--attn", default=None, help="attn_implementation for from_pretrained (default: the package's)")
    ap.add_argument("--keep-eos", action="store_true", help="leave the codec EOS sampleable (items may end early)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    ap.add_argument("--checkpoint-dir", help="with --dummy: write (and keep) the checkpoint folder here")
    ap.add_argument("--workdir", default=None, help="with --dummy: parent of the temporary checkpoint folder")
    ap.add_argument("--compare", help="a benchmarks/bench.py --json report to state engine/official ratios")
    ap.add_argument("--json", help="write the JSON report here")
    ap.add_argument("--md", help="write a markdown table here")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    res = run(args)
    text = json.dumps(res, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    md = markdown(res)
    if args.md:
        Path(args.md).write_text(md, encoding="utf-8")
    sys.stdout.write(text + "\n" + md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
