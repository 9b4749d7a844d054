"""Several engines in one daemon (model.device: a list, here `cpu,cpu`): one book's segments run on
both engines, streams go to the least-loaded engine, and the config rejects malformed device lists."""
from __future__ import annotations

import json
import logging
import os
import socket

import pytest

from daemon_util import Daemon, base_config, book_text, needs_daemon


def engines(d: Daemon) -> list[dict]:
    status, health, _ = d.get("/health")
    assert status == 200, health
    return health["engine"]["engines"]


def open_stream(d: Daemon, frames: int) -> socket.socket:
    """A pcm stream on a raw socket, returned once its first audio arrived (so it holds a slot)."""
    body = json.dumps({"input": "A long text to read aloud. " * 4, "voice": "ryan", "response_format": "pcm", "stream": True,
                       "max_frames": frames}).encode()
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(d.socket)
    s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    got = b""
    while len(got) < 4000:
        chunk = s.recv(65536)
        assert chunk, "stream ended early"
        got += chunk
    assert got.startswith(b"HTTP/1.1 200"), got[:200]
    return s


@needs_daemon
def test_two_cpu_engines_share_a_book_and_streams(tmp_path):
    cfg = base_config(tmp_path, model={"device": "cpu,cpu", "warmup": False},
                      runtime={"max_slots": 2, "max_queue": 8}, jobs={"watch": False, "batch_size": 0})
    d = Daemon(tmp_path, cfg).start()
    try:
        first = engines(d)
        assert [e["device"] for e in first] == ["cpu", "cpu"] and all(e["max_slots"] == 2 for e in first)
        assert all(e["frames"] == 0 and e["dtype"] == "float32" for e in first), first
        assert "2 engines: cpu 2 slots, cpu 2 slots" in d.log_text()

        book = tmp_path / "allowed.txt"
        book.write_text(book_text(8))
        spec = {"voice": "ryan", "sampling": {"max_new_tokens": 6}}
        boundary = "b0undary"
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"spec\"\r\n\r\n{json.dumps(spec)}\r\n"
                f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"book.txt\"\r\n\r\n"
                f"{book.read_text()}\r\n--{boundary}--\r\n").encode()
        status, job, _ = d.request("POST", "/v1/jobs", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"})
        assert status == 201, job
        assert d.wait_job(job["id"])["state"] == "done"
        after_book = engines(d)
        assert all(e["frames"] > 0 for e in after_book), after_book  # both engines made segments of the book

        # a long stream holds engine 0; the next stream goes to the idle engine 1
        a = open_stream(d, frames=300)
        try:
            now = engines(d)
            assert [e["streams"] for e in now] == [1, 0], now
            status, audio, _ = d.post("/v1/audio/speech", {"input": "Hi there.", "voice": "ryan",
                                                            "response_format": "pcm", "max_frames": 8})
            assert status == 200 and len(audio) > 0
            later = engines(d)
            assert later[1]["frames"] > after_book[1]["frames"], later
        finally:
            a.close()
    finally:
        assert d.stop() == 0


def test_device_lists_are_checked(tmp_path):
    from appliance.config import ConfigError, resolve
    from engines.device.detect import resolve_device, resolve_devices

    path = tmp_path / "c.yaml"
    for bad, needle in [("cpu,auto", "'auto' not allowed in a list"), ("gpu", "give auto, all, cpu"),
                        ("cuda:0,,cuda:1", "'' not allowed")]:
        path.write_text(f"model: {{device: '{bad}'}}\n")
        with pytest.raises(ConfigError, match="model.device") as err:
            resolve(str(path))
        assert needle in str(err.value)
    path.write_text("model: {device: 'cpu, cpu'}\n")
    assert resolve_devices(resolve(str(path)).model.device) == ["cpu", "cpu"]
    assert resolve_device("cuda:1,cuda:0") == "cuda:1"  # one-engine commands take the first
    assert resolve_devices("cuda:1") == ["cuda:1"]


def test_book_bench_compares_device_sets(tmp_path):
    """benchmarks/book_job.py --devices cpu --devices cpu,cpu: two runs in one call, the second on two
    engines that both synthesize segments of the book, and their ratio."""
    import subprocess
    import sys

    from daemon_util import CV, ROOT, skip_reason

    if skip_reason():
        pytest.skip(skip_reason())
    out = tmp_path / "book.json"
    cmd = [sys.executable, "-m", "benchmarks.book_job", "--model", str(CV), "--dtype", "float32", "--devices", "cpu",
           "--devices", "cpu,cpu", "--chapters", "1", "--paragraphs", "4", "--frames", "6", "--slots", "2",
           "--codec-streams", "off", "--json", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    one, two = res["runs"]
    assert (one["devices"], two["devices"]) == ("cpu", "cpu,cpu") and (one["slots"], two["slots"]) == (2, 4)
    assert one["state"] == two["state"] == "done"
    assert all(e["frames"] > 0 for e in two["engines"]) and len(two["engines"]) == 2
    assert set(res["scaling"]) == {"cpu codec_streams_off", "cpu,cpu codec_streams_off"}
    assert res["scaling"]["cpu codec_streams_off"] == 1.0


def test_print_config_resolves_every_engine(tmp_path):
    from click.testing import CliRunner

    from appliance.cli import cli
    from daemon_util import CV

    path = tmp_path / "c.yaml"
    path.write_text(f"model: {{path: {CV}, device: 'cpu,cpu'}}\nruntime: {{max_slots: 3}}\n")
    r = CliRunner().invoke(cli, ["--config", str(path), "daemon", "--print-config"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["resolved"]["device"] == "cpu" and out["resolved"]["max_slots"] == 3
    assert [(e["device"], e["dtype"], e["max_slots"]) for e in out["resolved_engines"]] == [("cpu", "float32", 3)] * 2


def test_instance_takes_its_device_of_the_list(tmp_path, capsys):
    from appliance.daemon import main

    path = tmp_path / "c.yaml"
    path.write_text(f"model: {{device: 'cpu,cpu'}}\nservice: {{runtime_dir: {tmp_path / 'run'}}}\n")
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:  # main() points the root logger at this test's captured stdout: put it back afterwards
        assert main(str(path), instance="1", check_only=True) == 0
        assert main(str(path), instance="2", check_only=True) == 78
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    assert "instance '2' has no device in model.device = 'cpu,cpu' (cpu, cpu); use 0..1" in capsys.readouterr().err


def test_pool_routes_streams_and_batch_work(one_thread):
    """Two real tiny engines (loops not started, so requests stay queued where they were put): a stream
    goes to the emptier engine, batch work avoids an engine where a stream waits, and a full engine
    passes a stream on; EngineBusy only when every engine is full."""
    from daemon_util import CV, skip_reason

    if skip_reason():
        pytest.skip(skip_reason())
    from appliance.config import Config
    from appliance.engine_host import BATCH_PRIORITY, STREAM_PRIORITY, load_runner
    from appliance.engine_pool import EnginePool
    from engines.api import SynthesisRequest
    from engines.runtime.runner import EngineBusy

    cfg = Config()
    cfg.model.path, cfg.runtime.max_slots, cfg.runtime.max_queue = str(CV), "2", 1
    pool = EnginePool([load_runner(cfg, device="cpu"), load_runner(cfg, device="cpu")])
    req = SynthesisRequest(text="Hello.", voice="ryan")

    def queued():
        return [r.stats()["queued"] for r in pool.runners]

    a = pool.submit(req, STREAM_PRIORITY)
    assert queued() == [1, 0] and pool.streams == [1, 0]
    pool.submit(req, BATCH_PRIORITY)  # engine 0 has a stream waiting: batch work goes to engine 1
    assert queued() == [1, 1] and pool.streams == [1, 0]
    pool.submit(req, STREAM_PRIORITY)  # equal load: the engine serving fewer streams
    assert queued() == [1, 2] and pool.streams == [1, 1]
    with pytest.raises(EngineBusy):  # one stream waits on each engine (max_queue 1): all full
        pool.submit(req, STREAM_PRIORITY)
    assert pool.stats()["queued"] == 3 and [e["streams"] for e in pool.stats()["engines"]] == [1, 1]
    pool.finished(a)
    assert pool.streams == [0, 1]


@pytest.mark.parametrize("device, env, seen", [
    ("cuda:1", {}, ("cuda:0", "1")),
    ("cuda:0", {}, ("cuda:0", "0")),
    ("cuda:1", {"CUDA_VISIBLE_DEVICES": "2,3"}, ("cuda:0", "3")),  # the index is into the daemon's own list
    ("cuda:1", {"CUDA_VISIBLE_DEVICES": "GPU-aa, GPU-bb"}, ("cuda:0", "GPU-bb")),
    ("cuda:2", {"CUDA_VISIBLE_DEVICES": "0,1"}, None),  # not visible to the daemon: the process says so
    ("cuda", {}, None), ("cpu", {}, None), ("npu:1", {}, None),
])
def test_an_engine_process_sees_its_gpu_alone(device, env, seen):
    """Each GPU's engine process sees its GPU alone, as cuda:0, so the compiled regions the inductor caches
    (keyed by the device index) for one GPU serve every GPU (engines.names.own_gpu)."""
    from engines.names import own_gpu

    assert own_gpu(device, env) == seen
