"""The DeviceGraph interface: EagerGraph on CPU, the shared stream-capture logic with a stand-in
device namespace, NPU detection without torch_npu, and a real CUDA graph where a GPU exists."""
from __future__ import annotations

import contextlib

import pytest
import torch

from engines.device.graphs import CudaGraph, EagerGraph, StreamGraph, make_graph
from engines.device.npu import npu_available, npu_info



@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def test_eager_graph_refreshes_static_outputs_in_place():
    x = torch.zeros(3)
    g = make_graph("cpu")
    assert isinstance(g, EagerGraph) and not g.captured
    out = g.capture(lambda t: t * 2 + 1, x)
    ptr = out.data_ptr()
    x.copy_(torch.tensor([1.0, 2.0, 3.0]))
    assert g.replay() is out and out.data_ptr() == ptr
    assert out.tolist() == [3.0, 5.0, 7.0]


def test_capture_runs_fn_warmup_times_on_cpu_as_on_cuda():
    runs = []
    g = EagerGraph()
    g.capture(lambda: runs.append(1) or torch.zeros(1), warmup=3)
    assert len(runs) == 3  # CUDA: 3 warm-ups, the recorded run has no effect; CPU: 2 + the capture run
    g.replay()
    assert len(runs) == 4


def test_eager_graph_tuple_and_dict_outputs():
    x = torch.ones(2)
    g = EagerGraph()
    a, d = g.capture(lambda t: (t + 1, {"s": t.sum(0, keepdim=True), "m": t * 3}), x)
    x.fill_(2)
    g.replay()
    assert a.tolist() == [3.0, 3.0] and d["s"].tolist() == [4.0] and d["m"].tolist() == [6.0, 6.0]


def test_eager_graph_errors_say_what_to_do():
    g = EagerGraph()
    with pytest.raises(RuntimeError, match="capture"):
        g.replay()
    n = [2]
    g.capture(lambda: torch.zeros(n[0]))
    n[0] = 3
    with pytest.raises(RuntimeError, match="one graph per shape bucket"):
        g.replay()
    with pytest.raises(TypeError, match="must return tensors"):
        EagerGraph().capture(lambda: 3)


class _FakeNS:
    """Stands in for torch.cuda / torch_npu.npu: records the calls the capture makes."""

    def __init__(self):
        self.calls = []
        ns = self

        class Stream:
            def __init__(self, device=None):
                ns.calls.append("Stream")

            def wait_stream(self, other):
                ns.calls.append("wait")

        class Graph:
            def __init__(self):
                self.replays = 0

            def replay(self):
                self.replays += 1

        self.Stream, self.Graph = Stream, Graph

    def current_stream(self, device=None):
        return self.Stream()

    @contextlib.contextmanager
    def stream(self, s):
        self.calls.append("enter-side")
        yield

    @contextlib.contextmanager
    def graph(self, g, pool=None, stream=None):
        self.calls.append(("capture", pool))
        yield


def test_stream_graph_shared_logic_on_cpu():
    ns, runs, x = _FakeNS(), [], torch.zeros(2)

    def fn(t):
        runs.append(1)
        return t + 1

    g = StreamGraph("cpu", ns, ns.Graph, pool="POOL")
    out = g.capture(fn, x, warmup=2)
    assert len(runs) == 3  # two warm-up runs on the side stream, then the recorded one
    assert ns.calls.index("enter-side") < ns.calls.index(("capture", "POOL"))
    assert out.tolist() == [1.0, 1.0] and g.replay() is out and g.graph.replays == 1


def test_npu_absent_is_reported_cleanly():
    if npu_available():
        pytest.skip("an Ascend NPU is present")
    assert npu_info() == {}
    with pytest.raises(RuntimeError, match="torch_npu"):
        make_graph("npu")


def test_eager_graph_drives_the_streaming_codec(decoder):
    """The decode-loop pattern on CPU: static codes / n_valid buffers, push captured once, replayed."""
    from engines.codec.backend_torch import TorchCodec

    dec = decoder
    k, cbs = dec.config.num_quantizers, dec.config.codebook_size
    codes = torch.randint(0, cbs, (2, k, 6), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = dec(codes)
    codec = TorchCodec(dec, 2)
    static_codes, static_nv = torch.zeros(2, k, 3, dtype=torch.long), torch.full((2,), 3)
    g = make_graph("cpu")
    wav = g.capture(codec.push, static_codes, static_nv)
    assert wav.shape == (2, 1, 3 * dec.samples_per_frame)
    codec.reset()  # capture ran push once: start the streams over
    outs = []
    for i in (0, 3):
        static_codes.copy_(codes[..., i:i + 3])
        outs.append(g.replay().clone())
    assert float((torch.cat(outs, -1) - ref).abs().max()) < 1e-5


@pytest.mark.gpu
def test_cuda_graph_replays_with_new_inputs():
    x = torch.zeros(4, device="cuda")
    g = make_graph("cuda")
    assert isinstance(g, CudaGraph)
    out = g.capture(lambda t: t * 2 + 1, x)
    x.copy_(torch.arange(4.0, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    assert out.tolist() == [1.0, 3.0, 5.0, 7.0]
