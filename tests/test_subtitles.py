"""Subtitles (.srt/.vtt) beside chapter and book files, timed from the assembled audio itself."""
from __future__ import annotations

import json
import re

import numpy as np
import soundfile as sf

from jobs.assemble import write_segment_audio
from jobs.book import assemble_job
from jobs.queue import Queue
from jobs.settings import JobSpec, Paths
from jobs.submit import submit_file
from jobs.subtitles import Cue, to_srt, to_vtt

SR = 24000
TEXT = """Chapter 1

Dr. Smith opened the door at 5 o'clock.

Then the second paragraph follows, with a second segment of text.

Chapter 2

The second chapter has a single paragraph of its own.
"""
STAMP = r"(\d\d):(\d\d):(\d\d)[,.](\d\d\d)"


def _seconds(m) -> float:
    h, mi, s, ms = map(int, m)
    return h * 3600 + mi * 60 + s + ms / 1000


def parse(text: str, vtt: bool) -> list[tuple[float, float, str]]:
    if vtt:
        assert text.startswith("WEBVTT\n\n")
    cues = []
    for block in text.strip().split("\n\n")[1 if vtt else 0:]:
        lines = block.split("\n")
        if not vtt:
            assert lines.pop(0) == str(len(cues) + 1)
        m = re.fullmatch(STAMP + " --> " + STAMP, lines[0])
        assert m, lines[0]
        cues.append((_seconds(m.groups()[:4]), _seconds(m.groups()[4:]), "\n".join(lines[1:])))
    return cues


def test_formats_render_times_and_keep_cues_intact():
    cues = [Cue(0.0, 1.2346, "One."), Cue(3725.5, 3726.0, "Two\n\nlines --> here")]
    srt, vtt = to_srt(cues), to_vtt(cues)
    assert "00:00:01,235" in srt and "01:02:05,500 --> 01:02:06,000" in srt
    assert "00:00:01.235" in vtt
    assert [c[2] for c in parse(srt, False)] == ["One.", "Two lines -> here"]
    assert len(parse(vtt, True)) == 2


def test_job_subtitles_match_the_assembled_audio(tmp_path):
    paths = Paths(tmp_path / "home").ensure()
    q = Queue(paths.db)
    src = tmp_path / "book.txt"
    src.write_text(TEXT)
    job_id, err = submit_file(q, paths, src, JobSpec(voice="vivian", language="english", format="wav", title="B"))
    assert err is None
    rows = q.claim("w", 100, 60)
    lengths = {}
    for r in rows:  # a steady tone per segment, each of another length
        n = SR // 4 + 1000 * r["idx"]
        lengths[r["idx"]] = n
        path = paths.audio / f"{r['idx']}.wav"
        write_segment_audio(path, (0.2 * np.sin(np.arange(n) * 0.05)).astype(np.float32), SR)
        q.complete(r["id"], f"k{r['idx']}", str(path), SR, n, r["seed"])
    assert assemble_job(q, paths, job_id) == "done"
    manifest = json.loads((paths.output / job_id / "manifest.json").read_text())
    book_path = manifest["output"]["book"]
    book = sf.read(book_path)[0]
    segs = [s for c in manifest["chapters"] for s in c["segments"]]
    cues = parse(open(book_path[:-4] + ".srt").read(), False)
    assert parse(open(book_path[:-4] + ".vtt").read(), True) == cues
    assert len(cues) == len(segs) == len(rows)
    assert [c[2] for c in cues] == [s["original"] for s in segs]  # as written, not normalized
    assert "Dr. Smith" in cues[1][2]
    pos = 0
    for (start, end, _), s in zip(cues, segs):
        assert abs(start - pos / SR) <= 0.0005 and abs(end - start - lengths[s["index"]] / SR) <= 0.001
        a, b = round(start * SR), round(end * SR)
        mid = book[a + 200: b - 200]
        assert np.abs(mid).min() < 0.05 < np.abs(mid).max()  # speech (the tone) inside the cue
        gap = book[b + 13: b + round(s["pause_after_ms"] * SR / 1000) - 13]  # cue times are whole ms
        assert gap.size and not gap.any(), "the pause after a cue is silence"
        pos += lengths[s["index"]] + round(SR * s["pause_after_ms"] / 1000)
    assert abs(len(book) - pos) == 0

    chapters = manifest["chapters"]
    assert manifest["chapter_list"] == [{"title": c["title"], "start_s": c["book_start_s"], "end_s": c["book_end_s"]}
                                        for c in chapters]
    assert manifest["chapter_list"][1]["start_s"] == round(manifest["chapter_list"][0]["end_s"], 3) > 0
    for c in chapters:  # chapter files: cues from 0, beside the chapter audio
        srt_path, vtt_path = c["subtitles"]
        assert srt_path == c["file"][:-4] + ".srt" and vtt_path.endswith(".vtt")
        ch_cues = parse(open(srt_path).read(), False)
        assert ch_cues[0][0] == 0.0 and len(ch_cues) == len(c["segments"])
        assert abs(ch_cues[-1][1] + c["book_start_s"] - cues[sum(len(x["segments"]) for x in chapters
                                                                  if x["index"] <= c["index"]) - 1][1]) <= 0.002
    assert manifest["output"]["subtitles"] == [book_path[:-4] + ".srt", book_path[:-4] + ".vtt"]
