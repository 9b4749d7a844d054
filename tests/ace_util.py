"""Ace by DAISY (the EPUB accessibility checker) for the narrated-EPUB tests: where it is (.ace/ of the checkout,
installed by tests/fixtures/ace_install.sh, which ./install.sh --dev runs; else `ace` on PATH), running it in
Debian's chromium, and reading its report."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCAL = ROOT / ".ace" / "node_modules" / ".bin" / "ace-cli"


def _command() -> str | None:
    return str(LOCAL) if LOCAL.is_file() else shutil.which("ace")


def ace_missing() -> str | None:
    """Why Ace cannot run here, or None."""
    if _command() is None:
        return ("Ace by DAISY is not installed (tests/fixtures/ace_install.sh installs it into .ace/ with npm; "
                "./install.sh --dev runs it)")
    if not shutil.which("chromium"):
        return "Ace runs in chromium, which is not installed (apt-get install chromium)"
    return None


def ace(path: Path, out: Path) -> dict:
    """Run Ace on the EPUB at `path` (its report into the folder `out`) -> the report (report.json)."""
    env = {**os.environ, "PUPPETEER_EXECUTABLE_PATH": shutil.which("chromium"), "PUPPETEER_SKIP_DOWNLOAD": "1"}
    run = subprocess.run([_command(), "--force", "--silent", "--outdir", str(out), str(path)], env=env,
                         capture_output=True, text=True, timeout=600)
    report = out / "report.json"
    assert run.returncode == 0 and report.is_file(), f"ace failed ({run.returncode}): {run.stdout}{run.stderr}"
    return json.loads(report.read_text(encoding="utf-8"))


def failures(report: dict) -> list[tuple[str, str, str, str]]:
    """Every assertion Ace failed: (file, rule, impact, the element or what it says)."""
    out = []
    for doc in report["assertions"]:
        for a in doc.get("assertions", []):
            if a["earl:result"]["earl:outcome"] == "fail":
                test = a["earl:test"]
                out.append((doc["earl:testSubject"]["url"], test["dct:title"], test["earl:impact"],
                            a["earl:result"].get("html") or a["earl:result"].get("dct:description", "")))
    return out
