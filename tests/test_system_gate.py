"""The live systemd test cannot pass by skipping: the container's systemd is waited for until its bus
answers (a state other than running/degraded is a failure), and with $TTS_APPLIANCE_REQUIRE_SYSTEM_TESTS
set (as .ci/run does) a skipped `system`, `browser` or `converters` test fails the run; so does a skipped `oracle` test
with $TTS_APPLIANCE_REQUIRE_ORACLE_TESTS set."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import nspawn_util
from nspawn_util import BootFailed, Container

TESTS = Path(__file__).resolve().parent


def _container(answers: list[tuple[str, str]]) -> tuple[Container, list]:
    """A Container that was never booted, whose `systemctl is-system-running` gives `answers` in turn."""
    c = Container(Path("/nonexistent-root"), [], boot_timeout=5)
    calls = []

    def run(*argv, check=True, timeout=60, **kw):
        calls.append(argv)
        out, err = answers[min(len(calls), len(answers)) - 1]
        return subprocess.CompletedProcess(argv, 1, out, err)

    c.run, c._check_alive = run, lambda: None
    return c, calls


def test_systemd_is_asked_again_until_its_bus_answers():
    c, calls = _container([("", "Failed to connect to bus: No such file or directory"), ("offline\n", ""),
                           ("degraded\n", "")])
    assert c.wait_for_systemd(time.monotonic() + 30) == "degraded"
    assert len(calls) == 3 and calls[0] == ("systemctl", "is-system-running", "--wait")


def test_a_container_whose_systemd_fails_is_a_failure_not_a_skip(monkeypatch):
    c, _ = _container([("maintenance\n", "")])
    with pytest.raises(BootFailed, match="'maintenance'"):
        c.wait_for_systemd(time.monotonic() + 30)
    assert not issubclass(BootFailed, nspawn_util.Unavailable)  # the live test skips only on Unavailable
    c, calls = _container([("", "Failed to connect to bus")])
    clock = [1000.0]  # its clock moves only by its own sleeps: asked at 0, 0.2 and 0.4 s, however busy the machine
    monkeypatch.setattr(nspawn_util, "time", SimpleNamespace(monotonic=lambda: clock[0],
                                                             sleep=lambda s: clock.__setitem__(0, clock[0] + s)))
    with pytest.raises(BootFailed, match="did not answer"):
        c.wait_for_systemd(clock[0] + 0.5)
    assert len(calls) == 3


GATED = """
import pytest

@pytest.mark.system
def test_needs_systemd():
    pytest.skip("no systemd-nspawn here")

@pytest.mark.browser
def test_needs_chromium():
    pytest.skip("chromium not found")

@pytest.mark.converters
def test_needs_calibre():
    pytest.skip("calibre is not installed here")

@pytest.mark.oracle
def test_needs_the_oracle():
    pytest.skip("qwen_tts not importable")

def test_other_skip():
    pytest.skip("not a system test")
"""
SYSTEM, ORACLE = "TTS_APPLIANCE_REQUIRE_SYSTEM_TESTS", "TTS_APPLIANCE_REQUIRE_ORACLE_TESTS"


@pytest.mark.parametrize("required", [{}, {SYSTEM: "0", ORACLE: ""}, {SYSTEM: "1"}, {ORACLE: "1"}],
                         ids=["unset", "off", "system", "oracle"])
def test_a_skipped_system_or_oracle_test_fails_where_they_are_required(tmp_path, required):
    (tmp_path / "test_gated.py").write_text(GATED)
    env = {**os.environ, "PYTHONPATH": str(TESTS), SYSTEM: "", ORACLE: "", **required}  # not CI's settings
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                        "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_gated.py")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    if required.get(SYSTEM) == "1":  # the live systemd test and the page's browser test
        assert r.returncode == 1, r.stdout + r.stderr
        assert "3 failed, 2 skipped" in r.stdout and "must run here, but it skipped: no systemd-nspawn here" in r.stdout
        assert f"{SYSTEM}=1: this browser test must run here, but it skipped: chromium not found" in r.stdout
        assert "apt-get install chromium chromium-driver" in r.stdout
        assert f"{SYSTEM}=1: this converters test must run here, but it skipped: calibre is not" in r.stdout
        assert "apt-get install pandoc calibre" in r.stdout
    elif required.get(ORACLE) == "1":
        assert r.returncode == 1, r.stdout + r.stderr
        assert "1 failed, 4 skipped" in r.stdout
        assert f"{ORACLE}=1: this oracle test must run here, but it skipped: qwen_tts not importable" in r.stdout
        assert "tests/fixtures/oracle_venv.sh" in r.stdout
    else:
        assert r.returncode == 0 and "5 skipped" in r.stdout, r.stdout + r.stderr
