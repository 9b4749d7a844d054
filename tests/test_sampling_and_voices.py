"""One sampling type whose defaults come from the checkpoint, and voices resolved once.

- A checkpoint whose generation_config.json differs from the official constants is sampled by ITS
  values (a greedy config gives the greedy codes without any request settings).
- A job with reference audio clones the voice once for all its segments; a saved voice is read once
  per file version.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from engines.api import SamplingParams, SynthesisRequest
from engines.engine import TTSEngine
from engines.model.sampling import OFFICIAL_DEFAULTS
from engines.runtime.runner import EngineRunner

TINY = Path(__file__).resolve().parent / "data" / "tiny"
CV, BASE = TINY / "cv_small", TINY / "base_small"
REF = TINY / "audio" / "ref_a_24k.wav"


def _copy_with_generation_config(tmp: Path, **gen) -> Path:
    dst = tmp / "cv_custom_gen"
    shutil.copytree(CV, dst)
    (dst / "generation_config.json").write_text(json.dumps(gen), encoding="utf-8")
    return dst


def test_defaults_come_from_generation_config(tmp_path):
    model = _copy_with_generation_config(tmp_path, do_sample=True, temperature=0.5, top_k=7, top_p=0.8,
                                         repetition_penalty=1.3, subtalker_temperature=0.6, subtalker_top_k=9,
                                         max_new_tokens=40)
    eng = TTSEngine.load(model)
    d = eng.defaults
    assert (d.temperature, d.top_k, d.top_p, d.repetition_penalty) == (0.5, 7, 0.8, 1.3)
    assert (d.subtalker_temperature, d.subtalker_top_k, d.max_new_tokens) == (0.6, 9, 40)
    # keys the file lacks keep the official values
    assert d.subtalker_top_p == OFFICIAL_DEFAULTS.subtalker_top_p and d.min_new_tokens == OFFICIAL_DEFAULTS.min_new_tokens
    assert d != OFFICIAL_DEFAULTS
    r = eng.sampling(SamplingParams(seed=1), "Hello there.")
    assert (r.temperature, r.top_k, r.repetition_penalty, r.seed) == (0.5, 7, 1.3, 1)
    assert r.max_new_tokens <= 40  # the checkpoint's cap (and the runaway limit for the text)
    # the request's own settings win over the checkpoint's
    assert eng.sampling(SamplingParams(temperature=0.2, top_k=3), "Hi.").temperature == 0.2


def test_greedy_generation_config_decodes_greedily(tmp_path):
    """A checkpoint that ships do_sample=false is decoded greedily by default (the constants would sample)."""
    model = _copy_with_generation_config(tmp_path, do_sample=False, subtalker_dosample=False, max_new_tokens=13)
    text = dict(text="Greedy by configuration.", voice="vivian", language="english")
    custom = EngineRunner(TTSEngine.load(model), max_slots=1, max_context=256)
    [by_file] = custom.synthesize([SynthesisRequest(**text, sampling=SamplingParams(seed=5))])
    reference = TTSEngine.load(CV)
    [(greedy, _)] = reference.generate_codes([SynthesisRequest(**text, sampling=SamplingParams.greedy(
        max_new_tokens=13, seed=99))])
    [(sampled, _)] = reference.generate_codes([SynthesisRequest(**text, sampling=SamplingParams(
        max_new_tokens=13, seed=5))])
    assert by_file.codes.tolist() == greedy.codes.tolist()
    assert sampled.codes.tolist() != greedy.codes.tolist()  # the official defaults would have sampled


def test_saved_voice_is_read_once_per_file_version(tmp_path, monkeypatch):
    from engines.model import voice as voice_mod

    eng = TTSEngine.load(BASE, voices_dir=tmp_path)
    eng.make_voice(REF, "A reference sentence.").save(tmp_path / "me.voice")
    loads = []
    real = voice_mod.ClonedVoice.load
    monkeypatch.setattr(voice_mod.ClonedVoice, "load", staticmethod(lambda p: loads.append(p) or real(p)))
    req = SynthesisRequest(text="Again.", voice="me", sampling=SamplingParams.greedy(max_new_tokens=3, seed=0))
    for _ in range(3):
        eng.resolve(req)
    assert len(loads) == 1
    eng.make_voice(REF).save(tmp_path / "me.voice")  # a new version of the file is read again
    st = (tmp_path / "me.voice").stat()
    os.utime(tmp_path / "me.voice", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    eng.resolve(req)
    assert len(loads) == 2


def test_voice_object_is_used_as_given():
    eng = TTSEngine.load(BASE)
    voice = eng.make_voice(REF, "A reference sentence.")
    spec, ref = eng.resolve(SynthesisRequest(text="Hi.", voice=voice))
    assert spec.speaker_embedding is voice.spk_embedding and ref is voice.ref_codes


def test_job_with_reference_audio_clones_once(tmp_path, monkeypatch):
    from jobs.document import Chapter, Document
    from jobs.guard import GuardSettings
    from jobs.queue import Queue
    from jobs.settings import JobSpec, resolve_home
    from jobs.submit import submit_document
    from jobs.worker import Worker

    paths = resolve_home(tmp_path / "home").ensure()
    queue = Queue(paths.db)
    eng = TTSEngine.load(BASE)
    clones = []
    real = eng.make_voice
    monkeypatch.setattr(eng, "make_voice", lambda *a, **k: clones.append(a) or real(*a, **k))
    doc = Document(chapters=[Chapter("One", [f"Sentence number {i} is here." for i in range(5)])], title="Cloned")
    spec = JobSpec(ref_audio=str(REF), ref_text="A reference sentence.", language="english", format="wav",
                   sampling={"max_new_tokens": 3})
    job = submit_document(queue, paths, doc, spec)
    worker = Worker(queue, EngineRunner(eng, max_slots=2, max_context=256), paths, batch_size=2,
                    guard=GuardSettings(enabled=False))
    try:
        while worker.run_once():
            pass
    finally:
        worker.close()
    assert queue.job(job)["state"] == "done"
    counts = queue.counts(job)
    assert counts["done"] == sum(counts.values()) >= 5
    assert len(clones) == 1  # once for the job, not once per segment


def test_job_with_unreadable_reference_audio_fails_as_a_whole(tmp_path):
    from jobs.document import Chapter, Document
    from jobs.guard import GuardSettings
    from jobs.queue import Queue
    from jobs.settings import JobSpec, resolve_home
    from jobs.submit import submit_document
    from jobs.worker import Worker

    paths = resolve_home(tmp_path / "home").ensure()
    queue = Queue(paths.db)
    bad = tmp_path / "not_audio.wav"
    bad.write_bytes(b"this is not audio")
    doc = Document(chapters=[Chapter("One", ["First sentence here.", "Second sentence here."])], title="Bad ref")
    job = submit_document(queue, paths, doc, JobSpec(ref_audio=str(bad), format="wav"))
    worker = Worker(queue, EngineRunner(TTSEngine.load(BASE), max_slots=2, max_context=256), paths,
                    guard=GuardSettings(enabled=False))
    try:
        while worker.run_once():
            pass
    finally:
        worker.close()
    j = queue.job(job)
    assert j["state"] == "failed" and "reference audio" in j["error"]
