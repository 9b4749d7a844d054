"""Daemons sharing one queue record their spool folder (jobs.home) there and see each other's: one whose
folder is another (a different path, or the same path that is not one shared folder) is warned of at
start, naming both folders and docs/SCALE.md; daemons with one folder are not; `info` lists them all.
Each daemon here is the daemon's own view of its queue (`appliance.queue_view.QueueView`: what
`Daemon.run` opens first and every status tick renews), on SQLite and on PostgreSQL."""
from __future__ import annotations

import json
import logging
import uuid
from contextlib import closing

import pytest

from appliance.queue_view import QueueView
from jobs.queue import Queue
from jobs.queue.daemons import BEAT_S, GONE_S, SPOOL_ID
from jobs.settings import resolve_home

from daemon_util import Daemon, base_config, needs_daemon


def _start(tmp_path, location, home: str, instance=None) -> QueueView:
    view = QueueView(resolve_home(tmp_path / home, queue=str(location)).ensure(), instance)
    view.counts()  # as Daemon.run does before it loads the model
    return view


def _renew(view: QueueView, location) -> None:
    """The view's next renewal (a status tick BEAT_S later)."""
    with closing(Queue(location)) as q:
        view.peers.beat(q, now=view.peers.last + BEAT_S)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "spool folder" in r.getMessage()]


def test_daemons_with_different_homes_are_warned_of(location, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    first = _start(tmp_path, location, "a")
    assert _warnings(caplog) == []  # alone
    second = _start(tmp_path, location, "b")
    home_a, home_b = str((tmp_path / "a").resolve()), str((tmp_path / "b").resolve())
    [line] = _warnings(caplog)
    assert f"spool folder (jobs.home) {home_a}" in line and f"is {home_b}" in line and "docs/SCALE.md" in line, line
    assert f"pid {first.peers.row['pid']}" in line

    caplog.clear()  # the first daemon learns of the second at its next renewal, once
    _renew(first, location)
    [line] = _warnings(caplog)
    assert f"spool folder (jobs.home) {home_b}" in line and f"is {home_a}" in line, line
    _renew(first, location)
    assert len(_warnings(caplog)) == 1

    with Queue.reading(location) as q:
        assert [d["home"] for d in q.daemons()] == [home_a, home_b]
    second.leave()
    with Queue.reading(location) as q:
        assert [d["home"] for d in q.daemons()] == [home_a]
    first.leave()


def test_daemons_sharing_one_home_are_not_warned_of(location, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    views = [_start(tmp_path, location, "shared", instance=str(i)) for i in range(2)]
    for v in views:
        _renew(v, location)
    assert _warnings(caplog) == []
    assert (tmp_path / "shared" / SPOOL_ID).is_file()
    assert len({v.peers.row["spool"] for v in views}) == 1 and views[0].peers.row["spool"]
    for v in views:
        v.leave()


def test_the_same_path_that_is_not_one_shared_folder_is_warned_of(location, tmp_path, caplog):
    """Two hosts with /srv/tts each on their own disk: the path matches, the folder's spool.id does not."""
    caplog.set_level(logging.WARNING)
    first = _start(tmp_path, location, "srv")
    other = QueueView(resolve_home(tmp_path / "srv", queue=str(location)))
    other.peers.row["spool"] = "0123456789abcdef"  # what the other host's own folder holds
    other.counts()
    [line] = _warnings(caplog)
    assert "not the same folder" in line and str((tmp_path / "srv").resolve()) in line and SPOOL_ID in line, line
    first.leave()
    other.leave()


def test_daemons_gone_do_not_count(location, tmp_path):
    view = _start(tmp_path, location, "a")
    row = dict(view.peers.row, id="stale", home="/elsewhere", host="far-away-host")
    with closing(Queue(location)) as q:
        q.daemon_seen(row, now=view.peers.last - GONE_S - 1)   # unseen for too long
        q.daemon_seen(dict(row, id="dead", host=view.peers.row["host"], pid=2 ** 22 + 7))  # no such process here
        assert [d["id"] for d in q.daemons()] == [view.peers.id]
    view.leave()


def test_info_lists_the_daemons_sharing_the_queue(location, tmp_path):
    from appliance.cli import cli
    from click.testing import CliRunner

    views = [_start(tmp_path, location, home) for home in ("a", "b")]
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"jobs": {"home": str(tmp_path / "a"), "queue": str(location)}}))
    env = {"TTS_APPLIANCE_CONFIG": str(config), "TTS_APPLIANCE_MODEL": None, "TTS_APPLIANCE_SOCKET": None}
    r = CliRunner().invoke(cli, ["info", "--json", "--no-daemon"], env=env)
    assert r.exit_code == 0, r.output
    daemons = json.loads(r.output)["paths"]["daemons"]
    assert [d["home"] for d in daemons] == [str((tmp_path / h).resolve()) for h in ("a", "b")], daemons
    r = CliRunner().invoke(cli, ["info", "--no-daemon"], env=env)
    assert f"spool folder {(tmp_path / 'b').resolve()}" in r.output and "different spool folders" in r.output, r.output
    assert "secret" not in r.output
    for v in views:
        v.leave()


@pytest.fixture(autouse=True)
def _no_stray_config(monkeypatch):
    for name in ("TTS_APPLIANCE_JOBS__QUEUE", "TTS_APPLIANCE_JOBS__HOME"):
        monkeypatch.delenv(name, raising=False)


@needs_daemon
def test_two_daemons_with_their_own_homes_on_one_postgresql_queue(pg, tmp_path):
    """The set-up of the defect: two daemons, one PostgreSQL queue, a jobs.home each. The second says so
    at start; `info` lists both; each removes its row when it stops."""
    url = pg.url(f"t{uuid.uuid4().hex[:12]}")
    daemons = []
    try:
        for name in ("a", "b"):
            cfg = base_config(tmp_path / name, runtime={"engine_process": False, "max_slots": 2},
                              model={"warmup": False}, jobs={"queue": url, "watch": False, "enabled": False})
            (tmp_path / name).mkdir()
            daemons.append(Daemon(tmp_path / name, cfg).start())
        home_a, home_b = (str(d.home.resolve()) for d in daemons)
        [line] = [ln for ln in daemons[1].log_text().splitlines() if " WARNING " in ln and "shares this queue" in ln]
        assert f"(jobs.home) {home_a}" in line and f"is {home_b}" in line and "docs/SCALE.md" in line, line
        assert "shares this queue" not in daemons[0].log_text()  # alone at its start (told at its next renewal)
        assert "secret" not in daemons[1].log_text()
        with Queue.reading(url) as q:
            assert [d["home"] for d in q.daemons()] == [home_a, home_b]
    finally:
        for d in daemons:
            d.stop()
    with Queue.reading(url) as q:
        assert q.daemons() == []
