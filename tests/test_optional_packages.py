"""An optional package can never take down the plain install.

The test venv has the speed-ups (Triton, ONNX Runtime, ...) that a plain `./install.sh` does not bring, so
a module that needs one at import time passes every other test and fails for every user without it. Here
child processes run with such packages hidden (tests/hide_packages/sitecustomize.py: they look uninstalled,
also to the engine processes the children start): every module of the project imports, and `say` and
`daemon --check` work, with each optional package hidden on its own and with all of them hidden at once.

OPTIONAL lists the packages that some path of ours uses only where they are present; a test checks that
every import the code guards with `except ImportError` is listed, so a new optional import is hidden here
as soon as it is written.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import wave
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HIDE = Path(__file__).parent / "hide_packages"
PACKAGES = ("appliance", "audio", "engines", "jobs", "text")
CV = ROOT / "tests" / "data" / "tiny" / "cv_small"
# speed-ups and accelerator runtimes (not in a plain install), and the installed packages only one path needs
OPTIONAL = ("triton", "onnxruntime", "onnx", "tensorrt", "torch_npu",
            "psycopg", "pedalboard", "scipy", "soxr", "mutagen", "pypdf", "huggingface_hub")


def hidden_env(names) -> dict:
    env = {**os.environ, "TTS_APPLIANCE_HIDE": ",".join(names),
           "PYTHONPATH": os.pathsep.join([str(HIDE), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("TTS_APPLIANCE_SOCKET", None)
    return env


def run(names, *args, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=hidden_env(names), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def guarded_imports() -> set[str]:
    """Top-level names the project imports inside `try: ... except ImportError` (or a broader except)."""
    found = set()
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Try):
                    continue
                caught = {ast.unparse(h.type) if h.type else "" for h in node.handlers}
                if not caught & {"ImportError", "ModuleNotFoundError", "Exception", ""} and not any(
                        "ImportError" in c for c in caught):
                    continue
                for stmt in node.body:
                    for sub in ast.walk(stmt):
                        if isinstance(sub, ast.Import):
                            found |= {a.name.partition(".")[0] for a in sub.names}
                        elif isinstance(sub, ast.ImportFrom) and sub.level == 0 and sub.module:
                            found.add(sub.module.partition(".")[0])
    return found - set(PACKAGES) - set(sys.stdlib_module_names) - {"torch"}


def test_every_guarded_import_is_hidden_by_these_tests():
    missing = guarded_imports() - set(OPTIONAL)
    assert not missing, f"imports guarded as optional but not in OPTIONAL (add them): {sorted(missing)}"


def test_the_hiding_works():
    r = run(["json", "triton"], "-c", "import importlib.util, sys\n"
            "try:\n    import json\nexcept ModuleNotFoundError:\n    print('hidden')\n"
            "print(importlib.util.find_spec('triton'))")
    assert r.returncode == 0 and r.stdout.split() == ["hidden", "None"], r.stdout + r.stderr


IMPORT_ALL = f"""
import importlib, json, pkgutil, sys, traceback
failed = {{}}
count = 0
for pkg in {list(PACKAGES)!r}:
    mod = importlib.import_module(pkg)
    for info in pkgutil.walk_packages(mod.__path__, pkg + "."):
        count += 1
        try:
            importlib.import_module(info.name)
        except BaseException as exc:
            failed[info.name] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
print(json.dumps({{"count": count, "failed": failed}}))
"""


@pytest.mark.parametrize("names", [OPTIONAL], ids=["all-hidden"])
def test_every_module_imports_without_the_optional_packages(names):
    r = run(names, "-c", IMPORT_ALL)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["count"] > 100, out  # the walk really went through the project
    assert not out["failed"], "modules that need an optional package to import:\n" + "\n".join(
        f"  {k}: {v}" for k, v in out["failed"].items())


def check_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"model: {{path: {CV}, threads: 1}}\njobs: {{home: {tmp_path / 'home'}}}\n"
                   f"service: {{runtime_dir: {tmp_path / 'run'}}}\n", encoding="utf-8")
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize("names", [(n,) for n in OPTIONAL] + [OPTIONAL],
                         ids=[*OPTIONAL, "all-hidden"])
def test_say_and_daemon_check_without(names, tmp_path):
    cfg = check_config(tmp_path)
    r = run(names, "-m", "appliance.cli", "--config", str(cfg), "daemon", "--check", timeout=300)
    assert r.returncode == 0 and "config OK" in r.stdout, r.stdout + r.stderr
    out = tmp_path / "hi.wav"
    r = run(names, "-m", "appliance.cli", "--config", str(cfg), "say", "Hello there.", "--voice", "vivian",
            "--language", "english", "--max-frames", "6", "--seed", "1", "-o", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    with wave.open(str(out)) as w:
        assert w.getframerate() == 24000 and 0 < w.getnframes() <= 6 * 1920


def test_a_broken_engine_is_reported_by_check_and_info(tmp_path):
    """A module of the engine that cannot be imported (what a missing package did): `daemon --check` says so in
    one line with exit status 1 instead of 'config OK', and `info` reports the engines as broken."""
    cfg = check_config(tmp_path)
    broken = ["engines.runtime.layer_kernel"]
    r = run(broken, "-m", "appliance.cli", "--config", str(cfg), "daemon", "--check", timeout=300)
    assert r.returncode == 1 and "config OK" not in r.stdout, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "engines.runtime.layer_kernel" in lines[0] and "install.sh" in lines[0], r.stderr
    r = run(broken, "-m", "appliance.cli", "--config", str(cfg), "info", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    engines = json.loads(r.stdout)["engines"]
    assert "engine's code does not load" in engines["error"] and "layer_kernel" in engines["error"], engines
    r = run([], "-m", "appliance.cli", "--config", str(cfg), "info", "--json", timeout=300)
    assert isinstance(json.loads(r.stdout)["engines"], list), r.stdout  # the same without the break: engines
