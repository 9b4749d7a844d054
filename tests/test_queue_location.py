"""Where the queue lives (jobs.queue, jobs.queue_file), parsed strictly: a mistyped URL is an error naming
the key, never a private SQLite file named after the URL; the database password appears in no log line,
error message, report or file name."""
from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from appliance.config import ConfigError, as_dict, load_config
from jobs.queue import Queue, QueueError
from jobs.queue.location import parse_location, redact
from jobs.settings import resolve_home

from pg_util import pg_server
from test_queue_startup import run_cli

TYPOS = ["postgresql:/tts:secret@db.lan/tts", "postgresql:tts:secret@db.lan/tts",
         "postgresql+psycopg://tts:secret@db.lan/tts", "mysql://tts:secret@db.lan/tts",
         "sqlite:///var/lib/q.db", "queue.db", "tts:secret@db.lan/tts", "host=db.lan password=secret"]


@pytest.mark.parametrize("value, expected", [
    ("postgresql://tts:pw@db.lan:5433/tts", "postgresql://tts:pw@db.lan:5433/tts"),
    ("PostgreSQL://tts@db.lan/tts", "postgresql://tts@db.lan/tts"),
    ("POSTGRES://db.lan/tts", "postgres://db.lan/tts"),
    (" postgresql://db.lan/tts\n", "postgresql://db.lan/tts"),
    ("/srv/tts/queue.db", Path("/srv/tts/queue.db")),
    ("~/queue.db", Path("~/queue.db").expanduser()),
])
def test_valid_locations(value, expected):
    assert parse_location(value) == expected


@pytest.mark.parametrize("value", TYPOS)
def test_mistyped_locations_name_the_key_and_hide_the_password(value):
    with pytest.raises(ValueError) as exc:
        parse_location(value)
    msg = str(exc.value)
    assert msg.startswith("jobs.queue = ") and "secret" not in msg, msg
    assert "postgresql://user@host" in msg or "absolute" in msg, msg


def test_redact_hides_passwords_in_urls_and_messages():
    for text in ("postgresql://tts:secret@db/tts", "postgresql:/tts:secret@db/tts",
                 "postgresql://tts:se@cret@db/tts", "postgresql://:secret@db/tts",
                 "postgresql://db/tts?user=tts&password=secret",
                 "lost the queue database 'postgresql://tts:secret@db:5432/tts': server closed"):
        shown = redact(text)
        assert "secret" not in shown and "cret" not in shown and "***" in shown, shown
    assert redact("postgresql://tts@db/tts") == "postgresql://tts@db/tts"
    assert redact("FATAL: password authentication failed for user \"tts\"") == \
        "FATAL: password authentication failed for user \"tts\""


@pytest.mark.parametrize("value", TYPOS[:4])
def test_queue_refuses_a_mistyped_url_and_creates_no_file(tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(QueueError, match="jobs.queue = ") as exc:
        Queue(value)
    assert "secret" not in str(exc.value)
    assert list(tmp_path.iterdir()) == []  # no folder named after the URL


@pytest.mark.parametrize("value", TYPOS)
def test_config_refuses_a_mistyped_queue(tmp_path, value):
    main = tmp_path / "c.yaml"
    main.write_text(json.dumps({"jobs": {"queue": value}}))
    with pytest.raises(ConfigError) as exc:
        load_config(main, environ={})
    msg = str(exc.value)
    assert msg.startswith(f"{main}: jobs.queue = ") and "secret" not in msg, msg


def test_environment_sets_the_queue_and_print_config_hides_the_password(tmp_path):
    url = "postgresql://tts:secret@db.lan/tts"
    main = tmp_path / "c.yaml"
    main.write_text("{}\n")
    cfg = load_config(main, environ={"TTS_APPLIANCE_JOBS__QUEUE": url})
    assert cfg.jobs.queue == url and cfg.home().db == url
    assert as_dict(cfg)["jobs"]["queue"] == "postgresql://tts:***@db.lan/tts"
    with pytest.raises(ConfigError, match="environment: jobs.queue = 'postgresql:/x'"):
        load_config(main, environ={"TTS_APPLIANCE_JOBS__QUEUE": "postgresql:/x"})

    from appliance.cli import cli

    env = {"TTS_APPLIANCE_CONFIG": str(main), "TTS_APPLIANCE_MODEL": None, "TTS_APPLIANCE_SOCKET": None,
           "TTS_APPLIANCE_JOBS__QUEUE": url, "TTS_APPLIANCE_JOBS__HOME": str(tmp_path / "home")}
    r = CliRunner().invoke(cli, ["daemon", "--print-config"], env=env)
    assert r.exit_code == 0 and "tts:***@db.lan" in r.output and "secret" not in r.output, r.output
    r = CliRunner().invoke(cli, ["info", "--json", "--no-daemon"], env=env)
    assert r.exit_code == 0 and "secret" not in r.output, r.output
    assert json.loads(r.output)["paths"]["queue"] == "postgresql://tts:***@db.lan/tts"


def test_queue_file_holds_the_url(tmp_path):
    secret = tmp_path / "queue.url"
    secret.write_text("postgresql://tts:secret@db.lan/tts\n")
    secret.chmod(0o600)
    main = tmp_path / "c.yaml"
    main.write_text(json.dumps({"jobs": {"queue_file": str(secret), "home": str(tmp_path / "home")}}))
    cfg = load_config(main, environ={})
    assert cfg.home().db == "postgresql://tts:secret@db.lan/tts"  # read when the queue is opened
    assert "secret" not in json.dumps(as_dict(cfg))

    secret.write_text("postgresql:/tts:secret@db.lan/tts\n")
    with pytest.raises(QueueError) as exc:
        cfg.home().db
    assert str(exc.value).startswith(f"jobs.queue_file = '{secret}': jobs.queue = ") and "secret@" not in str(exc.value)
    with pytest.raises(QueueError, match="cannot read it .*readable by the service"):
        resolve_home(tmp_path, queue_file=str(tmp_path / "absent")).db

    for bad, needle in [({"queue_file": "queue.url"}, "jobs.queue_file = 'queue.url': give an absolute path"),
                        ({"queue_file": str(secret), "queue": "/srv/q.db"}, "set jobs.queue or jobs.queue_file")]:
        main.write_text(json.dumps({"jobs": bad}))
        with pytest.raises(ConfigError, match=needle):
            load_config(main, environ={})


@pytest.mark.parametrize("args", [("list",), ("work", "--until-idle")])
def test_commands_refuse_a_mistyped_url_without_showing_the_password(tmp_path, args):
    r = run_cli(tmp_path, "postgresql:/tts:secret@127.0.0.1:1/tts", *args)
    assert r.returncode != 0 and "Traceback" not in r.stderr + r.stdout
    assert "jobs.queue = " in r.stderr and "secret" not in r.stdout + r.stderr, r.stderr
    assert not any("secret" in p.name for p in tmp_path.rglob("*"))  # no folder named after the URL


def test_daemon_refuses_a_mistyped_url_as_a_config_error(tmp_path):
    r = run_cli(tmp_path, "postgresql+psycopg://tts:secret@127.0.0.1:1/tts", "daemon")
    assert r.returncode == 78, r.stderr  # EX_CONFIG
    assert "config error: environment: jobs.queue = " in r.stderr and "secret" not in r.stdout + r.stderr


def test_postgresql_url_in_any_case_and_migrations_log_no_password(caplog, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a misread URL would become a folder
    pg = pg_server()
    try:
        url = pg.url(f"t{uuid.uuid4().hex[:12]}")
        shouted = "PostgreSQL" + url[len("postgresql"):]
        with caplog.at_level(logging.INFO, logger="jobs.queue"):
            q = Queue(shouted)
        assert q.store.dialect == "postgresql" and q.path == url
        lines = [r.getMessage() for r in caplog.records if "applied migration" in r.getMessage()]
        assert lines and all(":***@" in ln and "secret" not in ln for ln in lines), lines
        q.close()
    finally:
        pg.stop()
