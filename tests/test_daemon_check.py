"""`tts-appliance daemon --check` (which `systemctl reload` runs first) opens the queue, read only and
within seconds: a wrong password, a port where nothing listens or nothing answers, a missing database
or `jobs.queue_file`, a SQLite file that cannot be opened or made each fail it with exit status 78
(EX_CONFIG) and one line naming what fails, the password never shown; a queue that works passes, and
nothing is created. A device of model.device that is not on this machine, or a checkpoint whose files do not
read, fail the check and the daemon's start the same way (78: the unit does not restart it), and `say` on such a
device says so in one line."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from test_queue_startup import run_cli

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests/data/tiny/cv_small"


@pytest.fixture
def check(tmp_path, monkeypatch, capsys):
    """`daemon --check` in this process on a config with `jobs` keys -> (exit status, stdout, stderr)."""
    import appliance.daemon as daemon

    monkeypatch.setattr(daemon, "setup_logging", lambda level: None)  # keep pytest's log capture
    for name in ("TTS_APPLIANCE_CONFIG", "TTS_APPLIANCE_JOBS__QUEUE", "TTS_APPLIANCE_JOBS__HOME"):
        monkeypatch.delenv(name, raising=False)

    def run(model=None, check_only=True, **jobs):
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump({"jobs": {"home": str(tmp_path / "home"), **jobs}, "model": model or {},
                                        "service": {"runtime_dir": str(tmp_path / "run")}}))
        status = daemon.main(str(path), check_only=check_only)
        out = capsys.readouterr()
        return status, out.out, out.err

    return run


def _fails(result, *needles):
    status, out, err = result
    assert status == 78 and out == "", result
    [line] = err.strip().splitlines()
    assert line.startswith("config error: queue: ") and "secret" not in line and "wrong" not in line, line
    for needle in needles:
        assert needle in line, line
    return line


def test_a_reachable_postgresql_queue_passes_and_a_wrong_one_fails(pg, check, tmp_path):
    url = pg.url(f"t{uuid.uuid4().hex[:12]}")
    status, out, err = check(queue=url)
    assert status == 0 and "config OK" in out and "reachable" in out and "secret" not in out, (out, err)
    assert f"tts:***@127.0.0.1:{pg.port}" in out
    _fails(check(queue=url.replace(":secret@", ":wrong@")), "password authentication failed",
           "check the user name and password")
    _fails(check(queue=url.rsplit("/", 1)[0] + "/nodb"), 'database "nodb" does not exist', "createdb")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    _fails(check(queue=f"postgresql://tts:secret@127.0.0.1:{closed}/tts"), "refused", "is PostgreSQL running")

    import psycopg  # the PostgreSQL queue's driver (the pg fixture has it); the module's other tests need none

    from jobs.queue import Queue

    Queue(url).close()  # the tables, owned by tts; a role that may connect but not read them:
    role = f"r{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg.url("postgres"), autocommit=True) as c:
        c.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'secret'")
    _fails(check(queue=url.replace("//tts:", f"//{role}:")), "cannot read the queue database", "permission denied")

    secret = tmp_path / "queue.url"
    secret.write_text(url + "\n")
    status, out, _ = check(queue_file=str(secret))
    assert status == 0 and "reachable" in out and "secret" not in out, out
    _fails(check(queue_file=str(tmp_path / "absent.url")), "jobs.queue_file = ", "cannot read it",
           "No such file or directory")


def test_a_server_that_never_answers_fails_within_seconds(check):
    """A port that accepts connections and says nothing (a hung server, a half-open firewall): the check
    gives up after its connect timeout (5 s), where a connection without one waits for ever."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        start = time.monotonic()
        line = _fails(check(queue=f"postgresql://tts:secret@127.0.0.1:{silent.getsockname()[1]}/tts"),
                      "no answer within 5 s")
        took = time.monotonic() - start
    assert took < 60, (took, line)  # bounded (generous: a loaded machine), not the OS's TCP timeouts


def test_sqlite_queues(check, tmp_path):
    status, out, err = check(queue=str(tmp_path / "new" / "queue.db"))  # made at the first start
    assert status == 0 and "no queue yet" in out, (out, err)
    assert not (tmp_path / "new").exists()  # a check creates nothing
    status, out, _ = check()  # HOME/queue.db
    assert status == 0 and str(tmp_path / "home" / "queue.db") in out, out

    blocker = tmp_path / "file"
    blocker.write_text("x")
    _fails(check(queue=str(blocker / "queue.db")), f"cannot make the queue database {blocker}/queue.db", "no folder")
    folder = tmp_path / "folder.db"
    folder.mkdir()
    _fails(check(queue=str(folder)), f"cannot open the queue database {folder}: it is no file")
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database\n" * 512)
    _fails(check(queue=str(garbage)), f"cannot open the queue database {garbage}", "not a database")


def test_the_command_exits_78_on_a_wrong_password(pg, tmp_path):
    url = pg.url(f"t{uuid.uuid4().hex[:12]}").replace(":secret@", ":wrong@")
    r = run_cli(tmp_path, url, "daemon", "--check")
    assert r.returncode == 78 and "Traceback" not in r.stderr, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("config error: queue: cannot connect to the queue database postgresql://tts:***@"), line
    assert "authentication failed" in line and "wrong" not in r.stdout + r.stderr, line


def _missing(device: str):
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    from engines.device.npu import npu_available

    if device.startswith("npu") and npu_available():
        pytest.skip("this machine has an Ascend NPU")


@pytest.mark.parametrize("device, says", [("cuda", "no CUDA GPU is visible here"),
                                          ("npu", "no Ascend NPU is visible here")])
def test_a_device_that_is_not_there_fails_the_check_and_the_start_with_78(check, device, says):
    _missing(device)
    for check_only in (True, False):  # `daemon --check`, and the start itself: before any model loads
        status, out, err = check(model={"path": str(TINY), "device": device}, check_only=check_only)
        [line] = err.strip().splitlines()
        assert status == 78 and line.startswith(f"config error: model.device = {device}: {says}"), (status, err)
        assert "set model.device to auto or cpu" in line and "config OK" not in out, line


def test_a_checkpoint_that_does_not_read_fails_the_check_with_78(check, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{ not json")
    status, out, err = check(model={"path": str(broken)})
    [line] = err.strip().splitlines()
    assert status == 78 and line.startswith(f"config error: model.path = {broken}: "), err


def test_say_on_a_device_that_is_not_there_is_one_line_saying_what_to_set(tmp_path):
    _missing("cuda")
    r = subprocess.run([sys.executable, "-m", "appliance.cli", "say", "Hello.", "--model", str(TINY), "--voice", "ryan",
                        "--device", "cuda", "-o", str(tmp_path / "x.wav")], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={k: v for k, v in os.environ.items()
                                         if not k.startswith("TTS_APPLIANCE_")})
    errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert r.returncode != 0 and len(errors) == 1, r.stderr
    assert "no CUDA GPU is visible here" in errors[0] and "--device cpu" in errors[0], errors
    assert "internal engine error" not in r.stderr and not (tmp_path / "x.wav").exists()
