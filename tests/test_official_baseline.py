"""benchmarks/official_baseline.py (the official qwen-tts package as the benchmark baseline) and
benchmarks/dummy_checkpoint.py (engine weights -> checkpoint folder in the official layout).

The official-package tests (marker `oracle`) run where `qwen_tts` is importable: by the interpreter named in
QWEN_TTS_PYTHON, else by the checkout's oracle venv (.venv-oracle: tests/fixtures/oracle_venv.sh, which
./install.sh --dev runs), else by this one. CI builds the oracle and sets TTS_APPLIANCE_REQUIRE_ORACLE_TESTS=1,
so there a skip is a failure (tests/conftest.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.dummy_checkpoint import mrope_section, write_checkpoint
from benchmarks.official_baseline import compare_with_engine, markdown
from engines.engine import TTSEngine

REPO = Path(__file__).resolve().parents[1]
TINY_CV = REPO / "tests" / "data" / "tiny" / "cv_small"
ORACLE_VENV = REPO / ".venv-oracle"  # tests/fixtures/oracle_venv.sh builds it


def oracle_python(env=os.environ, venv: Path = ORACLE_VENV) -> str:
    """The interpreter that runs the official package: $QWEN_TTS_PYTHON, else the oracle venv's, else this one."""
    if env.get("QWEN_TTS_PYTHON"):
        return env["QWEN_TTS_PYTHON"]
    built = venv / "bin" / "python"
    return str(built) if built.is_file() else sys.executable


ORACLE = oracle_python()


def _has_qwen_tts(python: str) -> bool:
    try:
        probe = subprocess.run([python, "-c", "import importlib.util, sys; "
                                "sys.exit(importlib.util.find_spec('qwen_tts') is None)"], capture_output=True)
    except OSError:
        return False
    return probe.returncode == 0


def needs_qwen_tts(test):
    """An `oracle` test: skips where ORACLE cannot import qwen_tts (a failure where the oracle is required)."""
    return pytest.mark.oracle(pytest.mark.skipif(
        not _has_qwen_tts(ORACLE),
        reason=f"the official qwen_tts package is not importable by {ORACLE}: build the oracle venv with "
               "tests/fixtures/oracle_venv.sh (./install.sh --dev does), or set QWEN_TTS_PYTHON to its python")(test))


def _oracle(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([ORACLE, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_oracle_is_the_variables_else_the_checkouts_venv(tmp_path):
    venv = tmp_path / "oracle"
    assert oracle_python({}, venv) == sys.executable  # not built: this interpreter (the tests then skip)
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    assert oracle_python({}, venv) == str(venv / "bin" / "python")
    assert oracle_python({"QWEN_TTS_PYTHON": "/opt/o/bin/python"}, venv) == "/opt/o/bin/python"


@pytest.mark.oracle
@pytest.mark.skipif(not (ORACLE_VENV / "oracle-spec.txt").is_file(),
                    reason="the oracle venv is not built here (tests/fixtures/oracle_venv.sh)")
def test_a_built_oracle_venv_is_checked_not_rebuilt():
    r = subprocess.run(["bash", "tests/fixtures/oracle_venv.sh"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "is ready" in r.stdout and "building" not in r.stdout


def test_mrope_section_matches_real_and_tiny_configs():
    assert mrope_section(128) == [24, 20, 20]
    tiny = json.loads((TINY_CV / "config.json").read_text())["talker_config"]
    assert mrope_section(tiny["head_dim"]) == tiny["rope_scaling"]["mrope_section"]


def test_written_checkpoint_reloads_identically(tmp_path, one_thread):
    """Engine -> official-layout folder -> our loader: same configs, every tensor bit-identical (bf16)."""
    eng = TTSEngine.load(TINY_CV, "cpu", "bfloat16")
    out = write_checkpoint(eng, tmp_path / "ckpt", TINY_CV)
    for name in ("config.json", "generation_config.json", "model.safetensors", "vocab.json", "merges.txt",
                 "tokenizer_config.json", "speech_tokenizer/config.json", "speech_tokenizer/model.safetensors",
                 "speech_tokenizer/preprocessor_config.json"):
        assert (out / name).is_file(), name
    root = json.loads((out / "config.json").read_text())
    assert root["model_type"] == "qwen3_tts" and "model_type" not in root["speaker_encoder_config"]
    again = TTSEngine.load(out, "cpu", "bfloat16")
    assert (again.cfg, again.codec_cfg, again.defaults) == (eng.cfg, eng.codec_cfg, eng.defaults)
    for a, b in ((eng.weights, again.weights), (eng.decoder, again.decoder)):
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys()
        assert all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa)


def test_engine_comparison_and_markdown(tmp_path):
    res = {"device": "GPU", "model": "dummy-0.6b", "dtype": "bfloat16", "frames": 150,
           "versions": {"qwen_tts": "0.1.1"},
           "batches": [{"batch": 1, "seconds": 30.0, "audio_s": 12.0, "x_realtime": 0.4, "generate_s": 29.0,
                        "codec_s": 1.0},
                       {"batch": 8, "seconds": 32.0, "audio_s": 96.0, "x_realtime": 3.0, "generate_s": 30.0,
                        "codec_s": 2.0}]}
    bench = {"device": "GPU", "model": "dummy-0.6b", "dtype": "bfloat16", "frames": 150,
             "single": {"x_realtime": 8.0}, "aggregate": [{"concurrency": 1, "audio_s_per_s": 7.0},
                                                          {"concurrency": 8, "audio_s_per_s": 60.0}]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    cmp = compare_with_engine(res, path)
    rows = {r["batch"]: r for r in cmp["ratios"]}
    assert rows[1]["ratio_single"] == pytest.approx(20.0) and rows[8]["ratio_aggregate"] == pytest.approx(20.0)
    assert not [c for c in cmp["caveats"] if c.startswith(("device", "model", "dtype", "frames"))]
    res["comparison"] = cmp
    md = markdown(res)
    assert "codec decode included" in md and "| 8 | 32.00 | 96.00 | 3.000 |" in md


@needs_qwen_tts
def test_official_baseline_tiny_fixed_length(tmp_path):
    frames, out = 6, tmp_path / "baseline.json"
    proc = _oracle(["-m", "benchmarks.official_baseline", "--model", str(TINY_CV), "--device", "cpu",
                    "--frames", str(frames), "--batch", "1,2", "--warmup-frames", "2", "--threads", "1",
                    "--json", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert json.JSONDecoder().raw_decode(proc.stdout)[0] == r  # the same report on stdout
    for key in ("device", "model", "dtype", "frames", "shape", "versions", "codec_decode", "fixed_length",
                "strict_check", "batches"):
        assert key in r, key
    assert r["dtype"] == "bfloat16" and r["frames"] == frames and r["model"] == "cv_small"
    assert r["strict_check"]["ok"] and r["versions"]["qwen_tts"] == "0.1.1"
    assert r["shape"]["talker"]["hidden"] == 64 and r["fixed_length"]["max_new_tokens"] == frames + 1
    assert r["codec_decode"].startswith("included")
    assert [b["batch"] for b in r["batches"]] == [1, 2]
    for b in r["batches"]:
        assert b["frames_per_item"] == [frames] * b["batch"] and b["fixed_length_ok"]
        assert b["samples_per_item"] == [frames * 1920] * b["batch"] and b["sample_rate"] == 24000
        assert b["audio_s"] == pytest.approx(b["batch"] * frames * 0.08)
        assert b["x_realtime"] == pytest.approx(b["audio_s"] / b["seconds"])
        assert 0 < b["generate_s"] < b["seconds"] and b["codec_s"] > 0


@needs_qwen_tts
def test_official_model_receives_our_weights(tmp_path):
    """The dummy path's mechanism on the tiny engine: written folder -> Qwen3TTSModel.from_pretrained ->
    every talker and codec-decoder tensor bit-identical to the engine's, names and shapes strict."""
    script = f"""
import json, torch
from benchmarks.official_baseline import import_official, compare_weights, strict_check
Qwen3TTSModel = import_official()
from benchmarks.dummy_checkpoint import write_checkpoint
from engines.engine import TTSEngine
eng = TTSEngine.load({str(TINY_CV)!r}, "cpu", "bfloat16")
root = write_checkpoint(eng, {str(tmp_path / "ckpt")!r}, {str(TINY_CV)!r})
tts = Qwen3TTSModel.from_pretrained(str(root), dtype=torch.bfloat16, device_map="cpu")
ours = {{**eng.weights.state_dict(), **{{"decoder." + k: v for k, v in eng.decoder.state_dict().items()}}}}
off = {{**tts.model.state_dict(),
       **{{"decoder." + k: v for k, v in tts.model.speech_tokenizer.model.decoder.state_dict().items()}}}}
print(json.dumps({{"strict": strict_check(root, tts)["ok"], "weights": compare_weights(ours, off)}}))
"""
    proc = _oracle(["-c", script])
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["strict"]
    assert r["weights"]["tensors"] > 100 and r["weights"]["identical"] == r["weights"]["tensors"]
    assert r["weights"]["differ"] == [] and r["weights"]["checksums"]
