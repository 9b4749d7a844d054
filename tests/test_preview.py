"""`tts-appliance preview` (chapters, sizes, estimates) and chapter selection at submit (`--chapters`,
the sidecar's and the API spec's `chapters`)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from appliance.cli import cli
from jobs.ingest import IngestOptions, load_document
from engines.model.text import CHARS_PER_S
from jobs.preview import measured_rate, select_chapters
from jobs.queue import Queue
from jobs.settings import JobSpec, Paths
from jobs.submit import document_chapters, submit_file

TINY = Path(__file__).parent / "data" / "tiny"

BOOK = """# The Start

First words of the first chapter. A second sentence follows here.

# The Middle

The middle chapter says a little more than the others, in two paragraphs.

Here is the second paragraph of the middle chapter.

# The End

The end comes quickly.
"""


@pytest.fixture()
def book(tmp_path):
    path = tmp_path / "book.md"
    path.write_text(BOOK)
    return path


def run(*args, env=None):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_preview_flags_voices_the_model_lacks(tmp_path):
    """[voice=...] tags naming a voice the configured checkpoint lacks are flagged (submit would refuse them)."""
    path = tmp_path / "tags.md"
    path.write_text(BOOK.replace("The middle chapter", "[voice=bob]The middle chapter").replace(
        "The end comes", "[voice=ryan]The end[/voice] [voice=bob]comes"))
    env = {"TTS_APPLIANCE_MODEL": str(TINY / "cv_small")}
    p = json.loads(run("preview", str(path), "--home", str(tmp_path / "home"), "--json", env=env).output)
    assert p["unknown_voices"] == {"bob": [2, 3]} and "ryan" in p["voices"]
    text = run("preview", str(path), "--home", str(tmp_path / "home"), env=env).output
    assert "unknown voice 'bob' in [voice=...] tags (chapter 2, 3): submit refuses it; available: dylan" in text
    clean = json.loads(run("preview", str(path), "--home", str(tmp_path / "home"), "--json",
                           env={"TTS_APPLIANCE_MODEL": None}).output)
    assert clean["unknown_voices"] == {} and clean["voices"] is None  # no model configured: not checked


def test_preview_lists_chapters_with_sizes_and_estimates(tmp_path, book):
    res = run("preview", str(book), "--chapters", "1,3", "--home", str(tmp_path / "home"), "--json")
    assert res.exit_code == 0, res.output
    p = json.loads(res.output)
    found = document_chapters(load_document(book, IngestOptions()), JobSpec(), select=False)
    assert [c["title"] for c in p["chapters"]] == ["The Start", "The Middle", "The End"]
    assert [c["number"] for c in p["chapters"]] == [1, 2, 3]
    assert [c["selected"] for c in p["chapters"]] == [True, False, True]
    for c, (_, segs) in zip(p["chapters"], found):
        assert c["segments"] == len(segs) and c["characters"] == sum(len(s.text) for s in segs)
        pauses = sum(s.pause_after_ms for s in segs) / 1000
        letters = sum(len(s.text.replace(" ", "")) for s in segs)
        assert c["audio_s"] == pytest.approx(letters / CHARS_PER_S + pauses, abs=0.06)
    t = p["total"]
    assert t["chapters"] == 2 and t["segments"] == p["chapters"][0]["segments"] + p["chapters"][2]["segments"]
    assert t["rate_source"] is None and t["synthesis_s"] is None  # nothing synthesized in this spool yet
    text = run("preview", str(book), "--home", str(tmp_path / "home")).output
    assert "The Middle" in text and "synthesis time: unknown" in text


def test_preview_uses_the_configured_rate_and_speed(tmp_path, book):
    env = {"TTS_APPLIANCE_JOBS__SYNTH_RATE": "4"}
    p1 = json.loads(run("preview", str(book), "--home", str(tmp_path), "--json", env=env).output)["total"]
    assert p1["rate_source"] == "configured" and p1["synthesis_s"] == pytest.approx(p1["audio_s"] / 4, abs=0.06)
    p2 = json.loads(run("preview", str(book), "--home", str(tmp_path), "--json", "--speed", "2", env=env).output)
    assert p2["total"]["audio_s"] == pytest.approx(p1["audio_s"] / 2, abs=0.2)
    assert "configured" in run("preview", str(book), "--home", str(tmp_path), env=env).output


def test_measured_rate_counts_overlapping_syntheses_once(tmp_path, location):
    """Measured from the queue's synthesis log, SQLite or PostgreSQL (jobs.queue), read only."""
    assert measured_rate(location) is None  # no queue yet: none is made
    with Queue.reading(location) as none:
        assert none is None
    q = Queue(location)
    assert measured_rate(location) is None
    ids = q.synth_started("w", [("k1", 1), ("k2", 2)])
    q.synth_finished(ids)
    with q.tx() as c:
        for key in ("k1", "k2"):  # 20 s of audio each, synthesized in [0, 10] and [5, 15]: 15 s busy
            c.execute("INSERT INTO audio_cache (key, path, sample_rate, samples) VALUES (?, 'x', 1000, 20000)", (key,))
        c.execute("UPDATE synth_log SET started_at = 100, finished_at = 110 WHERE key = 'k1'")
        c.execute("UPDATE synth_log SET started_at = 105, finished_at = 115 WHERE key = 'k2'")
    rate, audio = measured_rate(location)
    assert audio == 40 and rate == pytest.approx(40 / 15)
    q.close()
    res = run("preview", str(_write(tmp_path)), "--home", str(tmp_path), "--json",
              env={"TTS_APPLIANCE_JOBS__QUEUE": str(location)})
    t = json.loads(res.output)["total"]
    assert t["rate_source"] == "measured" and t["measured_audio_s"] == 40.0


def _write(tmp_path):
    path = tmp_path / "b.md"
    path.write_text(BOOK)
    return path


def test_selection_syntax_and_range():
    assert select_chapters("1,3-4", 5) == [0, 2, 3] and select_chapters(None, 2) == [0, 1]
    assert select_chapters("2, 1-2", 3) == [0, 1]
    for bad in ("x", "0", "3-1", "1,,2", "-2"):
        with pytest.raises(ValueError, match="chapter"):
            JobSpec(chapters=bad)
    with pytest.raises(ValueError, match="has 3 chapters"):
        select_chapters("2-4", 3)


def test_submit_chapters_from_cli_sidecar_and_api_spec(tmp_path, book):
    home = tmp_path / "home"
    res = run("submit", str(book), "--chapters", "1,3", "--home", str(home))
    assert res.exit_code == 0, res.output
    q = Queue(Paths(home).db)
    job_id = res.stdout.strip()  # stderr: the in-process note
    assert [c["title"] for c in q.chapters(job_id)] == ["The Start", "The End"]
    assert {s["chapter_idx"] for s in q.segments(job_id)} == {0, 1}

    res = CliRunner().invoke(cli, ["submit", str(book), "--chapters", "2-5", "--home", str(home)])
    assert res.exit_code == 1 and "names chapter 5, but the document has 3 chapters" in res.output
    res = CliRunner().invoke(cli, ["submit", str(book), "--chapters", "two", "--home", str(home)])
    assert res.exit_code == 1 and "bad chapter selection 'two'" in res.output
    assert len(q.jobs()) == 2  # the bad syntax queued nothing; the bad range is a failed job saying why

    paths = Paths(home)
    sidecar = JobSpec.from_dict(yaml.safe_load("voice: ryan\nchapters: 2\n"))  # YAML reads a number
    job_id, err = submit_file(q, paths, book, sidecar)
    assert err is None and [c["title"] for c in q.chapters(job_id)] == ["The Middle"]
    api = JobSpec.parse({"chapters": "3"})  # POST /v1/jobs spec
    job_id, err = submit_file(q, paths, book, api)
    assert err is None and [c["title"] for c in q.chapters(job_id)] == ["The End"]
    with pytest.raises(ValueError, match="bad chapter selection"):
        JobSpec.parse({"chapters": "1-"})
