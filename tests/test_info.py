"""`tts-appliance info`: the report works without a daemon (model, engines, codec builds and why they
are not used, config files, paths) and includes a running daemon's /health when one answers."""
from __future__ import annotations

import json

import torch
from click.testing import CliRunner

from daemon_util import CV, Daemon, base_config, needs_daemon


def run_info(*args, env=None):
    from appliance.cli import cli

    r = CliRunner().invoke(cli, [*args], env={"TTS_APPLIANCE_SOCKET": None, **(env or {})})
    assert r.exit_code == 0, r.output
    return r.output


def stale_manifest(cache_root, model_dir) -> None:
    """A build made on another machine: an ONNX Runtime engine for a GPU, TensorRT skipped."""
    from engines.codec.manifest import FORMAT, MANIFEST, model_identity

    folder = cache_root / model_dir.name
    folder.mkdir(parents=True)
    manifest = {"format": FORMAT, "model": model_identity(model_dir),
                "platform": {"device": "cuda", "device_name": "Some GPU", "capability": "9.0", "driver": "1.0"},
                "engines": [{"backend": "onnxruntime", "file": "codec_step.onnx", "precision": "fp32"}],
                "ranking": ["onnxruntime", "torch"], "skipped": {"tensorrt": "missing library: tensorrt"}}
    (folder / MANIFEST).write_text(json.dumps(manifest))


def test_info_without_daemon(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{path: {CV}, device: 'cpu,cpu'}}\nruntime: {{max_slots: 3}}\n"
                   f"jobs: {{home: {tmp_path / 'home'}}}\nservice: {{runtime_dir: {tmp_path / 'run'}}}\n")
    stale_manifest(tmp_path / "engines", CV)
    env = {"TTS_APPLIANCE_ENGINE_CACHE": str(tmp_path / "engines")}
    report = json.loads(run_info("--config", str(cfg), "info", "--json", env=env))
    assert str(cfg) in report["program"]["config_read"]
    assert report["device"]["cpu_cores"] >= 1 and "torch" in report["device"]
    m = report["model"]
    assert m["kind"] == "custom_voice" and "ryan" in m["speakers"] and "english" in m["languages"]
    assert [(e["device"], e["dtype"], e["max_slots"]) for e in report["engines"]] == [("cpu", "float32", 3)] * 2
    codec = report["codec_engines"]
    assert codec["uses"] == "torch" and "different device (cuda -> cpu)" in codec["built"][0]["why_not"]
    assert codec["skipped"] == {"tensorrt": "missing library: tensorrt"}
    assert report["paths"]["queue"] == str(tmp_path / "home" / "queue.db")
    assert report["paths"]["http_socket"] == str(tmp_path / "run" / "api.sock")
    assert report["daemon"]["reachable"] is False
    assert not (tmp_path / "home" / "queue.db").exists()  # the report creates nothing
    from appliance.settings import codec_threads, idle_threads, torch_threads

    threads = torch_threads("auto")  # model.threads auto, as decided for this machine
    assert report["configured"]["threads"] == "auto" and report["configured"]["torch_threads"] == threads
    codec_n = codec_threads("auto")  # the CPU engine's codec threads (0 on one core: the codec in the loop's)
    idle = idle_threads("auto")  # the loop's while the codec idles
    assert report["engines"] and ({(e["threads"], e["codec_threads"], e["idle_threads"]) for e in report["engines"]}
                                  == {(threads, codec_n, idle)})

    text = run_info("--config", str(cfg), "info", env=env)
    from engines.runtime.linears import linear_setting

    fmt = linear_setting("auto", "cpu", torch.float32)[0]  # fp16 where fbgemm's fp16 matmul runs
    engine_line = "cpu: float32, " + (f"{fmt} decoder-layer weights (auto: " if fmt != "model" else "3 slots")
    for needle in ("kind custom_voice", engine_line, "3 slots of", "onnxruntime: not usable: different device",
                   "tensorrt: skipped at build: missing library", "uses torch", "not reachable", str(cfg),
                   f"CPU threads {threads} (model.threads auto)",
                   f"{threads} CPU threads" + (f" ({idle} while the codec idles)" if idle > threads else "")
                   + (f" + {codec_n} for the codec" if codec_n else "")):
        assert needle in text, (needle, text)


def test_info_shows_int8_weights(tmp_path):
    """runtime.linear: int8 (lossy) is on the engine's line of `info`; auto takes fp16 on a CPU that runs it."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{path: {CV}, device: cpu}}\nruntime: {{max_slots: 3, linear: int8}}\n"
                   f"jobs: {{home: {tmp_path / 'home'}}}\nservice: {{runtime_dir: {tmp_path / 'run'}}}\n")
    report = json.loads(run_info("--config", str(cfg), "info", "--json"))
    assert [e["linear"] for e in report["engines"]] == ["int8"]
    assert "cpu: float32, int8 decoder-layer weights (lossy" in run_info("--config", str(cfg), "info")
    cfg.write_text(cfg.read_text().replace("linear: int8", "linear: auto"))
    from engines.runtime.linears import linear_setting

    auto = json.loads(run_info("--config", str(cfg), "info", "--json"))["engines"]
    assert [e["linear"] for e in auto] == [linear_setting("auto", "cpu", torch.float32)[0]]


def _paths_info(tmp_path, queue: str) -> dict:
    from appliance.config import load_config
    from appliance.info import paths_info

    main = tmp_path / "c.yaml"
    main.write_text(json.dumps({"jobs": {"home": str(tmp_path / "home"), "queue": queue}}))
    return paths_info(load_config(main, environ={}))


def test_info_counts_the_jobs_of_either_queue_and_creates_none(tmp_path, location):
    from jobs.document import SegmentText
    from jobs.queue import Queue
    from jobs.settings import JobSpec

    assert "jobs" not in _paths_info(tmp_path, str(location))  # no queue yet
    with Queue.reading(location) as none:
        assert none is None  # and the report made none
    q = Queue(location)
    q.add_job(JobSpec(), [("One", [SegmentText("A sentence is spoken.", "A sentence.", 0)])])
    q.add_failed_job(JobSpec(), ["bad.txt"], "not a book")
    assert _paths_info(tmp_path, str(location))["jobs"] == {"queued": 1, "failed": 1}
    q.close()


def test_info_says_why_it_cannot_read_the_queue(tmp_path):
    report = _paths_info(tmp_path, "postgresql://tts:secret@127.0.0.1:1/tts")
    error = report["jobs"]["error"]
    assert "cannot connect to the queue database" in error and "secret" not in json.dumps(report), report
    assert "\n" not in error


def test_info_without_a_model_still_reports():
    text = run_info("info", "--no-daemon", env={"TTS_APPLIANCE_MODEL": None})
    assert "model\n  error: ConfigError: no model" in text and "device\n  torch" in text


@needs_daemon
def test_info_shows_the_running_daemon(tmp_path):
    cfg = base_config(tmp_path, model={"warmup": False}, jobs={"enabled": False, "watch": False})
    d = Daemon(tmp_path, cfg).start()
    try:
        report = json.loads(run_info("--config", str(d.path), "info", "--json"))
        daemon = report["daemon"]
        assert daemon["reachable"] and daemon["socket"] == d.socket
        assert daemon["health"]["status"] == "ok" and daemon["health"]["runtime"]["max_slots"] == 4
        text = run_info("--config", str(d.path), "info")
        assert f"{d.socket}: ok, pid {d.proc.pid}" in text and "engine cpu: float32, 4 slots" in text
        assert "queue ok" in text
    finally:
        assert d.stop() == 0
