"""benchmarks/daemon_book.py --text: a real text as the book, segmented by the daemon as a submit is, its segment
lengths reported from the project's own segmenter; one short run against the real daemon on the tiny checkpoint."""
from __future__ import annotations

import json
import subprocess

from tests.daemon_util import CV, needs_daemon

TEXT = """The Lighthouse

Chapter One

The keeper climbed the stairs at dusk, as he had done every evening for thirty years. The lamp was cold; the
glass was clean. He struck a match, and the wick took the flame without complaint.

Below him the sea moved in long grey ridges. A ship, far out, showed a single light, then two.

Chapter Two

In the morning the fog came in, thick and white, and the keeper rang the bell until his arms ached. Nobody
answered. Nobody ever did, and that, he thought, was rather the point of a bell.
"""


@needs_daemon
def test_a_text_book_through_the_daemon_reports_the_segmenters_lengths(tmp_path):
    """The text (a plain-text file made by pandoc from Markdown, as people convert their notes) goes in whole; the
    daemon's job has exactly the segments the local segmenter counts, every one done, and their character
    lengths are reported."""
    from benchmarks.daemon_book import main

    md = tmp_path / "book.md"
    md.write_text(TEXT.replace("Chapter One", "# Chapter One").replace("Chapter Two", "# Chapter Two"))
    txt = tmp_path / "book.txt"
    subprocess.run(["pandoc", "-f", "markdown", "-t", "plain", "-o", str(txt), str(md)], check=True, timeout=60)
    out = tmp_path / "book.json"
    code = main(["--model", str(CV), "--fixed-length", "--device", "cpu", "--slots", "4", "--frames", "4",
                 "--text", str(txt), "--config-extra", "model.threads=1", "--timeout", "300", "--json", str(out)])
    res = json.loads(out.read_text())
    assert code == 0, res.get("error")
    work = res["workload"]
    [level] = res["levels"]
    assert level["state"] == "done" and level["segments"] == level["segments_done"] == work["segments"] >= 5
    chars = work["segment_chars"]
    assert 0 < chars["min"] <= chars["median"] <= chars["max"] <= 300
    assert 0 < work["segment_expected_s"]["min"] <= work["segment_expected_s"]["max"]
    assert level["audio_s"] == work["segments"] * 4 * 0.08


def test_distinct_copies_repeat_no_segment_but_the_headings(tmp_path):
    """--copies N: N copies of the text, the k-th with its number after every 8th word, so the daemon's audio cache
    (same text, voice and seed) cannot serve one copy's segments to another; only the headings repeat."""
    from collections import Counter

    from benchmarks.daemon_book import distinct_copies, text_workload

    path = tmp_path / "book.txt"
    path.write_text(distinct_copies(TEXT, 5), encoding="utf-8")
    _, stats = text_workload(str(path))
    from jobs.ingest import load_document
    from jobs.settings import JobSpec
    from jobs.submit import document_chapters

    segs = [s.text for _, ss in document_chapters(load_document(str(path)), JobSpec(language="english"),
                                                  select=False) for s in ss]
    repeated = {t for t, n in Counter(segs).items() if n > 1}
    assert stats["segments"] == len(segs) and len(segs) >= 5 * 4
    assert repeated and all(t.lower().startswith("chapter") for t in repeated)
    assert distinct_copies(TEXT, 1).split() == TEXT.split()  # one copy: the text itself
