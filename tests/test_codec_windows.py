"""Codec calls over a window of a lane's rows (runtime.codec_windows; EngineConfig.batch_window_frames): a
backend's push on rows [r, r + b) decodes those streams exactly as a push of every row would and leaves the others alone; a lane with
more members than one call of `window_frames` frames a row may carry decodes them window by window, and
every request gets the reference codes and audio (members joining, leaving and moving between windows)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engines.codec.backend_torch import TorchCodec
from engines.runtime.codec_lane import CodecLane
from engines.runtime.runner import EngineRunner
from lane_util import drive_lane
from test_runtime import engine, reference, requests

pytestmark = pytest.mark.usefixtures("one_thread")


def codes_for(decoder, rows: int, frames: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    k, size = decoder.config.num_quantizers, decoder.config.codebook_size
    return torch.randint(0, size, (rows, k, frames), generator=g)


def test_a_push_on_a_window_of_rows_equals_the_push_of_every_row(decoder):
    codes = codes_for(decoder, 4, 6)
    whole, windows = TorchCodec(decoder, 4), TorchCodec(decoder, 4)
    ref = [whole.push(codes[..., a:b]) for a, b in ((0, 2), (2, 6))]
    out = []
    for a, b in ((0, 2), (2, 6)):
        lo = windows.push(codes[:3, :, a:b])  # rows 0-2, then row 3 alone from row 3
        hi = windows.push(codes[3:, :, a:b], first_row=3)
        out.append(torch.cat([lo, hi]))
    for r, o in zip(ref, out):
        assert o.shape == r.shape and (o - r).abs().max().item() < 1e-5
    assert torch.equal(windows.frames_decoded, whole.frames_decoded)
    # a window leaves the other rows' streams as they were
    before = {k: v.clone() for k, v in windows.stream.state.bufs.items()}
    windows.push(codes[1:3, :, :2], first_row=1)
    assert windows.frames_decoded.tolist() == [6, 8, 8, 6]
    for k, v in windows.stream.state.bufs.items():
        assert torch.equal(v[0], before[k][0]) and torch.equal(v[3], before[k][3]), k
    with pytest.raises(ValueError, match="from row 3"):
        windows.push(codes[:2, :, :1], first_row=3)  # past the last row


def test_a_lane_decodes_more_members_than_a_window_holds_window_by_window(decoder):
    """Six streams, calls of at most 8 frame-rows, windows of 4 frames a row: 2 rows a window, three windows
    (the last one ends at the last row); streams of different lengths end and leave while others go on."""
    t_max = 11
    frames = codes_for(decoder, 6, t_max, seed=1).permute(0, 2, 1).contiguous()
    rates, done, plan = [1, 1, 2, 1, 3, 1], [0] * 6, []
    while min(done) < t_max:  # each stream at its own pace, to its end
        plan.append([min(r, t_max - d) for r, d in zip(rates, done)])
        done = [d + k for d, k in zip(done, plan[-1])]
    audio, lane = drive_lane(TorchCodec(decoder, 6), frames, plan, first=4, max_chunk=4, frames_per_call=8,
                             window_frames=4)
    assert lane.window_rows == 2 and lane.window_calls > 0
    for i in range(6):
        ref = decoder(frames[i:i + 1].permute(0, 2, 1))[0, 0].numpy()
        assert audio[i].shape == ref.shape and np.abs(audio[i] - ref).max() < 1e-4


@pytest.mark.parametrize("threads", [0, 2])
def test_a_runner_with_codec_windows_gives_every_request_its_reference_codes_and_audio(threads):
    eng = engine()
    reqs = requests(8)
    ref = reference(eng, reqs)
    # CPU calls of at most 8 frame-rows, windows of 2 frames a row: 4 rows a window, 8 slots
    runner = EngineRunner(eng, max_slots=8, max_context=256, codec_windows=True, batch_window_frames=2,
                          batch_call_frames=8,
                          cpu_call_frames=8, cpu_codec_threads=threads)
    lane = runner.lanes["batch"]
    assert lane.window_rows == 4
    out = runner.synthesize(reqs)
    for (codes, wav), res in zip(ref, out):
        assert np.array_equal(res.codes, codes)
        assert res.audio.shape == wav.shape and np.abs(res.audio - wav).max() < 1e-4
    assert lane.window_calls > 0 and lane.window_calls < lane.calls


def test_windows_are_off_on_the_cpu_by_default_and_for_a_backend_without_them(tmp_path):
    runner = EngineRunner(engine(), max_slots=4, max_context=256)
    assert runner.lanes["batch"].window_frames == 0 and runner.lanes["stream"].window_frames == 0
    windowed = EngineRunner(engine(), max_slots=4, max_context=256, codec_windows=True, batch_window_frames=2,
                            batch_call_frames=4)
    assert windowed.lanes["batch"].window_frames == 2
    lane = windowed.lanes["batch"]
    codec = TorchCodec(lane.codec.decoder, 4)
    codec.row_windows = False  # a backend that cannot push a window of rows (TensorRT, ONNX Runtime)
    assert CodecLane("batch", codec, windowed.store, 4, 4, 4, False, window_frames=2).window_rows == 0


@pytest.mark.gpu
def test_gpu_codec_windows_through_graphs_equal_the_reference():
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    torch.backends.cudnn.allow_tf32 = False  # (as the other fp32 GPU parity tests: TF32 convs differ by ~1e-3)
    torch.backends.cuda.matmul.allow_tf32 = False
    eng = engine(device="cuda")
    reqs = requests(8)
    ref = reference(eng, reqs)
    runner = EngineRunner(eng, max_slots=8, max_context=256, codec_windows=True, batch_window_frames=2,
                          batch_call_frames=8, compile=False)
    lane = runner.lanes["batch"]
    assert lane.use_graphs and lane.window_rows == 4
    runner.prepare()
    assert any(r0 for (_, _, r0) in lane.graphs)  # windows captured at start-up
    out = runner.synthesize(reqs)
    for (codes, wav), res in zip(ref, out):
        assert np.array_equal(res.codes, codes)
        assert res.audio.shape == wav.shape and np.abs(res.audio - wav).max() < 1e-4
    assert lane.window_calls > 0


@pytest.mark.parametrize("value,frames", [(None, 0), ("true", 16), ("false", 0)])
def test_the_runtime_codec_windows_key_reaches_the_engine(tmp_path, value, frames):
    """runtime.codec_windows in the config file -> the engine's batch lane (off on the CPU unless asked for)."""
    from appliance.config import load_config
    from appliance.settings import engine_spec
    from engines.load import load_runner
    from test_runtime import TINY

    text = f"model: {{path: {TINY / 'cv_small'}, device: cpu}}\n" + \
        (f"runtime: {{codec_windows: {value}}}\n" if value else "")
    (tmp_path / "c.yaml").write_text(text)
    spec = engine_spec(load_config(tmp_path / "c.yaml", environ={}), "cpu")
    assert spec.codec_windows == {None: None, "true": True, "false": False}[value]
    runner = load_runner(spec)
    assert runner.lanes["batch"].window_frames == frames and runner.lanes["stream"].window_frames == 0
