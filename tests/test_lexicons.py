"""Pronunciation lexicons: the jobs.lexicon file (read again when it changes, checked with the config),
a job's own entries over it (stored in its spec, applied when it is segmented) and the CLI's --lexicon."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from text.normalize.lexicon import LexiconError
from text.lexicons import file_lexicon, lexicon_entries, merged
from text.normalize.lexicon import Lexicon
from jobs.queue import Queue
from jobs.settings import JobSpec, resolve_home, with_defaults
from jobs.submit import job_defaults, submit_file

TINY = Path(__file__).parent / "data" / "tiny"


def test_the_file_is_read_again_when_it_changes(tmp_path):
    path = tmp_path / "words.yaml"
    path.write_text("Qwen: chwen\n")
    assert file_lexicon(str(path)).apply("Qwen speaks.") == "chwen speaks."
    path.write_text("Qwen: kwen\nnginx: engine x\n")
    os.utime(path, ns=(1, 10**18))  # a new mtime, whatever the clock's resolution
    assert file_lexicon(str(path)).apply("Qwen on nginx.") == "kwen on engine x."
    assert not file_lexicon(None)
    with pytest.raises(LexiconError, match="jobs.lexicon: cannot read"):
        file_lexicon(str(tmp_path / "gone.yaml"))


def test_entries_are_checked_and_merged():
    assert lexicon_entries(None, "spec") == {}
    for bad in (["Qwen"], {"Qwen": 3}, "Qwen: chwen"):
        with pytest.raises(LexiconError, match="'lexicon' must map words"):
            lexicon_entries(bad, "spec")
    with pytest.raises(ValueError, match="'lexicon' must map words"):
        JobSpec(lexicon={"Qwen": None})
    assert merged(Lexicon({"a": "file", "b": "file"}), {"b": "mine"}).entries == {"a": "file", "b": "mine"}
    assert with_defaults({"lexicon": {"b": "job"}}, {"lexicon": {"a": "cfg", "b": "cfg"}})["lexicon"] == \
        {"a": "cfg", "b": "job"}  # the job's entries over the config file's


def test_a_config_lexicon_that_cannot_be_read_is_a_config_error(tmp_path):
    from appliance.config import ConfigError, resolve

    bad = tmp_path / "bad.yaml"
    bad.write_text("- just a word\n")
    with pytest.raises(ConfigError, match="jobs.lexicon: Lexicon list items must be mappings"):
        resolve(environ={"TTS_APPLIANCE_JOBS__LEXICON": str(bad)})


def test_a_job_is_segmented_with_its_lexicon(tmp_path):
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(paths.db)
    src = tmp_path / "book.txt"
    src.write_text("Qwen reads on nginx.\n")
    cfg = tmp_path / "words.yaml"
    cfg.write_text("Qwen: chwen\nnginx: engine x\n")
    spec = JobSpec.from_dict(with_defaults({"voice": "ryan", "lexicon": {"nginx": "N G I N X"}},
                                           job_defaults("ryan", "english", None, lexicon=str(cfg))))
    job_id, err = submit_file(q, paths, src, spec)
    assert err is None
    [seg] = q.segments(job_id)
    assert seg["text"] == "chwen reads on N G I N X."
    assert json.loads(q.job(job_id)["spec"])["lexicon"] == {"Qwen": "chwen", "nginx": "N G I N X"}  # kept with it
    q.close()


def test_cli_submit_takes_a_lexicon_file(tmp_path):
    from appliance.cli import cli

    home = tmp_path / "home"
    src = tmp_path / "book.txt"
    src.write_text("Qwen reads on nginx.\n")
    (tmp_path / "job.yaml").write_text("entries:\n  nginx: engine x\n")
    (tmp_path / "cfg.yaml").write_text("Qwen: chwen\n")
    env = {"TTS_APPLIANCE_MODEL": str(TINY / "cv_small"), "TTS_APPLIANCE_NO_DAEMON": "1", "TTS_APPLIANCE_SOCKET": None,
           "TTS_APPLIANCE_JOBS__LEXICON": str(tmp_path / "cfg.yaml")}
    r = CliRunner().invoke(cli, ["submit", str(src), "--home", str(home), "--lexicon", str(tmp_path / "job.yaml"),
                                 "--json"], env=env)
    assert r.exit_code == 0, r.output
    q = Queue(home / "queue.db")
    [seg] = q.segments(json.loads(r.stdout)[0]["job_id"])
    assert seg["text"] == "chwen reads on engine x."
    q.close()
    r = CliRunner().invoke(cli, ["submit", str(src), "--home", str(home), "--lexicon", str(tmp_path / "gone.yaml")],
                           env=env)
    assert r.exit_code != 0 and "Lexicon file not found" in r.output
