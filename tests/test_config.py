"""Settings: shipped defaults, the config file (named, user, /etc) + drop-ins, environment overrides,
command-line flags on top (`resolve`), the group's --config reaching every command, and clear
validation errors (unknown keys listed with the valid ones, wrong types, bad values)."""
from __future__ import annotations

import os
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from appliance.config import Config, ConfigError, as_dict, choices, env_overrides, load_config, resolve
from appliance.settings import settings, torch_threads

ROOT = Path(__file__).resolve().parents[1]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_shipped_defaults_match_the_dataclasses():
    cfg = load_config(ROOT / "configs" / "default.yaml", environ={})
    assert as_dict(cfg) == as_dict(Config())


def test_file_dropins_and_environment_in_order(tmp_path):
    main = write(tmp_path / "config.yaml", "model: {path: /m, threads: 2}\nhttp: {tcp_port: 9000, mode: 0640}\n")
    write(tmp_path / "config.d" / "10-a.yaml", "http: {tcp_port: 9001}\n")
    write(tmp_path / "config.d" / "20-b.yaml", "http: {tcp_port: 9002}\nruntime: {max_slots: 8}\n")
    cfg = load_config(main, environ={"TTS_APPLIANCE_HTTP__TCP": "true", "TTS_APPLIANCE_RUNTIME__MAX_SLOTS": "3",
                                     "TTS_APPLIANCE_HOME": "/spool", "TTS_APPLIANCE_MODEL": "/ignored"})
    assert cfg.model.path == "/m" and cfg.model.threads == "2" and torch_threads(cfg.model.threads) == 2
    assert cfg.http.tcp_port == 9002 and cfg.http.tcp is True and cfg.http.mode == "0640"
    assert cfg.runtime.max_slots == "3"  # environment wins over drop-ins
    assert cfg.jobs.home == "/spool"
    assert [Path(s).name for s in cfg.sources] == ["config.yaml", "10-a.yaml", "20-b.yaml"]


def test_env_overrides_parse_values_as_yaml():
    assert env_overrides({"TTS_APPLIANCE_JOBS__ALLOWED_DIRS": "[/a, /b]", "TTS_APPLIANCE_HOME": "/x",
                          "OTHER__X": "1"}) == {"jobs": {"allowed_dirs": ["/a", "/b"]}}


@pytest.mark.parametrize("text,needle", [
    ("modle: {path: x}\n", "unknown section 'modle'; valid sections: model, runtime, jobs, http, wyoming, service"),
    ("http: {sockett: /x}\n", "unknown key http.sockett; valid keys in http: socket, group, mode"),
    ("runtime: {max_slots: many}\n", "runtime.max_slots = 'many': give auto or a number of at least 1"),
    ("runtime: {max_slots: 0}\n", "runtime.max_slots = '0': give auto or a number of at least 1"),
    ("jobs: {batch_size: -1}\n", "jobs.batch_size must be 0"),
    ("jobs: {watch: 3}\n", "jobs.watch: expected bool"),
    ("model: {dtype: float8}\n", "choose one of auto, float32, bfloat16, float16"),
    ("http: {mode: rw}\n", "octal file mode"),
    ("http: {tcp_port: 70000}\n", "0..65535"),
    ("runtime: {max_queue: 0}\n", "at least 1"),
    ("model: {threads: 0}\n", "model.threads = '0': give auto or a number of at least 1"),
    ("jobs: {ingest_parallel: 0}\n", "jobs.ingest_parallel must be at least 1"),
    ("jobs: {max_file_mb: 0}\n", "jobs.max_file_mb must be at least 1"),
    ("model: {threads: many}\n", "model.threads = 'many': give auto or a number of at least 1"),
    ("- a list\n", "must be a YAML mapping"),
    ("model: [1]\n", "section 'model' must be a mapping"),
    ("model: {path: [unclosed\n", "not valid YAML"),
])
def test_validation_errors_are_clear(tmp_path, text, needle):
    path = write(tmp_path / "config.yaml", text)
    with pytest.raises(ConfigError) as exc:
        load_config(path, environ={})
    assert needle in str(exc.value) and str(path) in str(exc.value)


@pytest.mark.parametrize("cores,auto,codec,idle", [(1, 1, 0, 1), (2, 1, 2, 2), (3, 1, 2, 2), (4, 2, 1, 3),
                                                (8, 4, 3, 7)])
def test_cpu_threads_are_decided_once_from_the_cores(tmp_path, monkeypatch, cores, auto, codec, idle):
    """model.threads auto (the default; null too): a CPU engine's loop and its codec threads share the physical
    cores usable (two intra-op threads of the loop on 2 cores stall each other; from 3 cores one core is left
    to the rest of the daemon; a loop of one thread shares its core with the codec's threads, which split a
    call's rows and never wait for each other), the codec in the loop's thread on one core; a number is the loop's,
    the codec taking what is left (at least 1). While no codec call runs the loop takes every usable core
    (`idle`), unless a number is given. A GPU engine has no codec thread."""
    import engines.device.detect as detect
    from appliance.settings import engine_spec

    monkeypatch.setattr(detect, "cpu_cores", lambda: cores)
    assert Config().model.threads == "auto" and settings(Config()).threads == auto
    assert settings(load_config(write(tmp_path / "a.yaml", "model: {threads: null}\n"), environ={})).threads == auto
    three = load_config(write(tmp_path / "b.yaml", "model: {threads: 3, path: /m}\n"), environ={})
    assert settings(three).threads == 3
    auto_cfg = load_config(write(tmp_path / "c.yaml", "model: {path: /m}\n"), environ={})
    spec = engine_spec(auto_cfg, "cpu")
    assert (spec.threads, spec.codec_threads, spec.idle_threads) == (auto, codec, idle)
    assert engine_spec(three, "cpu").codec_threads == (max(1, cores - 3 - (cores > 2)) if cores > 1 else 0)
    assert engine_spec(three, "cpu").idle_threads == 3
    gpu = engine_spec(auto_cfg, "cuda:0")
    assert gpu.codec_threads == gpu.idle_threads == 0


def test_cpu_cores_follow_the_cgroup_quota(tmp_path, monkeypatch):
    import engines.device.detect as detect

    proc = write(tmp_path / "cgroup", "0::/box\n")
    write(tmp_path / "fs" / "box" / "cpu.max", "150000 100000\n")
    assert detect._cgroup_cpu_quota(proc, tmp_path / "fs") == 1.5
    write(tmp_path / "fs" / "box" / "cpu.max", "max 100000\n")
    assert detect._cgroup_cpu_quota(proc, tmp_path / "fs") is None
    proc = write(tmp_path / "cgroup1", "4:memory:/x\n3:cpu,cpuacct:/box\n")
    write(tmp_path / "fs" / "cpu,cpuacct" / "box" / "cpu.cfs_quota_us", "-1\n")
    write(tmp_path / "fs" / "cpu,cpuacct" / "box" / "cpu.cfs_period_us", "100000\n")
    assert detect._cgroup_cpu_quota(proc, tmp_path / "fs") is None
    write(tmp_path / "fs" / "cpu,cpuacct" / "box" / "cpu.cfs_quota_us", "100000\n")
    assert detect._cgroup_cpu_quota(proc, tmp_path / "fs") == 1.0
    monkeypatch.setattr(detect, "_cgroup_cpu_quota", lambda: 1.0)
    assert detect.cpu_cores() == 1  # however many cores the machine has


def test_bad_environment_override_names_the_source():
    with pytest.raises(ConfigError, match="environment: unknown key http.nope"):
        load_config(ROOT / "configs" / "default.yaml", environ={"TTS_APPLIANCE_HTTP__NOPE": "1"})


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "absent.yaml", environ={})


def test_daemon_check_exits_78_with_the_error(tmp_path):
    bad = write(tmp_path / "config.yaml", "http: {colour: red}\n")
    r = subprocess.run([sys.executable, "-m", "appliance.cli", "daemon", "--config", str(bad), "--check"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 78 and "unknown key http.colour" in r.stderr
    tiny = ROOT / "tests/data/tiny/cv_small"
    good = write(tmp_path / "ok.yaml", f"model: {{path: {tiny}}}\njobs: {{home: {tmp_path / 'home'}}}\n")
    r = subprocess.run([sys.executable, "-m", "appliance.cli", "daemon", "--config", str(good), "--check"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and "config OK" in r.stdout, r.stdout + r.stderr
    # a checkpoint folder that is not there fails the check too (the daemon could never start on it)
    gone = write(tmp_path / "gone.yaml", f"model: {{path: {tmp_path / 'x'}}}\njobs: {{home: {tmp_path / 'home'}}}\n")
    r = subprocess.run([sys.executable, "-m", "appliance.cli", "daemon", "--config", str(gone), "--check"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 78 and f"config error: model.path = {tmp_path / 'x'}: " in r.stderr, r.stderr


def test_runtime_dir_and_socket_defaults(tmp_path, monkeypatch):
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    cfg = Config()
    assert cfg.http_socket() == tmp_path / "xdg" / "tts-appliance" / "api.sock"
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(tmp_path / "rd"))
    assert cfg.wyoming_socket() == tmp_path / "rd" / "wyoming.sock"
    cfg.http.socket = ""
    assert cfg.http_socket() is None


def test_resolve_puts_command_line_flags_last(tmp_path):
    main = write(tmp_path / "config.yaml", "model: {path: /m, device: cpu, dtype: bfloat16}\njobs: {home: /spool}\n")
    cfg = resolve(main, environ={"TTS_APPLIANCE_MODEL__DTYPE": "float16", "TTS_APPLIANCE_MODEL": "/ignored"})
    assert (cfg.model.path, cfg.model.device, cfg.model.dtype, cfg.jobs.home) == ("/m", "cpu", "float16", "/spool")
    cfg = resolve(main, model=tmp_path / "other", device="cuda:1", dtype="float32", home="/h", environ={})
    assert (cfg.model.path, cfg.model.device, cfg.model.dtype, cfg.jobs.home) == (
        str(tmp_path / "other"), "cuda:1", "float32", "/h")
    with pytest.raises(ConfigError, match="command line: model.dtype = 'float8'; choose one of auto, float32, bfloat16"):
        resolve(main, dtype="float8", environ={})


def test_which_config_file(tmp_path):
    named = write(tmp_path / "named.yaml", "model: {path: /named}\n")
    write(tmp_path / "xdg" / "tts-appliance" / "config.yaml", "model: {path: /user}\n")
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert load_config(environ=env).model.path == "/user"
    assert load_config(environ={**env, "TTS_APPLIANCE_CONFIG": str(named)}).model.path == "/named"
    assert load_config(named, environ=env).model.path == "/named"
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(environ={"TTS_APPLIANCE_CONFIG": str(tmp_path / "absent.yaml")})


def test_choice_lists_come_from_the_engine():
    from engines.codec.build import RUNTIME_CHOICES
    from engines.model.checkpoint import DTYPES

    assert choices()[("model", "dtype")] == ("auto", *DTYPES)
    assert choices()[("runtime", "codec")] == RUNTIME_CHOICES


def test_group_config_reaches_every_command(tmp_path):
    from appliance.cli import cli

    home = tmp_path / "spool"
    cfg = write(tmp_path / "c.yaml", f"jobs: {{home: {home}}}\n")
    env = {"TTS_APPLIANCE_NO_DAEMON": "1", "TTS_APPLIANCE_MODEL": None, "TTS_APPLIANCE_HOME": None}
    r = CliRunner().invoke(cli, ["--config", str(cfg), "list", "--json"], env=env)
    assert r.exit_code == 0 and json.loads(r.output) == [] and not home.exists(), r.output  # reading makes nothing
    from jobs.document import Chapter, Document
    from jobs.queue import Queue
    from jobs.settings import JobSpec, resolve_home
    from jobs.submit import submit_document

    paths = resolve_home(home).ensure()
    q = Queue(paths.db)
    job = submit_document(q, paths, Document(chapters=[Chapter("One", ["Alpha is read."])]), JobSpec(voice="ryan"))
    q.close()
    r = CliRunner().invoke(cli, ["--config", str(cfg), "list", "--json"], env=env)
    assert r.exit_code == 0 and [j["id"] for j in json.loads(r.output)] == [job], r.output  # the config's spool
    r = CliRunner().invoke(cli, ["--config", str(cfg), "say", "Hi."], env=env)
    assert r.exit_code == 2 and "no model: pass --model PATH" in r.output and str(cfg) in r.output, r.output
    r = CliRunner().invoke(cli, ["--config", str(cfg), "work", "--until-idle"], env=env)
    assert r.exit_code == 1 and "no model" in r.output, r.output
    r = CliRunner().invoke(cli, ["--config", str(tmp_path / "absent.yaml"), "list"], env=env)
    assert r.exit_code == 1 and "no such config file" in r.output, r.output
    r = CliRunner().invoke(cli, ["--config", str(cfg), "daemon", "--print-config"], env=env)
    assert r.exit_code == 0 and json.loads(r.output)["jobs"]["home"] == str(home), r.output


def test_the_api_key_is_not_shown():
    cfg = resolve(environ={"TTS_APPLIANCE_HTTP__API_KEY": "s3cret"})
    assert cfg.http.api_key == "s3cret"
    assert as_dict(cfg)["http"]["api_key"] == "(set)" and "s3cret" not in json.dumps(as_dict(cfg))


def test_a_config_file_of_the_service_group_says_how_to_join_it(tmp_path, monkeypatch):
    """A user outside the service's group meets /etc/tts-appliance/config.yaml (0640 root:GROUP): the error names
    the group and how to join it, not only "Permission denied" (the live systemd test runs it as such a user)."""
    import grp
    import pathlib

    from appliance.config import ConfigError, resolve

    conf = tmp_path / "config.yaml"
    conf.write_text("model: {threads: 1}\n")
    group = grp.getgrgid(os.getgid()).gr_name
    if os.geteuid() == 0:  # as root (CI): give it a group one joins, as install.sh gives it tts-appliance
        group = next(g for g in ("users", "nogroup", "daemon") if g in {e.gr_name for e in grp.getgrall()})
        os.chown(conf, 0, grp.getgrnam(group).gr_gid)
    os.chmod(conf, 0o640)
    real = pathlib.Path.read_text

    def denied(self, *a, **k):
        if self == conf:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(pathlib.Path, "read_text", denied)
    with pytest.raises(ConfigError) as err:
        resolve(conf)
    msg = str(err.value)
    assert "Permission denied" in msg
    if group != "root":
        assert f"usermod -aG {group} $USER" in msg, msg
    else:  # a root-owned group is not one to join: the message says whom to ask
        assert "ask its administrator" in msg, msg


def test_the_shipped_file_lists_every_key_once_with_its_own_comment():
    """configs/default.yaml says it holds all keys, commented: every key of every section is written there (the
    values match the dataclasses: test above), and no line carries two comments (one key's comment on another's
    line)."""
    import dataclasses

    import yaml

    text = (ROOT / "configs" / "default.yaml").read_text()
    data = yaml.safe_load(text)
    for name, section in as_dict(Config()).items():
        missing = sorted(set(section) - set(data.get(name) or {}))
        assert not missing, f"configs/default.yaml lacks {name}: {missing}"
    assert [f.name for f in dataclasses.fields(Config) if f.name in data] == list(data)
    doubled = [line for line in text.splitlines() if line.split("#", 1)[-1].count("  #") and ": " in line]
    assert not doubled, doubled


def test_the_commands_the_docs_say_take_json_are_those_that_do():
    """README.md and docs/APPLIANCE.md name the commands with --json; the command line is the truth."""
    import re

    from appliance.cli import cli

    has = {name for name, cmd in cli.commands.items() if any("--json" in p.opts for p in cmd.params)}
    for doc in ("README.md", "docs/APPLIANCE.md"):
        text = " ".join((ROOT / doc).read_text().split())
        m = re.search(r"commands that report \(([^)]*)\)", text)
        assert m, f"{doc}: no list of the commands that take --json"
        assert set(m.group(1).replace(" ", "").split(",")) == has, (doc, m.group(1), sorted(has))
