"""Submitting jobs: defaults from the config (jobs.voice, jobs.language, jobs.instruct), idempotent
submits (same content + options -> same job, also while the first is ingesting), and the CLI's
behaviour towards a daemon: checks before uploading, and errors instead of silent in-process work
when a configured daemon cannot be reached."""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobs.queue import Queue
from jobs.queue.submissions import holder
from jobs.settings import JobSpec, resolve_home, with_defaults
from engines.catalog import Catalog
from jobs.submit import job_defaults, submit_file, submit_key

TINY = Path(__file__).parent / "data" / "tiny"
BOOK = "Alpha sentence one is read aloud.\n\nBravo sentence two is read aloud.\n"


@pytest.fixture
def spool(tmp_path):
    paths = resolve_home(tmp_path / "home").ensure()
    q = Queue(paths.db)
    yield paths, q
    q.close()


def book(tmp_path: Path, name: str = "book.txt", text: str = BOOK) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# -- defaults --------------------------------------------------------------------------------
def checkpoint_voices(path) -> tuple:
    """(model type, voices) of a checkpoint, as the settings read them (appliance.settings.catalog)."""
    cat = Catalog.from_dir(path)
    return cat.model_type, cat.voices


def test_custom_voice_without_jobs_voice_uses_the_first_speaker(caplog):
    with caplog.at_level(logging.INFO, logger="jobs.submit"):
        d = job_defaults(None, "auto", "ignored here", *checkpoint_voices(TINY / "cv_small"))
    assert d == {"language": "auto", "voice": "dylan"}
    assert "first speaker" in caplog.text and "jobs.voice" in caplog.text
    assert job_defaults("ryan", "english", None, *checkpoint_voices(TINY / "cv_small"))["voice"] == "ryan"


def test_voice_design_takes_the_instruction_not_a_voice():
    d = job_defaults("ryan", "auto", "A calm, low voice.", *checkpoint_voices(TINY / "vd_proj"))
    assert d == {"language": "auto", "instruct": "A calm, low voice."}
    assert job_defaults(None, "auto", None, *checkpoint_voices(TINY / "base_small")) == {"language": "auto",
                                                                                       "voice": None}


def test_given_options_win_over_defaults():
    spec = JobSpec.from_dict(with_defaults({"language": "german", "voice": None}, {"voice": "dylan",
                                                                                   "language": "auto"}))
    assert (spec.voice, spec.language) == ("dylan", "german")


# -- idempotency -----------------------------------------------------------------------------
def test_same_content_and_options_is_one_job(spool, tmp_path):
    paths, q = spool
    a, _ = submit_file(q, paths, book(tmp_path), JobSpec(voice="ryan"))
    b, _ = submit_file(q, paths, book(tmp_path, "renamed copy.txt"), JobSpec(voice="ryan"))
    c, _ = submit_file(q, paths, book(tmp_path), JobSpec(voice="vivian"))
    assert a == b != c and len(q.jobs()) == 2
    q.cancel(a)  # a cancelled (or failed) job is not the answer to a new submit
    d, _ = submit_file(q, paths, book(tmp_path), JobSpec(voice="ryan"))
    assert d not in (a, c) and len(q.jobs()) == 3


def test_concurrent_submits_make_one_job(spool, tmp_path):
    paths, _ = spool
    src = book(tmp_path, text=BOOK * 40)
    ids, barrier = [], threading.Barrier(3)

    def one():
        q = Queue(paths.db)
        barrier.wait()
        ids.append(submit_file(q, paths, src, JobSpec(voice="ryan"))[0])
        q.close()

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    q = Queue(paths.db)
    assert len(set(ids)) == 1 and len(ids) == 3 and [j["id"] for j in q.jobs()] == ids[:1]
    q.close()


def test_second_submit_waits_for_the_first_still_ingesting(spool, tmp_path, monkeypatch):
    paths, q = spool
    src, spec = book(tmp_path), JobSpec(voice="ryan")
    first_id, mine = q.claim_submission(submit_key(src, spec))  # the first submit, mid-ingest
    assert mine
    waiting, wait_for_job = threading.Event(), Queue.wait_for_job

    def noted(self, *a, **k):
        waiting.set()
        return wait_for_job(self, *a, **k)

    monkeypatch.setattr(Queue, "wait_for_job", noted)
    got = []
    t = threading.Thread(target=lambda: got.append(submit_file(Queue(paths.db), paths, src, spec, wait_s=3600)))
    t.start()
    assert waiting.wait(300), "the second submit never waited"  # (a failure guard)
    assert t.is_alive() and not q.jobs(), "the second submit must wait, not queue a job of its own"
    from jobs.submit import document_chapters
    from jobs.ingest import load_document

    q.add_job(spec, document_chapters(load_document(src), spec), [str(src)], job_id=first_id)
    t.join(300)  # it ends once the job is there (its own limit is an hour)
    assert not t.is_alive() and got == [(first_id, None)] and len(q.jobs()) == 1


def test_claim_of_a_dead_submitter_is_taken_over(spool, tmp_path):
    paths, q = spool
    src, spec = book(tmp_path), JobSpec(voice="ryan")
    key = submit_key(src, spec)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with q.tx() as c:
        c.execute("INSERT INTO submissions (key, job_id, holder, claimed_at) VALUES (?, ?, ?, ?)",
                  (key, "abandoned123", holder(dead.pid), time.time()))
    job_id, error = submit_file(q, paths, src, spec, wait_s=0.1)
    assert (job_id, error) == ("abandoned123", None) and q.job(job_id)["state"] == "queued"


# -- the CLI and an unreachable daemon ---------------------------------------------------------
def cli(args, env=None, **kw):
    from appliance.cli import cli as group

    return CliRunner().invoke(group, args, env={"TTS_APPLIANCE_NO_DAEMON": None, "TTS_APPLIANCE_SOCKET": None,
                                                **(env or {})}, **kw)


def short_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="tts-sub-"))  # AF_UNIX paths must stay short
    os.chmod(d, 0o755)
    return d


def test_configured_socket_that_is_missing_or_refused_is_an_error(tmp_path):
    home, run = tmp_path / "home", short_dir()
    gone, refused = run / "gone.sock", run / "refused.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(refused))  # bound, never listening: connect is refused
    s.close()
    src = book(tmp_path)
    r = cli(["submit", str(src), "--home", str(home)], env={"TTS_APPLIANCE_SOCKET": str(gone)})
    assert r.exit_code != 0 and str(gone) in r.output and "no such socket" in r.output, r.output
    assert "TTS_APPLIANCE_SOCKET" in r.output and "TTS_APPLIANCE_NO_DAEMON=1" in r.output
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"http: {{socket: {refused}}}\n")
    r = cli(["--config", str(cfg), "submit", str(src), "--home", str(home)])
    assert r.exit_code != 0 and "connection refused" in r.output and "http.socket" in r.output, r.output
    r = cli(["--config", str(cfg), "list", "--home", str(home)])
    assert r.exit_code != 0 and "connection refused" in r.output
    assert not (home / "queue.db").exists(), "nothing may be queued in the user's own spool folder"


@pytest.mark.parametrize("args,env,code,kind,needle", [
    (["status", "nope"], {}, 1, "ClickException", "no job 'nope'"),  # a command's own failure
    (["list"], {"TTS_APPLIANCE_SOCKET": "/nonexistent/api.sock"}, 1, "ClickException", "no such socket"),
    (["submit"], {}, 2, "MissingParameter", "Missing argument 'FILES"),  # click's usage errors too
    (["logs", "x"], {"TTS_APPLIANCE_JOBS__QUEUE": "postgresql://nobody@127.0.0.1:1/none"}, 1, "QueueError", "127.0.0.1"),
])
def test_json_errors_are_json(tmp_path, args, env, code, kind, needle):
    """With --json, a failure is a JSON object on stdout (and the exit status), not a line of text."""
    r = cli([*args, "--home", str(tmp_path / "home"), "--json"], env=env)
    assert r.exit_code == code, r.output
    err = json.loads(r.stdout)["error"]
    assert err["type"] == kind and needle in err["message"] and err["exit_code"] == code, err
    text = cli([*args, "--home", str(tmp_path / "home")], env=env)  # without: the message as text on stderr
    assert text.exit_code == code and needle in text.stderr and not text.stdout.strip(), text.output


def test_announced_daemon_alive_but_unreachable_is_an_error(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "daemon.json").write_text(json.dumps({"pid": os.getpid(), "socket": str(short_dir() / "x.sock")}))
    r = cli(["submit", str(book(tmp_path)), "--home", str(home)])
    assert r.exit_code != 0 and "daemon.json" in r.output and not (home / "queue.db").exists(), r.output


def test_no_daemon_configured_works_in_process_and_says_so(tmp_path):
    home = tmp_path / "home"
    r = cli(["submit", str(book(tmp_path)), "--home", str(home), "--json"],
            env={"TTS_APPLIANCE_MODEL": str(TINY / "cv_small")})
    assert r.exit_code == 0, r.output
    assert "no daemon is configured" in r.stderr and str(home) in r.stderr
    job = json.loads(r.stdout)[0]
    q = Queue(home / "queue.db")
    assert json.loads(q.job(job["job_id"])["spec"])["voice"] == "dylan"  # the checkpoint's first speaker
    q.close()


def test_cli_submit_checks_the_voice_against_the_checkpoint_without_loading_it(tmp_path):
    home = tmp_path / "home"
    r = cli(["submit", str(book(tmp_path)), "--home", str(home), "--voice", "nobody", "--json"],
            env={"TTS_APPLIANCE_MODEL": str(TINY / "cv_small")})
    assert r.exit_code != 0
    job = json.loads(r.stdout)[0]
    assert job["state"] == "failed" and "unknown voice 'nobody'" in job["error"] and "dylan" in job["error"]


def test_a_folder_or_fifo_is_named_for_what_it_is(tmp_path):
    """Not "no such file": the error says what the path is and what to do."""
    home = tmp_path / "home"
    (tmp_path / "chapters").mkdir()
    os.mkfifo(tmp_path / "pipe.txt")
    r = cli(["submit", str(tmp_path / "chapters"), str(tmp_path / "pipe.txt"), str(tmp_path / "gone.txt"),
             "--home", str(home), "--json"], env={"TTS_APPLIANCE_MODEL": str(TINY / "cv_small")})
    errors = [j["error"] for j in json.loads(r.stdout)]
    assert "chapters: is a folder, not a file; submit the files in it" in errors[0], errors
    assert "pipe.txt: is not a regular file (a FIFO, socket or device)" in errors[1], errors
    assert errors[2].endswith("gone.txt: no such file"), errors


def test_the_size_cap_is_a_config_key_the_error_names(tmp_path):
    """jobs.max_file_mb caps what any route reads (the default, 50, would take this file); a file over it
    fails with the key to raise."""
    home = tmp_path / "home"
    big = book(tmp_path, "big.txt", "Golf is a long book. " * 60_000)  # ~1.2 MiB
    env = {"TTS_APPLIANCE_MODEL": str(TINY / "cv_small"), "TTS_APPLIANCE_JOBS__MAX_FILE_MB": "1"}
    [job] = json.loads(cli(["submit", str(big), "--home", str(home), "--json"], env=env).stdout)
    assert job["state"] == "failed" and "up to 1 MiB: raise jobs.max_file_mb in the config" in job["error"], job


def _as_nobody() -> list[str] | None:
    """argv prefix running a command as an unprivileged user (root ignores socket permissions)."""
    if os.geteuid() != 0:
        return []
    probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                            "import appliance.client"], cwd=Path(__file__).parents[1], capture_output=True)
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if probe.returncode == 0 else None


def test_permission_denied_names_the_group_and_the_fix(tmp_path):
    prefix = _as_nobody()
    if prefix is None:
        pytest.skip("cannot run a command as an unprivileged user here (setpriv to uid 65534 failed)")
    run = short_dir()
    path = run / "api.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)
    os.chmod(path, 0o660 if os.geteuid() == 0 else 0o000)  # root's group only / nobody
    work = Path(tempfile.mkdtemp(prefix="tts-home-"))
    os.chmod(work, 0o777)
    src = work / "b.txt"
    src.write_text(BOOK)
    os.chmod(src, 0o644)
    config = work / "config.yaml"
    config.write_text("# empty\n")
    os.chmod(config, 0o644)
    env = {**os.environ, "TTS_APPLIANCE_SOCKET": str(path), "HOME": str(work), "TTS_APPLIANCE_CONFIG": str(config),
           "PYTHONPATH": str(Path(__file__).parents[1])}
    env.pop("TTS_APPLIANCE_NO_DAEMON", None)
    try:
        r = subprocess.run([*prefix, sys.executable, "-m", "appliance.cli", "submit", str(src), "--home",
                            str(work / "home")], env=env, capture_output=True, text=True, timeout=60)
    finally:
        srv.close()
    import grp

    group = grp.getgrgid(os.stat(path).st_gid).gr_name
    assert r.returncode != 0 and "permission denied" in r.stderr, r.stderr
    assert f"sudo usermod -aG {group} $USER" in r.stderr and "log in again" in r.stderr and str(path) in r.stderr
    assert not (work / "home" / "queue.db").exists()


# -- through a real daemon -------------------------------------------------------------------
@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    from daemon_util import Daemon, base_config, skip_reason

    if skip_reason():
        pytest.skip(skip_reason())
    tmp = tmp_path_factory.mktemp("submit")
    (tmp / "allowed").mkdir()
    cfg = base_config(tmp, jobs={"watch": True, "watch_quiet_s": 0.5, "allowed_dirs": [str(tmp / "allowed")],
                                 "max_file_mb": 1}, http={"max_body_bytes": 65536})
    d = Daemon(tmp, cfg).start()
    yield d
    assert d.stop() == 0


def test_inbox_file_without_sidecar_becomes_audio_on_a_custom_voice_model(daemon):
    (daemon.home / "inbox" / "plain.txt").write_text("Alpha is read aloud.\n")
    deadline = time.monotonic() + 300  # (a failure guard)
    while time.monotonic() < deadline and not list((daemon.home / "done").glob("*/plain.txt")):
        assert not (daemon.home / "failed" / "plain.txt.reason.txt").exists(), \
            (daemon.home / "failed" / "plain.txt.reason.txt").read_text()
        time.sleep(0.2)
    done = list((daemon.home / "done").glob("*/plain.txt"))
    assert done and list(done[0].parent.rglob("*.flac")), daemon.log_text()[-2000:]
    assert "'dylan', the model's first speaker" in daemon.log_text()


def test_upload_twice_is_one_job(daemon, tmp_path):
    from appliance.client import DaemonClient

    src = book(tmp_path, "twice.txt", "Charlie is read twice.\n")
    client = DaemonClient(daemon.socket)
    first = client.submit_file(src, {"voice": "ryan", "sampling": {"max_new_tokens": 4}})
    second = client.submit_file(src, {"voice": "ryan", "sampling": {"max_new_tokens": 4}})
    assert first == second and first[1] is None
    assert [j["id"] for j in daemon.get("/v1/jobs")[1]].count(first[0]) == 1
    uploads = [p for p in (daemon.home / "uploads").glob("*/twice.txt")]
    assert len(uploads) == 1, "the second upload of the same content must not stay behind"
    server_side = book(daemon.tmp / "allowed", "by-path.txt", "Foxtrot is read by path.\n")
    body = {"path": str(server_side), "spec": {"voice": "ryan", "sampling": {"max_new_tokens": 4}}}
    (s1, a, _), (s2, b, _) = daemon.post("/v1/jobs", body), daemon.post("/v1/jobs", body)
    assert (s1, a["existing"], s2, b["existing"]) == (201, False, 200, True) and a["id"] == b["id"], (a, b)


def test_cli_checks_type_and_size_before_uploading(daemon, tmp_path):
    before = len(daemon.get("/v1/jobs")[1])
    env = {"TTS_APPLIANCE_SOCKET": daemon.socket}
    picture = tmp_path / "cover.img"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    r = cli(["submit", str(picture), "--voice", "ryan"], env=env)
    assert r.exit_code != 0 and "PNG image" in r.output, r.output
    big = book(tmp_path, "big.txt", "Delta is a long book. " * 4000)  # ~88 KB > the daemon's 64 KiB
    r = cli(["submit", str(big), "--voice", "ryan"], env=env)
    assert r.exit_code != 0 and "http.max_body_bytes" in r.output and "up to 64 KiB" in r.output, r.output
    huge = book(tmp_path, "huge.txt", "Hotel is a huge book. " * 60_000)  # ~1.3 MiB > the daemon's jobs.max_file_mb
    r = cli(["submit", str(huge), "--voice", "ryan"], env=env)
    assert r.exit_code != 0 and "reads documents up to 1.0 MiB (jobs.max_file_mb)" in r.output, r.output
    assert "inbox" not in r.output  # the inbox has the same cap: no use suggesting it
    (tmp_path / "folder").mkdir()
    r = cli(["submit", str(tmp_path / "folder"), "--voice", "ryan"], env=env)
    assert r.exit_code != 0 and "is a folder, not a file" in r.output, r.output
    assert len(daemon.get("/v1/jobs")[1]) == before
    assert not list((daemon.home / "uploads").glob("*/big.txt")), "nothing may be uploaded"


def test_cli_submit_without_voice_takes_the_daemons_default(daemon, tmp_path):
    r = cli(["submit", str(book(tmp_path, "novoice.txt", "Echo is read.\n")), "--max-new-tokens", "4", "--json"],
            env={"TTS_APPLIANCE_SOCKET": daemon.socket})
    assert r.exit_code == 0, r.output
    assert daemon.wait_job(json.loads(r.stdout)[0]["job_id"])["state"] == "done"


def test_submit_wait_follows_the_daemon_and_synthesizes_nothing_here(daemon, tmp_path, monkeypatch):
    """`submit --wait` with a daemon running for the spool folder (found through its daemon.json): the job is
    uploaded and followed through the daemon's event stream; this process loads no engine, every segment's
    synthesis is logged by a worker of the daemon's process, and the bar counts the segments to 100%."""
    import engines.load
    from daemon_util import book_text

    loads, real = [], engines.load.load_runner
    monkeypatch.setattr(engines.load, "load_runner", lambda spec: loads.append(spec) or real(spec))
    src = book(tmp_path, "followed.txt", book_text(6))
    r = cli(["submit", str(src), "--voice", "ryan", "--max-new-tokens", "4", "--wait", "--home", str(daemon.home)],
            env={"TTS_APPLIANCE_MODEL": str(TINY / "cv_small")})  # a model of its own would let it work here
    assert r.exit_code == 0, r.output
    job_id = r.stdout.splitlines()[0]
    assert loads == [], "submit --wait loaded an engine in the CLI process"
    q = Queue(daemon.home / "queue.db")
    try:
        total = sum(q.counts(job_id).values())
        workers = q.conn.execute("SELECT l.worker_id FROM synth_log l JOIN segments s ON s.id = l.segment_id "
                                 "WHERE s.job_id = ?", (job_id,)).fetchall()
        assert q.job(job_id)["state"] == "done" and total >= 3
    finally:
        q.close()
    assert len(workers) == total and all(f"-{daemon.proc.pid}-" in w for (w,) in workers), (daemon.proc.pid, workers)
    assert "100%" in r.stderr and f"{total}/{total}" in r.stderr, r.stderr
    assert f"{job_id}  done" in r.stdout and "no daemon is configured" not in r.stderr


def test_submit_json_prints_the_jobs_real_state(daemon, tmp_path):
    """A submit of what is already a finished job answers with that job: --json says it is done, not queued."""
    src = book(tmp_path, "again.txt", "Golf is read once and submitted twice.\n")
    args, env = ["submit", str(src), "--voice", "ryan", "--max-new-tokens", "4", "--json"], {"TTS_APPLIANCE_SOCKET": daemon.socket}
    first = cli(args, env=env)
    assert first.exit_code == 0 and json.loads(first.stdout)[0]["state"] == "queued", first.output
    job_id = json.loads(first.stdout)[0]["job_id"]
    assert daemon.wait_job(job_id)["state"] == "done"
    again = cli(args, env=env)
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)[0] == {"job_id": job_id, "file": str(src), "state": "done", "error": None}


def test_a_resubmit_while_the_first_is_still_read_prints_the_id_once_its_job_exists(daemon, tmp_path):
    """The daemon still reads the same content with the same options for an earlier submit (its claim, held
    by a live process, has no job yet): the CLI says so and waits; the id it prints is of a job that exists."""
    from appliance.client import DaemonClient
    from jobs.queue.submissions import holder
    from jobs.submit import document_chapters
    from jobs.ingest import load_document

    src = book(tmp_path, "pending.txt", "India is read while another submit reads it.\n")
    spec = {"voice": "ryan", "sampling": {"max_new_tokens": 4}}
    first, _ = DaemonClient(daemon.socket).submit_file(src, spec)
    q = Queue(daemon.home / "queue.db")
    try:
        with q.tx() as c:  # the claim as an earlier submit that is still reading holds it: no job yet
            c.execute("UPDATE submissions SET job_id = 'pending00001', holder = ?, claimed_at = ? WHERE job_id = ?",
                      (holder(), time.time(), first))
        env = {**os.environ, "TTS_APPLIANCE_SOCKET": daemon.socket, "PYTHONPATH": str(Path(__file__).parents[1])}
        env.pop("TTS_APPLIANCE_NO_DAEMON", None)
        proc = subprocess.Popen([sys.executable, "-m", "appliance.cli", "submit", str(src), "--voice", "ryan",
                                 "--max-new-tokens", "4", "--json"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            said = []  # the daemon answers after its own wait for the earlier submit
            while not said or "still reading" not in said[-1] and said[-1]:
                said.append(proc.stderr.readline())
            assert "still reading the same content with the same options" in said[-1] and "waiting" in said[-1], said
            assert proc.poll() is None, "the CLI must wait for the job, not end with its id"
            spec_ = JobSpec.from_dict(json.loads(q.job(first)["spec"]))
            q.add_job(spec_, document_chapters(load_document(src), spec_), [str(src)], job_id="pending00001")
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err
        [row] = json.loads(out)
        assert row["job_id"] == "pending00001" and row["state"] in ("queued", "running", "done"), row
    finally:
        q.close()


class _SilentDaemon:
    """A daemon's socket that answers /health (with jobs.ingest_wall_s) and reads a submit but never answers
    it: a daemon still reading a large document."""

    def __init__(self, path: Path, wall_s: float):
        import http.server
        import socketserver

        outer = self
        self.release = threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps({"status": "ok", "limits": {"ingest_wall_s": wall_s}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.release.wait(120)

            def log_message(self, *args):
                pass

        self.server = socketserver.ThreadingUnixStreamServer(str(path), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_a_submit_the_daemon_is_still_reading_says_what_happens_and_what_to_do(tmp_path, monkeypatch):
    """No bare "timed out": the CLI waits as long as the daemon's own ingest limit (jobs.ingest_wall_s, from
    /health) and a margin allow, says while it waits that the daemon is reading the file, and at the end what
    to do (the margin and the note's delay made short here)."""
    import appliance.client

    monkeypatch.setattr(appliance.client, "SUBMIT_MARGIN_S", 2.0, raising=False)  # (the code before had none)
    monkeypatch.setattr(appliance.client, "READING_NOTE_S", 0.0, raising=False)
    path = short_dir() / "api.sock"
    fake = _SilentDaemon(path, wall_s=1.0)
    try:
        r = cli(["submit", str(book(tmp_path, "slow.txt")), "--home", str(tmp_path / "home")],
                env={"TTS_APPLIANCE_SOCKET": str(path)})
    finally:
        fake.close()
    assert r.exit_code == 1, r.output
    assert "note: the daemon is reading slow.txt (a document may take up to 1 s: jobs.ingest_wall_s)" in r.stderr
    assert "has not answered the submit of slow.txt in 3 s: it may still be reading it" in r.stderr, r.stderr
    assert "submit the same file again later" in r.stderr and not r.stdout.strip()
