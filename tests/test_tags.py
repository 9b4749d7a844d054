"""Voices per passage ([voice=NAME]...[/voice], chapter_voices) and [pause=S] tags: taken out of the text,
carried on the segments, checked at submit, and spoken by the engine with the voice they name."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from jobs.document import Chapter, Document
from jobs.queue import Queue
from jobs.segment import SegmentOptions, segment_document
from jobs.settings import JobSpec, Paths
from jobs.submit import submit_file
from text.tags import TagError, TagState, split_tags

MODEL = Path(__file__).resolve().parents[1] / "tests" / "data" / "tiny" / "cv_small"
VOICES = ["dylan", "eric", "ryan", "vivian"]
OPTS = SegmentOptions(speak_chapter_titles=False)


def test_split_tags_pieces_and_state():
    state = TagState()
    pieces = split_tags("Plain start. [Voice = ryan]Ryan talks.[pause=1.5] Still ryan. [/voice]Back.", state)
    assert [(p.text.strip(), p.voice, p.pause_ms) for p in pieces] == [
        ("Plain start.", None, None), ("Ryan talks.", "ryan", 1500), ("Still ryan.", "ryan", None),
        ("Back.", None, None)]
    split_tags("[voice=eric]Open across paragraphs", state)
    assert state.voice == "eric" and split_tags("next one", state)[0].voice == "eric"
    assert split_tags("[pause=0.5][pause=0.25s]After.", TagState())[0].pause_ms == 750
    assert split_tags("A note [1] and [sic] stay.", TagState())[0].text == "A note [1] and [sic] stay."
    for bad, msg in (("[pause=soon]", "seconds"), ("[pause=99]", "seconds"), ("[voice=]x", "name the voice"),
                     ("text[/voice]", "closes no")):
        with pytest.raises(TagError, match=msg):
            split_tags(bad, TagState())


def test_segments_carry_voices_and_pauses_never_tags():
    doc = Document([Chapter("One", ["Narrator speaks first. [voice=ryan]Ryan answers here.[/voice] Narrator again.",
                                    "[pause=2]A new paragraph after a long pause. [voice=vivian]Vivian",
                                    "still speaks here.[pause=0.3]"]),
                    Chapter("Two", ["Vivian goes on.[/voice] The narrator ends."])])
    chapters = segment_document(doc, "en", OPTS)
    segs = [s for ch in chapters for s in ch]
    assert all("[" not in s.text and "[" not in s.original for s in segs)
    got = [(s.original, s.metadata.get("voice"), s.pause_after_ms) for s in segs]
    assert got == [
        ("Narrator speaks first.", None, OPTS.sentence_pause_ms),
        ("Ryan answers here.", "ryan", OPTS.sentence_pause_ms),
        ("Narrator again.", None, 2000),  # the tag's pause replaces the paragraph pause
        ("A new paragraph after a long pause.", None, OPTS.sentence_pause_ms),
        ("Vivian", "vivian", OPTS.paragraph_pause_ms),
        ("still speaks here.", "vivian", OPTS.chapter_pause_ms),  # 0.3 s, then the chapter ends
        ("Vivian goes on.", "vivian", OPTS.sentence_pause_ms),
        ("The narrator ends.", None, OPTS.chapter_pause_ms)]


def _book(tmp_path, text):
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = tmp_path / "book.md"
    src.write_text(text)
    paths = Paths(tmp_path / "home").ensure()
    return paths, Queue(paths.db), src


BOOK = """# First

The narrator begins. [voice=eric]Eric has a line.[/voice]

# Second

The second chapter is read by its own voice.

# Third

Back to the narrator. [voice=ryan]Ryan closes.[/voice]
"""


def test_submit_checks_voices_and_applies_chapter_voices(tmp_path):
    paths, q, src = _book(tmp_path, BOOK)
    spec = JobSpec.from_dict(yaml.safe_load("voice: vivian\nchapter_voices: {2: dylan, 3: dylan}\n"))
    job_id, err = submit_file(q, paths, src, spec, VOICES)
    assert err is None
    voices = [(s["chapter_idx"], json.loads(s["metadata"]).get("voice")) for s in q.segments(job_id)]
    assert (0, "eric") in voices and (0, None) in voices  # chapter 1: the job's voice and the tag
    assert {v for c, v in voices if c == 1} == {"dylan"}
    assert (2, "ryan") in voices and (2, "dylan") in voices  # the inline tag wins over the chapter voice

    bad = BOOK.replace("voice=ryan", "voice=bob")
    paths, q, src = _book(tmp_path / "b", bad)
    job_id, err = submit_file(q, paths, src, JobSpec(voice="vivian"), VOICES)
    assert "unknown voice 'bob'" in err and "available: dylan, eric, ryan, vivian" in err
    assert q.job(job_id)["state"] == "failed" and q.segments(job_id) == []  # before any synthesis
    job_id, err = submit_file(q, paths, src, JobSpec(voice="vivian", chapter_voices={"1": "nobody"}), VOICES)
    assert "unknown voice 'bob'" in err  # sorted: bob is named first
    paths, q, src = _book(tmp_path / "c", "Text [pause=x] here.")
    job_id, err = submit_file(q, paths, src, JobSpec(), VOICES)
    assert "bad tag '[pause=x]'" in err


@pytest.mark.skipif(not (MODEL / "model.safetensors").is_file(), reason="tiny checkpoint missing")
def test_tagged_segments_are_spoken_with_their_voice(tmp_path):
    """The real tiny engine: the same words with the same seed differ only by the tag's voice."""
    from engines.engine import TTSEngine
    from engines.runtime.runner import EngineRunner

    text = "# One\n\nSame words here.\n\n[voice=eric]Same words here.[/voice]\n\n[voice=ryan]Same words here.\n"
    paths, q, src = _book(tmp_path, text)
    spec = JobSpec(voice="ryan", language="english", format="wav", sampling={"max_new_tokens": 6})
    job_id, err = submit_file(q, paths, src, spec, VOICES)
    assert err is None
    _work_through(q, EngineRunner(TTSEngine.load(MODEL), max_slots=4, max_context=256), paths, job_id, 8)
    rows = [s for s in q.segments(job_id) if s["original"] == "Same words here."]
    assert len(rows) == 3
    audio = [np.asarray(__import__("soundfile").read(r["audio_path"])[0]) for r in rows]
    assert rows[0]["key"] == rows[2]["key"]  # job voice ryan == tagged ryan: one synthesis, shared
    assert rows[1]["key"] != rows[0]["key"]
    assert not (audio[1].shape == audio[0].shape and np.allclose(audio[1], audio[0]))


def _no_guard():
    from jobs.guard import GuardSettings

    return GuardSettings(enabled=False)


def _work_through(q, engine, paths, job_id: str, batch_size: int) -> None:
    """A worker on `engine` (no guard) until the job ends; it must end done."""
    from jobs.worker import Worker

    worker = Worker(q, engine, paths, batch_size=batch_size, guard=_no_guard())
    try:
        while q.job(job_id)["state"] not in ("done", "partial", "failed"):
            worker.run_once()
    finally:
        worker.close()
    assert q.job(job_id)["state"] == "done", q.job(job_id)["error"]


class VoiceRecorder:
    """Engine double that records the voice each request names (batch mode, or fed continuously
    through `submit` when `running`: jobs.worker.Synthesizer); 0.5 s of tone per request."""

    sample_rate = 24000
    voices = VOICES
    languages = ["english"]
    model_id = "voice-recorder"

    def __init__(self, running: bool):
        self.running = running
        self.spoken: list[tuple[str, str]] = []

    def synthesize(self, requests):
        from engines.api import SynthesisResult

        out = []
        for r in requests:
            self.spoken.append((r.text, r.voice))
            audio = (0.3 * np.sin(np.arange(self.sample_rate // 2) * 0.05)).astype(np.float32)
            out.append(SynthesisResult(audio, self.sample_rate, np.zeros((1, 16), np.int64), True))
        return out

    def submit(self, request, priority):
        result = self.synthesize([request])[0]

        class Handle:
            done, on_done = True, None

            def result(self):
                return result

        return Handle()


@pytest.mark.parametrize("running", [False, True], ids=["batches", "fed"])
def test_worker_parses_each_segments_metadata_once(tmp_path, monkeypatch, running):
    """A segment's metadata (its tag or chapter voice) is read once per claim, for its audio key and
    its request alike; the voices spoken stay those of the tags, chapters and job."""
    import jobs.requests
    from collections import Counter

    paths, q, src = _book(tmp_path, BOOK)
    spec = JobSpec(voice="ryan", chapter_voices={"2": "dylan"}, format="wav", sampling={"max_new_tokens": 6})
    job_id, err = submit_file(q, paths, src, spec, VOICES)
    assert err is None
    segments = q.segments(job_id)
    metadata = Counter(s["metadata"] for s in segments)

    parsed: Counter = Counter()

    class CountingJson:  # the json module that reads claimed segment rows (jobs.requests), counting what it parses
        def __getattr__(self, name):
            return getattr(json, name)

        def loads(self, s, *a, **kw):
            parsed[s] += 1
            return json.loads(s, *a, **kw)

    monkeypatch.setattr(jobs.requests, "json", CountingJson())
    engine = VoiceRecorder(running)
    _work_through(q, engine, paths, job_id, 16)
    assert {m: parsed[m] for m in metadata} == dict(metadata)  # once per segment, not again for its request
    voices = dict(engine.spoken)
    assert voices["Eric has a line."] == "eric" and voices["The narrator begins."] == "ryan"
    assert voices["The second chapter is read by its own voice."] == "dylan"
    assert voices["Back to the narrator."] == "ryan" and voices["Ryan closes."] == "ryan"
    assert len(engine.spoken) == len({s["key"] for s in q.segments(job_id)})  # one synthesis per audio key
