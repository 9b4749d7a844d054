"""The narrated EPUBs the narration tests read: an EPUB, a Markdown and a plain text file narrated by the tiny
model through the command line (`submit --format epub --wait`), once per test session (tests/conftest.py's
`narrated` fixture)."""
from __future__ import annotations

import json
from pathlib import Path

from epub_util import make_epub

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "tests" / "data" / "tiny" / "cv_small"
MD = """# First Steps

A *short* note to start. It has **two** sentences, and a third one: here.

# Second Part

Another chapter & more words [voice=ryan]in another voice[/voice] for the end.
"""
TXT = """Chapter 1: The Beginning

It was a bright cold day in April, and the clocks were striking thirteen. Nobody looked up.

The second paragraph has two sentences. This is the second of them.

Chapter 2: The Middle

The train was late, and the platform was empty. Then, at last, it came.
"""


def engine_missing() -> str | None:
    if not (MODEL / "model.safetensors").is_file():
        return f"tiny checkpoint missing: {MODEL} (build it with tests/fixtures/build_fixtures.py)"
    return None


def narrate(tmp: Path) -> dict:
    """{suffix: (input, manifest, output folder)} of the three books narrated into `tmp`."""
    from click.testing import CliRunner

    from appliance.cli import cli

    book, notes, story = make_epub(tmp / "station.epub"), tmp / "notes.md", tmp / "story.txt"
    notes.write_text(MD)
    story.write_text(TXT)
    res = CliRunner().invoke(cli, ["submit", str(book), str(notes), str(story), "--format", "epub", "--voice",
                                   "vivian", "--language", "english", "--wait", "--no-guard", "--max-new-tokens", "4",
                                   "--model", str(MODEL), "--device", "cpu", "--json", "--home", str(tmp / "home")],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = {}
    for job in json.loads(res.stdout):
        assert job["state"] == "done", job
        manifest = json.loads((Path(job["output_dir"]) / "manifest.json").read_text())
        out[Path(job["file"]).suffix] = (Path(job["file"]), manifest, Path(job["output_dir"]))
    return out
