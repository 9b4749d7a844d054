"""A database password holding reserved characters (`%`, `@`, `/`, `?`, `#`, spaces) never shows in any
output: errors, logs, `info` (text and --json), `daemon --check`, the status line and /health (one probe).
A URL the database library could not read is a one-line config error saying how to write it; one with a
raw `@`, `/` or space in its password (the user part ends at the last `@`) connects with exactly that
password."""
from __future__ import annotations

import json
import logging
import re
import uuid
from urllib.parse import unquote

import pytest

from jobs.queue import Queue, QueueError
from jobs.queue.location import parse_location, redact

from test_queue_startup import run_cli

PIECES = ("Qz7", "Kv9", "Wm4", "Pj2", "Rt5")  # the passwords below are made of these: none may show
RAW = "Qz7@Kv9 Wm4/Pj2?Rt5"                   # reserved characters written as they are: accepted
BAD = ["Qz7%Kv9 Wm4", "Qz7Kv9%", "Qz7@Kv9%zzWm4"]  # a '%' not followed by two hex digits: refused
REFUSED_PORT = "127.0.0.1:1"                 # nothing listens: connection refused


def shows_password(text: str) -> list[str]:
    return [p for p in PIECES if p in text]


@pytest.mark.parametrize("password", BAD)
def test_a_percent_without_two_hex_digits_is_a_one_line_error_without_the_password(password):
    with pytest.raises(ValueError) as exc:
        parse_location(f"postgresql://tts:{password}@db.lan/tts")
    msg = str(exc.value)
    assert "\n" not in msg and not shows_password(msg), msg
    assert msg.startswith("jobs.queue = 'postgresql://tts:***@db.lan/tts': the password holds a '%'"), msg
    assert "%25" in msg and "percent-encoded" in msg and "~/.pgpass" in msg, msg


@pytest.mark.parametrize("written, password", [(RAW, RAW), ("Qz7%40Kv9%20Wm4", "Qz7@Kv9 Wm4"),
                                               ("Qz7%25Kv9:Wm4#Pj2", "Qz7%Kv9:Wm4#Pj2")])
def test_reserved_characters_raw_or_encoded_reach_the_database_as_written(written, password):
    url = parse_location(f"PostgreSQL://tts:{written}@db.lan:5433/tts?sslmode=prefer")
    userinfo, _, rest = url[len("postgresql://"):].rpartition("@")
    assert rest == "db.lan:5433/tts?sslmode=prefer" and userinfo.count(":") == 1, url
    assert unquote(userinfo.split(":")[1]) == password  # what the library decodes
    assert redact(url) == "postgresql://tts:***@db.lan:5433/tts?sslmode=prefer"
    for text in (url, f"lost 'postgresql://tts:{written}@db.lan/tts': {password} x", f"password={written}&x"):
        assert not shows_password(redact(text)), redact(text)


def test_a_password_where_the_host_belongs_and_in_parameters_is_masked():
    with pytest.raises(ValueError) as exc:  # no '@': libpq would read host 'tts', port 'Qz7Kv9'
        parse_location("postgresql://tts:Qz7Kv9/tts")
    assert "port is a number" in str(exc.value) and not shows_password(str(exc.value)), exc.value
    with pytest.raises(ValueError) as exc:
        parse_location("postgresql://db.lan/tts?password=Qz7%Kv9 Wm4&sslmode=require")
    assert "database name or parameters" in str(exc.value) and not shows_password(str(exc.value)), exc.value
    url = parse_location("postgresql://db.lan/tts?password=Qz7 Kv9")
    assert url == "postgresql://db.lan/tts?password=Qz7%20Kv9" and redact(url) == "postgresql://db.lan/tts?password=***"


@pytest.mark.parametrize("password", [RAW, BAD[0]])
def test_commands_never_show_the_password(tmp_path, password):
    """`list`, `info` (text and --json) and `daemon --check` on a URL the old code handed to the library as
    it was: a traceback ending in the password (`%`, space) or its tail in "failed to resolve host"."""
    url = f"postgresql://tts:{password}@{REFUSED_PORT}/tts"
    bad = "%" in password
    for args in (("list",), ("info", "--no-daemon"), ("info", "--no-daemon", "--json"), ("daemon", "--check")):
        r = run_cli(tmp_path, url, *args)
        out = r.stdout + r.stderr
        assert not shows_password(out) and "Traceback" not in out, (args, out[-3000:])
        if args[0] == "daemon":
            assert r.returncode == 78, out  # EX_CONFIG: a malformed URL, or a server that cannot be reached
            [line] = r.stderr.strip().splitlines()
            assert line.startswith("config error: "), line
            assert ("'%' not followed by two hex digits" if bad else "refused") in line, line
        elif bad:
            assert r.returncode != 0 and "the password holds a '%'" in out, out
    if not bad:  # info reports the queue it could not read, masked
        r = run_cli(tmp_path, url, "info", "--no-daemon", "--json")
        paths = json.loads(r.stdout)["paths"]
        assert paths["queue"] == f"postgresql://tts:***@{REFUSED_PORT}/tts", paths
        assert "cannot connect to the queue database" in paths["jobs"]["error"], paths


def test_the_status_line_and_health_probe_show_no_password(tmp_path, caplog):
    """The daemon's view of an unreachable queue (STATUS=, /health's `queue.error`, the outage log line)."""
    from appliance.config import Config
    from appliance.daemon import Daemon
    from appliance.settings import settings

    cfg = Config()
    cfg.jobs.home, cfg.jobs.queue = str(tmp_path / "home"), f"postgresql://tts:{RAW}@{REFUSED_PORT}/tts"
    with caplog.at_level(logging.WARNING):
        state = Daemon(settings(cfg)).queue_state()
    assert not state.ok and "cannot connect to the queue database" in state.error, state.error
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert not shows_password(state.error + logged), (state.error, logged)


def test_a_password_with_reserved_characters_connects_and_stays_hidden(pg, tmp_path, caplog):
    """A role whose password holds '@', a space, '/', '?' and '%' (written %25): the URL with them as they
    are connects; a wrong one fails naming authentication; nothing shows the password."""
    import psycopg

    from appliance.logs import Masked

    role, db, password = f"r{uuid.uuid4().hex[:8]}", f"t{uuid.uuid4().hex[:12]}", RAW + "%Wm4"
    with psycopg.connect(pg.url("postgres"), autocommit=True) as c:
        c.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        c.execute(f'CREATE DATABASE "{db}" OWNER {role}')
    written = f"postgresql://{role}:{password.replace('%', '%25')}@127.0.0.1:{pg.port}/{db}"
    with caplog.at_level(logging.INFO, logger="jobs.queue"):
        q = Queue(written)
    try:
        assert q.store.dialect == "postgresql" and q.job_counts() == {}
        assert q.where == f"postgresql://{role}:***@127.0.0.1:{pg.port}/{db}"
    finally:
        q.close()
    lines = [r.getMessage() for r in caplog.records]
    assert any("applied migration" in ln for ln in lines) and not shows_password(" ".join(lines)), lines
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "could not use %s", (written,), None)
    assert not shows_password(Masked().format(record))  # the daemon's and the CLI's log lines

    with pytest.raises(QueueError) as exc:
        Queue(written.replace("Wm4/", "Wm5/"))
    msg = str(exc.value)
    assert re.search("password authentication failed.*; authentication failed: check the user name and password",
                     msg) and not shows_password(msg), msg
