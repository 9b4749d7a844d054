"""The composition root: `appliance.settings` decides every `auto` once, `appliance.compose` builds the
engines, workers and inbox watcher from it for the daemon and the job commands alike, the commands' flags
only override config keys, and `info` shows what the commands run."""
from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from daemon_util import CV, skip_reason

ENV = {"TTS_APPLIANCE_SOCKET": None, "TTS_APPLIANCE_NO_DAEMON": "1", "TTS_APPLIANCE_MODEL": None}


def cli(*args):
    from appliance.cli import cli as group

    r = CliRunner().invoke(group, [str(a) for a in args], env=ENV)
    assert r.exit_code == 0, r.output
    return r


def config(tmp_path, text: str = "") -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"model: {{path: {CV}, threads: 1}}\njobs: {{home: {tmp_path / 'home'}}}\n"
                    f"service: {{runtime_dir: {tmp_path / 'run'}}}\n{text}")
    return path


@pytest.fixture
def made(monkeypatch):
    """The keyword arguments of every jobs Worker made, and the quiet time and polling of every inbox
    watcher run (its run() returns at once)."""
    import jobs.watch
    import jobs.worker

    out = {"workers": [], "watchers": []}
    init = jobs.worker.Worker.__init__

    def worker_init(self, *args, **kw):
        out["workers"].append(kw)
        init(self, *args, **kw)

    monkeypatch.setattr(jobs.worker.Worker, "__init__", worker_init)
    monkeypatch.setattr(jobs.watch.InboxWatcher, "run",
                        lambda self, stop: out["watchers"].append((self.quiet_s, self.polling)))
    return out


def test_job_commands_take_the_workers_and_inbox_settings_of_the_config(tmp_path, made):
    """`work` and `watch` build their worker and watcher from jobs.batch_size, jobs.lease_s,
    jobs.watch_quiet_s and jobs.watch_poll like the daemon (they had flag defaults of their own: 8
    segments, 120 s, 5 s, inotify); a flag given overrides its key."""
    if skip_reason():
        pytest.skip(skip_reason())
    path = config(tmp_path, "jobs: {batch_size: 3, lease_s: 7.0, watch_quiet_s: 0.7, watch_poll: true}\n")
    cli("--config", path, "work", "--until-idle")
    cli("--config", path, "watch", "--no-work")
    assert [(w["batch_size"], w["lease_s"]) for w in made["workers"]] == [(3, 7.0)]
    assert made["watchers"] == [(0.7, True)]
    cli("--config", path, "work", "--until-idle", "--batch-size", 2, "--lease-seconds", 9)
    cli("--config", path, "watch", "--no-work", "--quiet-seconds", 0.3, "--no-poll")
    assert [(w["batch_size"], w["lease_s"]) for w in made["workers"][1:]] == [(2, 9.0)]
    assert made["watchers"][1:] == [(0.3, False)]


def test_info_shows_what_work_runs(tmp_path, monkeypatch):
    """The engine `work` loads is the one `info` reports (device, dtype, slots, context, codec, threads):
    both come from the same settings (work loaded --batch-size slots, 8, where info said 3)."""
    if skip_reason():
        pytest.skip(skip_reason())
    import engines.load

    path = config(tmp_path, "runtime: {max_slots: 3}\n")
    [shown] = json.loads(cli("--config", path, "info", "--json", "--no-daemon").stdout)["engines"]
    specs, load = [], engines.load.load_runner
    monkeypatch.setattr(engines.load, "load_runner", lambda spec: specs.append(spec) or load(spec))
    cli("--config", path, "work", "--until-idle")
    [spec] = specs
    runs = engines.load.settings(spec)
    # the positions admission may reserve follow the memory available at each call: the same within 5%
    positions = runs.pop("max_positions"), shown.pop("max_positions")
    assert min(positions) > 0 and abs(positions[0] - positions[1]) <= 0.05 * max(positions), positions
    assert {k: shown[k] for k in runs} == runs and runs["max_slots"] == 3, (shown, runs)
    assert (shown["codec"], shown["threads"]) == (spec.codec, spec.threads) == ("torch", 1)
    text = cli("--config", path, "info", "--no-daemon").stdout
    # the weight format and the codec's dtype are the ones the loader decided for this CPU (runs, shown above)
    weights = "" if runs["linear"] == "model" else f"{runs['linear']} decoder-layer weights ("
    codec = "codec torch in bf16" if runs["codec_dtype"] == "bfloat16" else "codec torch"
    assert f"cpu: float32, {weights}" in text and "3 slots of 2048 positions" in text, text
    assert f"{codec}, 1 CPU threads" in text, text
    assert "3 (the engines' slots) segments in flight each, lease 120.0 s, guard off" in text, text  # a test model


def test_settings_decide_every_auto_once(tmp_path, monkeypatch):
    from appliance.config import Config, ConfigError
    from appliance.settings import reloaded, settings
    from engines.codec.manifest import MANIFEST

    monkeypatch.setenv("TTS_APPLIANCE_ENGINE_CACHE", str(tmp_path / "engines"))
    cfg = Config()
    cfg.model.path, cfg.model.device, cfg.model.threads = str(CV), "cpu,cpu", "2"
    cfg.jobs.home, cfg.jobs.batch_size, cfg.jobs.voice = str(tmp_path / "home"), 0, None
    s = settings(cfg)
    assert s.devices == ("cpu", "cpu") and [e.device for e in s.engines] == ["cpu", "cpu"]
    assert s.model == str(CV.resolve()) == s.worker.model and {e.model for e in s.engines} == {s.model}
    assert s.threads == 2 and {e.threads for e in s.engines} == {2}
    assert s.voices_dir == tmp_path / "home" / "voices" and s.engines[0].voices_dir == str(s.voices_dir)
    assert s.engines[0].codec == "torch"  # runtime.codec auto without a build
    assert s.job_defaults == {"language": "auto", "voice": "dylan"}  # a CustomVoice model's first speaker
    assert s.worker.batch_for(8) == 8 and replace(s.worker, batch_size=3).batch_for(8) == 3
    (tmp_path / "engines" / CV.name).mkdir(parents=True)
    (tmp_path / "engines" / CV.name / MANIFEST).write_text("{}")
    assert settings(cfg).engines[0].codec == "built"  # what build-engines made: the runner and info agree
    assert settings(cfg, instance="1").devices == ("cpu",)
    with pytest.raises(ConfigError, match="instance '2' has no device"):
        settings(cfg, instance="2")
    cfg.model.device = "cpu"
    assert settings(cfg, instance="3").devices == ("cpu",)
    new = Config()
    new.jobs.home, new.jobs.lease_s, new.jobs.watch_quiet_s = cfg.jobs.home, 9.0, 0.2
    again = reloaded(s, new)
    assert (again.worker.lease_s, again.inbox.quiet_s, again.engines, again.config) == (9.0, 0.2, s.engines, new)


def test_the_event_stream_says_it_is_alive_while_nothing_changes(tmp_path, monkeypatch):
    """GET /v1/jobs/{id}/events on a job nobody works: a keep-alive comment every KEEPALIVE_S, so a client
    that waits a bounded time for its next line can tell a slow job from a daemon that is gone."""
    from types import SimpleNamespace

    from aiohttp import web

    import appliance.http_jobs as http_jobs
    from appliance.client import _UnixConnection
    from appliance.http_common import CTX
    from jobs.queue import Queue
    from jobs.settings import JobSpec, resolve_home
    from jobs.submit import submit_document
    from jobs.document import Chapter, Document

    monkeypatch.setattr(http_jobs, "KEEPALIVE_S", 0.3)
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(paths.db)
    job = submit_document(q, paths, Document(chapters=[Chapter("One", ["Alpha is read."])]), JobSpec(voice="ryan"))
    q.close()
    sock = str(tmp_path / "api.sock")

    async def serve_and_read() -> list:
        app = web.Application()
        app[CTX] = SimpleNamespace(paths=paths, accepting=True)
        http_jobs.add_routes(app)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.UnixSite(runner, sock).start()
        try:
            return await asyncio.get_running_loop().run_in_executor(None, read)
        finally:
            await runner.cleanup()

    def read() -> list:
        conn = _UnixConnection(sock, 1.0)  # a read timeout far shorter than the silence while nobody works
        try:
            conn.request("GET", f"/v1/jobs/{job}/events")
            resp = conn.getresponse()
            lines = []
            while lines.count(b": keep-alive\n") < 3 and len(lines) < 100:
                lines.append(resp.readline())
            return lines
        finally:
            conn.close()

    lines = asyncio.run(serve_and_read())
    assert b"event: progress\n" in lines and lines.count(b": keep-alive\n") == 3, lines


def test_follow_stops_when_the_stream_ends_before_the_job(capsys):
    """A daemon that stops while `submit --wait` follows its job: the command fails saying the daemon goes
    on with the job and how to look at it, instead of reporting it done."""
    import click

    from appliance.cli_jobs import follow

    class Stopping:
        def events(self, job_id):
            yield "progress", {"progress": {"done": 1, "total": 3, "failed": 0, "cancelled": 0}}

        def job(self, job_id):
            raise AssertionError("an unfinished job is not summarized as finished")

    with pytest.raises(click.ClickException) as err:
        follow(Stopping(), ["abc123"], progress=True)
    msg = err.value.message
    assert "job abc123: the daemon ended its event stream before the job finished" in msg
    assert "tts-appliance status JOB" in msg and "1/3" in capsys.readouterr().err


def test_explicit_slots_are_checked_against_the_accelerators_memory(monkeypatch):
    """`runtime.max_slots: N` on an accelerator is held against its free memory as `auto` is: N that fit run
    as configured, N that do not stop the engine before it allocates anything, with one line naming the key
    and how many fit (512 slots of 2,048 positions on an 80 GB card used to die out of memory at start)."""
    import torch

    import engines.load
    from engines.api import EngineSpec
    from engines.runtime import memory

    free = {"bytes": 64 * 2**30}
    monkeypatch.setattr(memory, "device_free_bytes",
                        lambda device: free["bytes"] if torch.device(device).type == "cuda" else None)
    spec = EngineSpec(model=str(CV), device="cuda:0", dtype="float32", max_slots=8, max_context=256)
    fits = engines.load.settings(spec)
    assert fits["max_slots"] == 8 and fits["slots_reason"].startswith("configured; 8 slots"), fits
    auto = engines.load.settings(replace(spec, max_slots="auto"))["max_slots"]
    need = memory.fixed_bytes(*_shape(), 256, 8, 1024) + memory.weights_bytes(CV, torch.float32)
    free["bytes"] = int((need + 3.5 * memory.per_slot_bytes(*_shape(), 256)) / 0.9)  # 3 slots fit (headroom 90%)
    few = engines.load.settings(replace(spec, max_slots="auto"))["max_slots"]
    assert few == 3 and auto >= 8, (few, auto)
    with pytest.raises(RuntimeError, match=rf"runtime.max_slots: 8 slots of 256 positions do not fit on cuda:0: .* "
                                           rf"at most {few} fit; lower runtime.max_slots or runtime.max_context"):
        engines.load.settings(spec)
    cpu = engines.load.settings(replace(spec, device="cpu", max_slots=64))  # no memory figure to hold it against
    assert (cpu["max_slots"], cpu["slots_reason"]) == (64, "configured")


def _shape():
    import torch

    from engines.model.config import CodecConfig, ModelConfig

    return ModelConfig.from_dir(CV), CodecConfig.from_dir(CV / "speech_tokenizer"), torch.float32
