"""Only codes in the codebook's range reach the codec: a codec lane decodes each row's valid frames and masks
the rest of its window (bucket padding, idle rows on the scratch row, a reused row's old frames), which hold
whatever the decode step wrote there, EOS included. EOS and the other control ids lie past the codebook in
every checkpoint (real: 2150 vs 2048 codes; tiny: 358 vs 256), so an unmasked read used to end `say` with
`IndexError: index out of range in self` (on a GPU: a device assert that ends the engine). The lane itself over
each backend: tests/test_codec_backends.py. The debug guard of the codebook lookup ($TTS_APPLIANCE_CHECK_CODES,
on in the tests) names such codes."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from engines.engine import TTSEngine
from engines.codec import decoder as codec_decoder
from engines.codec.backend_torch import TorchCodec
from engines.runtime.runner import EngineRunner
from test_runtime import TINY, reference, requests

pytestmark = pytest.mark.usefixtures("one_thread")


def eos_checkpoint(dst: Path, like: int = 124, scale: float = 1.5) -> Path:
    """A copy of cv_small whose talker says EOS wherever it would have said code `like` (its EOS row of the
    codec head = `scale` x that code's row): greedy requests end by EOS after a few frames, at lengths that
    differ per text, and EOS stays the best id on the step after it (the repetition penalty is 1.05)."""
    from safetensors.torch import load_file, save_file

    from engines.model.config import ModelConfig

    shutil.copytree(TINY / "cv_small", dst, symlinks=False)
    eos = ModelConfig.from_dir(dst).talker.codec_eos_token_id
    weights = load_file(dst / "model.safetensors")
    head = weights["talker.codec_head.weight"].clone()
    head[eos] = head[like] * scale
    weights["talker.codec_head.weight"] = head
    save_file(weights, dst / "model.safetensors")
    return dst


@pytest.fixture(scope="module")
def eos_model(tmp_path_factory) -> Path:
    return eos_checkpoint(tmp_path_factory.mktemp("ckpt") / "cv_eos")


def same(results, ref) -> None:
    for res, (codes, wav) in zip(results, ref):
        assert np.array_equal(res.codes, codes)
        assert res.audio.shape == wav.shape and np.abs(res.audio - wav).max() < 1e-4


def test_the_fixture_ends_by_eos_past_the_codebook(eos_model):
    eng = TTSEngine.load(eos_model, device="cpu")
    assert eng.cfg.talker.codec_eos_token_id >= eng.decoder.config.codebook_size
    lengths = {len(g.codes) for g, _ in eng.generate_codes(requests(5, frames=16)) if g.finished_by_eos}
    assert len(lengths) >= 2, lengths  # several requests end by EOS, at different lengths


@pytest.mark.parametrize("overlap", [False, True])
def test_runner_batch_single_batch_with_eos_equals_reference(eos_model, overlap):
    """A batch of 3, then one request, then a batch of 3 (rows reused, padding and idle rows read) through
    the runner, streams and batch work: the reference codes and audio (it used to raise IndexError)."""
    eng = TTSEngine.load(eos_model, device="cpu")
    reqs = requests(5, frames=16)
    runner = EngineRunner(eng, max_slots=4, max_context=256, overlap=overlap)
    for group, priority in ((reqs[:3], 1), (reqs[3:4], 0), (reqs[1:4], 1), (reqs[4:], 0), (reqs[:3], 0)):
        same(runner.synthesize(group, priority=priority), reference(eng, group))


def test_two_cpu_engines_batch_single_batch(eos_model):
    """model.device `cpu,cpu`: two engines, their loops in threads, batch and single requests spread over
    both: every request gets the reference audio (one used to end with 'internal engine error')."""
    from appliance.config import Config
    from appliance.engine_host import STREAM_PRIORITY, load_runner
    from appliance.engine_pool import EnginePool
    from engines.runtime.stream import collect

    cfg = Config()
    cfg.model.path, cfg.runtime.max_slots = str(eos_model), "3"
    cfg.runtime.codec_dtype = "model"  # the reference's fp32 audio to 1e-4 (a bf16 codec, auto on some CPUs, is not)
    cfg.runtime.linear = "model"  # the reference's fp32 codes exactly (auto's fp16 products sum in another order:
    # tests/test_linears.py holds the fp16 step to its own reference)
    pool = EnginePool([load_runner(cfg, device="cpu"), load_runner(cfg, device="cpu")])
    for r in pool.runners:
        r.start()
    try:
        eng = pool.engine
        reqs = requests(5, frames=16)
        same(pool.synthesize(reqs[:3]), reference(eng, reqs[:3]))
        same(collect([pool.submit(reqs[3], STREAM_PRIORITY)]), reference(eng, reqs[3:4]))
        same(pool.synthesize(reqs[1:]), reference(eng, reqs[1:]))
    finally:
        pool.stop()


def test_guard_names_codes_out_of_range(decoder, monkeypatch):
    """On in the tests: a code past the codebook raises a ValueError naming it (streaming and one-shot);
    off (production), the lookup is not checked at all."""
    assert codec_decoder.CHECK_CODES, "tests/conftest.py turns the guard on"
    size = decoder.config.codebook_size
    codes = torch.randint(0, size, (2, decoder.config.num_quantizers, 3), generator=torch.Generator().manual_seed(1))
    codes[1, 0, 2] = size + 102
    with torch.inference_mode(), pytest.raises(ValueError, match=rf"\[{size + 102}\] in rows \[1\].* {size} codes"):
        decoder(codes)
    with pytest.raises(ValueError, match="codes out of range reached the codec"):
        TorchCodec(decoder, 2).push(codes, torch.tensor([3, 2]))
    checked = []
    monkeypatch.setattr(codec_decoder, "check_codes", lambda *a: checked.append(a))
    with torch.inference_mode():
        decoder(codes[:1])
    assert len(checked) == 1  # called on every lookup while on
    monkeypatch.setattr(codec_decoder, "CHECK_CODES", False)
    with torch.inference_mode():
        decoder(codes[:1])
    assert len(checked) == 1  # off: never called


def test_say_on_a_checkpoint_that_ends_by_eos(eos_model, monkeypatch, capsys, tmp_path):
    """`say` (one slot) on that checkpoint writes its audio (it used to end in IndexError)."""
    import soundfile as sf

    from test_cli_say import run

    out = tmp_path / "x.wav"
    code, said = run(monkeypatch, capsys, "Guten Tag.", "--model", str(eos_model), "--voice", "vivian", "--language",
                     "english", "--greedy", "-o", str(out))
    assert code == 0, said
    assert sf.read(out)[0].size > 0


def test_a_single_engine_pool_keeps_no_ended_request(eos_model):
    """The pool counts the requests it handed each engine; with one engine it never ranks engines, and the
    ended requests must still be let go (a daemon that runs for months submits millions)."""
    from appliance.config import Config
    from appliance.engine_host import load_runner
    from appliance.engine_pool import BATCH_PRIORITY, EnginePool
    from engines.runtime.stream import collect

    cfg = Config()
    cfg.model.path, cfg.runtime.max_slots = str(eos_model), "2"
    pool = EnginePool([load_runner(cfg, device="cpu")])
    pool.runners[0].start()
    try:
        for _ in range(4):
            collect([pool.submit(r, BATCH_PRIORITY) for r in requests(2, frames=4)])
            assert len(pool._live[0]) <= 2, len(pool._live[0])  # this round's two, at most
    finally:
        pool.stop()
