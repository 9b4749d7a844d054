"""The README's commands stay true: the set-up commands are the ones .ci/run runs, the "Using it" commands run
as written (the tiny checkpoints for MODEL, MODEL_VD, MODEL_BASE, a bundled recording for me.wav), the
book commands work on a text file, install.sh's service and uninstall commands say what they would do, and
every option the README names exists on a command that takes it.

(The README's first command runs in .ci/run itself, on the plain install; the service commands in the live
systemd test; the clients' examples in tests/test_openai_clients.py and tests/test_live_ws.py.)
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import wave
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "data" / "tiny"
README = (ROOT / "README.md").read_text(encoding="utf-8")
INSTALL_FLAGS = {"--dev", "--model", "--dry-run", "--uninstall", "--systemd", "--no-systemd", "--no-restart"}
SYSTEMCTL_FLAGS = {"--now"}


def section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def indented_commands(text: str) -> list[str]:
    """The indented command lines of a README section, continuation lines joined, trailing comments dropped."""
    lines, out = [line[4:] for line in text.splitlines() if line.startswith("    ")], []
    joined = ""
    for line in lines:
        joined += line.rstrip()
        if joined.endswith("\\"):
            joined = joined[:-1] + " "
            continue
        out.append(re.sub(r"\s+# .*$", "", joined).strip())
        joined = ""
    return out


def test_ci_runs_the_two_set_up_commands():
    cmds = [c for c in indented_commands(section("Set-up (two commands)")) if c.startswith("./install.sh")]
    assert len(cmds) == 2 and " say " in cmds[0] and "pytest" in cmds[1], cmds
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'bash -c "$first"' in ci and 'bash -c "$tests"' in ci and "check_plain.py sample.wav" in ci


def run_cli(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TTS_APPLIANCE_SOCKET"}
    env["TTS_APPLIANCE_NO_DAEMON"] = "1"
    return subprocess.run([sys.executable, "-m", "appliance.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_the_using_it_commands_run_as_written(tmp_path):
    shutil.copy(TINY / "audio" / "ref_a_24k.wav", tmp_path / "me.wav")
    models = {"MODEL_BASE": TINY / "base_small", "MODEL_VD": TINY / "vd_proj", "MODEL": TINY / "cv_small"}
    cmds = indented_commands(section("Using it"))
    assert len(cmds) == 4 and all(c.startswith("tts-appliance say ") for c in cmds), cmds
    for cmd in cmds:
        args = shlex.split(cmd)[1:]
        args = [str(models.get(a, a)) for a in args]
        r = run_cli([*args, "--max-frames", "4", "--seed", "1"], tmp_path)
        assert r.returncode == 0, f"{cmd}\n{r.stdout}{r.stderr}"
        out = tmp_path / args[args.index("-o") + 1]
        with wave.open(str(out)) as w:
            assert w.getframerate() == 24000 and w.getnframes() > 0, cmd
    assert (tmp_path / "me.voice").is_file()


@pytest.mark.slow
def test_the_book_commands_work_on_a_document(tmp_path):
    book = tmp_path / "book.md"
    book.write_text("# One\n\nThe first chapter is short.\n\n# Two\n\nSo is the second one.\n", encoding="utf-8")
    home = tmp_path / "home"
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"model: {{path: {TINY / 'cv_small'}, threads: 1}}\njobs: {{home: {home}, guard: false}}\n")
    r = run_cli(["--config", str(cfg), "preview", str(book)], tmp_path)
    assert r.returncode == 0 and "One" in r.stdout and "Two" in r.stdout, r.stdout + r.stderr
    r = run_cli(["--config", str(cfg), "submit", str(book), "--voice", "ryan", "--format", "wav", "--chapters", "2",
                 "--speed", "1.2", "--max-new-tokens", "4", "--wait", "--json"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    for args in (["status"], ["logs"]):
        job = re.search(r'"job_id": "([^"]+)"', r.stdout).group(1)
        s = run_cli(["--config", str(cfg), *args, job], tmp_path)
        assert s.returncode == 0, s.stdout + s.stderr
    assert "done" in run_cli(["--config", str(cfg), "list"], tmp_path).stdout
    r = run_cli(["--config", str(cfg), "info"], tmp_path)
    assert r.returncode == 0 and "engines" in r.stdout and "error" not in r.stdout.split("engines", 1)[1][:200], r.stdout
    assert "jobs.keep_work_days" in r.stdout.split("\ndisk\n", 1)[1], r.stdout  # the spool folder's disk
    r = run_cli(["--config", str(cfg), "prune", "--json"], tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["jobs"] == [], r.stdout + r.stderr  # ended just now: kept
    assert (home / "output" / job).is_dir()
    r = run_cli(["--config", str(cfg), "delete", job, "--json"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["id"] == job and out["deleted"] is True and out["freed_bytes"] > 0 and not (home / "output" / job).exists()


def test_the_service_commands_say_what_they_would_do(tmp_path):
    env = {**os.environ, "TTS_APPLIANCE_INSTALL_MODE": "system"}
    r = subprocess.run([str(ROOT / "install.sh"), "--dry-run"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "systemd: the service" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([str(ROOT / "install.sh"), "--uninstall", "--dry-run"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "would remove the units" in r.stdout, r.stdout + r.stderr


def test_every_option_the_readme_names_exists():
    from appliance.cli import cli

    options = {opt for cmd in cli.commands.values() for p in cmd.params for opt in p.opts}
    options |= {opt for p in cli.params for opt in p.opts}
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", README))
    unknown = sorted(named - options - INSTALL_FLAGS - SYSTEMCTL_FLAGS)
    assert not unknown, f"README.md names options no command has: {unknown}"
    install = (ROOT / "install.sh").read_text()
    assert all(f in install for f in INSTALL_FLAGS)
