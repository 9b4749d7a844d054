"""`tts-appliance daemon --check` (which `systemctl reload` runs first) opens the queue, read only and
within seconds: a wrong password, a port where nothing listens or nothing answers, a missing database
or `jobs.queue_file`, a SQLite file that cannot be opened or made each fail it with exit status 78
(EX_CONFIG) and one line naming what fails, the password never shown; a queue that works passes, and
nothing is created."""
from __future__ import annotations

import socket
import time
import uuid

import pytest
import yaml

from test_queue_startup import run_cli


@pytest.fixture
def check(tmp_path, monkeypatch, capsys):
    """`daemon --check` in this process on a config with `jobs` keys -> (exit status, stdout, stderr)."""
    import appliance.daemon as daemon

    monkeypatch.setattr(daemon, "setup_logging", lambda level: None)  # keep pytest's log capture
    for name in ("TTS_APPLIANCE_CONFIG", "TTS_APPLIANCE_JOBS__QUEUE", "TTS_APPLIANCE_JOBS__HOME"):
        monkeypatch.delenv(name, raising=False)

    def run(**jobs):
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump({"jobs": {"home": str(tmp_path / "home"), **jobs},
                                        "service": {"runtime_dir": str(tmp_path / "run")}}))
        status = daemon.main(str(path), check_only=True)
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
