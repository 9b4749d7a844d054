"""HTTP API of the daemon over its real Unix socket: speech (OpenAI shape, all formats, streaming),
voices, health, metrics, jobs (upload, server-side path, SSE, cancel, retry), bad requests (400 with
a JSON body, 413, 404, slow clients) and the CLI going through the daemon."""
from __future__ import annotations

import io
import json
import socket
from pathlib import Path

import pytest
import soundfile as sf
from click.testing import CliRunner

from daemon_util import Daemon, base_config, book_text, needs_daemon
from jobs.queue import Queue

pytestmark = needs_daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api")
    (tmp / "allowed").mkdir()
    (tmp / "words.yaml").write_text("Charlie: Delta\n")
    cfg = base_config(tmp, jobs={"allowed_dirs": [str(tmp / "allowed")], "watch": False,
                                 "lexicon": str(tmp / "words.yaml")},
                      http={"max_body_bytes": 65536, "max_text_chars": 500})
    d = Daemon(tmp, cfg).start()
    yield d
    assert d.stop() == 0


def speech(**kw):
    return {"model": "tts-1", "input": "Hello there.", "voice": "ryan", "max_frames": 6, "seed": 1, **kw}


def test_health_and_voices(daemon):
    status, h, _ = daemon.get("/health")
    assert status == 200 and h["status"] == "ok" and h["model_type"] == "custom_voice" and h["queue"] == {"ok": True}
    status, v, _ = daemon.get("/v1/voices")
    assert status == 200 and {x["name"] for x in v["voices"]} >= {"ryan", "vivian"} and "english" in v["languages"]


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus"])
@pytest.mark.parametrize("stream", [False, None])
def test_speech_formats_as_complete_files(daemon, fmt, stream):
    """No stream (the default), or false: one complete file with exact length headers (streaming:
    test_daemon_stream_formats)."""
    status, body, headers = daemon.post("/v1/audio/speech", speech(response_format=fmt, stream=stream))
    assert status == 200, body
    assert int(headers["Content-Length"]) == len(body) and "Transfer-Encoding" not in headers
    audio, sr = sf.read(io.BytesIO(body))
    assert sr in (24000, 48000) and len(audio) > 0


def test_speech_streams_pcm_chunked(daemon):
    c = daemon.conn()
    c.request("POST", "/v1/audio/speech", body=json.dumps(speech(response_format="pcm", stream=True, speed=1.5)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Transfer-Encoding") == "chunked"
    assert r.getheader("X-TTS-Note") is None  # speed is applied (tests/test_speed.py)
    data = r.read()
    c.close()
    assert len(data) > 0 and len(data) % 2 == 0 and len(data) <= 2 * 1920 * 6


def test_same_seed_same_audio(daemon):
    a = daemon.post("/v1/audio/speech", speech(response_format="pcm"))[1]
    b = daemon.post("/v1/audio/speech", speech(response_format="pcm"))[1]
    assert a == b


def test_speech_is_spoken_with_the_lexicon(daemon):
    """jobs.lexicon's file (Charlie: Delta), and a request's own entries over it: with the same seed, the
    audio of the replaced text."""
    def pcm(text, **kw):
        status, body, _ = daemon.post("/v1/audio/speech", speech(input=text, response_format="pcm", **kw))
        assert status == 200, body
        return body

    assert pcm("Charlie.") == pcm("Delta.") != pcm("Echo.")
    assert pcm("Charlie.", lexicon={"Charlie": "Echo"}) == pcm("Echo.")


@pytest.mark.parametrize("body,status,needle", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (json.dumps({"voice": "ryan"}).encode(), 400, "'input' is required"),
    (json.dumps({"input": "  ", "voice": "ryan"}).encode(), 400, "empty"),
    (json.dumps({"input": "Hi.", "voice": "bob"}).encode(), 400, "available: dylan"),
    (json.dumps({"input": "Hi.", "voice": "ryan", "response_format": "aiff"}).encode(), 400, "response_format"),
    (json.dumps({"input": "Hi.", "voice": "ryan", "seed": "x"}).encode(), 400, "'seed' must be"),
    (json.dumps({"input": "Hi.", "voice": "ryan", "stream_format": "xml"}).encode(), 400, "choose audio"),
    (json.dumps({"input": "Hi.", "voice": 3}).encode(), 400, "'voice' must be"),
    (json.dumps({"input": "Hi.", "voice": "ryan", "lexicon": ["Hi"]}).encode(), 400, "'lexicon' must map words"),
    (json.dumps({"input": "Hi.", "voice": "ryan", "stream": "yes"}).encode(), 400, "'stream' must be"),
    (json.dumps({"input": "Hi.", "voice": "ryan", "ref_audio": "%%%"}).encode(), 400, "base64"),
    (json.dumps({"input": "x" * 600, "voice": "ryan"}).encode(), 413, "limit is 500"),
    (json.dumps({"input": "Hi.", "pad": "x" * 70000}).encode(), 413, "larger than"),
])
def test_bad_speech_requests(daemon, body, status, needle):
    got, err, _ = daemon.request("POST", "/v1/audio/speech", body, {"Content-Type": "application/json"})
    assert got == status and needle in err["error"]["message"], err


@pytest.mark.parametrize("url", ["/v1/audio/speech", "/v1/jobs", "/v1/voices"])
def test_json_routes_want_a_json_content_type(daemon, url):
    body = json.dumps(speech()).encode()
    status, err, _ = daemon.request("POST", url, body, {"Content-Type": "text/plain"})
    assert status == 415 and "Content-Type: application/json" in err["error"]["message"], err
    status, err, _ = daemon.request("POST", url, body)  # no Content-Type at all
    assert status == 415, err


def test_multipart_submit_checks_its_parts(daemon, tmp_path):
    def post(parts: list[tuple[str, str, bytes]]):
        body = b"".join(f'--b\r\nContent-Disposition: form-data; name="{n}"{fn}\r\n\r\n'.encode() + v + b"\r\n"
                        for n, fn, v in parts) + b"--b--\r\n"
        return daemon.request("POST", "/v1/jobs", body, {"Content-Type": "multipart/form-data; boundary=b"})

    book = ("file", '; filename="b.txt"', book_text(1).encode())
    status, err, _ = post([("spec", "", b'{"voice": "ryan", "format": "aiff"}'), book])
    assert status == 400 and "unknown format 'aiff'" in err["error"]["message"], err
    status, err, _ = post([("spec", "", b"voice=ryan"), book])
    assert status == 400 and "'spec' part is not valid JSON" in err["error"]["message"], err
    status, err, _ = post([book, ("voice", "", b"ryan")])
    assert status == 400 and "unknown part 'voice'" in err["error"]["message"], err
    assert not list((daemon.home / "uploads").glob("*/b.txt")), "a refused upload must not stay behind"


def test_unknown_route_and_method_are_json(daemon):
    assert daemon.get("/nope")[:2][0] == 404 and "error" in daemon.get("/nope")[1]
    status, err, _ = daemon.request("PUT", "/v1/audio/speech", b"")
    assert status == 405 and err["error"]["code"] == 405


def test_adding_a_voice_needs_base_checkpoint(daemon):
    import base64

    wav = (daemon.home.parents[0] / "x.wav")
    sf.write(wav, [0.0] * 2400, 24000)
    status, err, _ = daemon.post("/v1/voices", {"name": "me", "ref_audio": base64.b64encode(wav.read_bytes()).decode()})
    assert status == 400 and "Base checkpoint" in err["error"]["message"]
    assert daemon.request("DELETE", "/v1/voices/nobody")[0] == 404


def test_slow_client_times_out_without_harming_others(daemon):
    slow = socket.socket(socket.AF_UNIX)
    slow.connect(daemon.socket)
    slow.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"inp")
    assert daemon.get("/health")[0] == 200  # others are served meanwhile
    assert daemon.post("/v1/audio/speech", speech(response_format="pcm"))[0] == 200
    slow.settimeout(300)  # (a failure guard: the 408 comes after http.read_timeout_s, 2 s here)
    reply = slow.recv(4096)
    assert b" 408 " in reply.split(b"\r\n")[0]
    slow.close()


def test_jobs_api_upload_events_cancel_retry(daemon, tmp_path):
    from appliance.client import DaemonClient
    from jobs.settings import JobSpec

    book = tmp_path / "book.txt"
    book.write_text(book_text(6))
    client = DaemonClient(daemon.socket)
    job_id, err = client.submit_file(book, JobSpec(voice="ryan", format="wav", sampling={"max_new_tokens": 4}))
    assert err is None
    c = daemon.conn()
    c.request("GET", f"/v1/jobs/{job_id}/events")
    r = c.getresponse()
    assert r.getheader("Content-Type").startswith("text/event-stream")
    text = r.read().decode()
    assert "event: progress" in text and "event: end" in text and '"state": "done"' in text
    s = daemon.get(f"/v1/jobs/{job_id}")[1]
    assert s["state"] == "done" and s["progress"]["done"] == s["progress"]["total"] == 6
    assert any(x["id"] == job_id for x in daemon.get("/v1/jobs")[1])
    assert daemon.post(f"/v1/jobs/{job_id}/cancel", {})[0] == 409  # already done
    assert daemon.get("/v1/jobs/nope")[0] == 404
    out = Path(s["output_dir"])
    audio = [Path(g["audio_path"]) for g in Queue(daemon.home / "queue.db").segments(job_id)]
    assert out.is_dir() and audio and all(a.is_file() and a.suffix == ".flac" for a in audio)
    held = sum(a.stat().st_size for a in set(audio)) + sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    status, deleted, _ = daemon.request("DELETE", f"/v1/jobs/{job_id}")
    assert status == 200 and deleted["id"] == job_id and deleted["deleted"] is True, deleted
    assert deleted["freed_bytes"] >= held and not out.exists()
    assert not any(a.exists() for a in audio)
    assert daemon.get(f"/v1/jobs/{job_id}")[0] == 404 and daemon.request("DELETE", f"/v1/jobs/{job_id}")[0] == 404


def test_jobs_api_server_side_path(daemon, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text(book_text(2))
    status, err, _ = daemon.post("/v1/jobs", {"path": str(outside), "spec": {"voice": "ryan"}})
    assert status == 403 and "allowed" in err["error"]["message"]
    inside = daemon.tmp / "allowed" / "in.txt"
    inside.write_text(book_text(2))
    spec = {"voice": "ryan", "sampling": {"max_new_tokens": 4}, "priority": -5}
    status, s, _ = daemon.post("/v1/jobs", {"path": str(inside), "spec": spec})
    assert status == 201 and s["state"] == "queued", s
    for body, needle in [({"path": str(inside), "colour": "red"}, "'colour'"),
                         ({"path": str(inside), "spec": {"colour": "red"}}, "unknown spec key(s) 'colour'"),
                         ({"path": str(inside), "spec": {"priority": "high"}}, "'priority' must be int"),
                         ({"path": str(inside), "spec": {"sampling": {"temp": 1}}}, "temperature (float)"),
                         ({"path": str(inside), "spec": {"ref_audio": str(outside)}}, "not inside an allowed folder")]:
        status, err, _ = daemon.post("/v1/jobs", body)
        assert status in (400, 403) and needle in err["error"]["message"], (body, err)
    status, c, _ = daemon.post(f"/v1/jobs/{s['id']}/cancel", {})
    if status == 200:  # not already finished: retry brings it back
        assert daemon.post(f"/v1/jobs/{s['id']}/retry", {})[0] == 200
    assert daemon.wait_job(s["id"])["state"] == "done"


def test_cli_uses_the_daemon(daemon, tmp_path, monkeypatch):
    from appliance.cli import cli

    book = tmp_path / "cli.txt"
    book.write_text(book_text(2))
    monkeypatch.setenv("TTS_APPLIANCE_HOME", str(daemon.home))
    r = CliRunner().invoke(cli, ["submit", str(book), "--voice", "ryan", "--max-new-tokens", "4", "--json"])
    assert r.exit_code == 0, r.output
    job_id = json.loads(r.output)[0]["job_id"]
    sources = daemon.get(f"/v1/jobs/{job_id}")[1]["sources"]
    assert "uploads" in sources[0]  # it went through the API, not straight into the database
    r = CliRunner().invoke(cli, ["list", "--json"])
    assert r.exit_code == 0 and job_id in r.output
    daemon.wait_job(job_id)
    r = CliRunner().invoke(cli, ["status", job_id])
    assert r.exit_code == 0 and "done" in r.output
    r = CliRunner().invoke(cli, ["cancel", job_id])
    assert r.exit_code != 0 and "already done" in r.output
    r = CliRunner().invoke(cli, ["status", "nope"])
    assert r.exit_code != 0 and "no job" in r.output


def test_cli_retry_and_redo_go_to_the_daemon(daemon, tmp_path, monkeypatch):
    """With a daemon running, `redo` (which waits by default) and `retry --wait` ask the daemon and follow its
    work: the daemon's engine renders the segment again (its frame count grows), the command loads no engine
    of its own (it would compete for the daemon's accelerator), and the job's log names the redo."""
    from appliance.cli import cli

    book = tmp_path / "redo.txt"
    book.write_text(book_text(1))
    monkeypatch.setenv("TTS_APPLIANCE_HOME", str(daemon.home))
    r = CliRunner().invoke(cli, ["submit", str(book), "--voice", "ryan", "--max-new-tokens", "4", "--wait", "--json"])
    assert r.exit_code == 0, r.output
    job_id = json.loads(r.stdout)[0]["job_id"]
    frames = daemon.get("/health")[1]["engine"]["frames"]
    monkeypatch.setattr("appliance.cli_jobs.finish_in_process", lambda *a, **k: pytest.fail("worked in the CLI"))
    r = CliRunner().invoke(cli, ["redo", job_id, "--segment", "0", "--seed", "5", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["state"] == "done" and out["segment"] == 0 and out["seed"] == 5, out
    assert daemon.get("/health")[1]["engine"]["frames"] > frames  # the daemon rendered it
    r = CliRunner().invoke(cli, ["logs", job_id, "--json"])
    assert any("redo segment 0 with seed 5" in e["message"] for e in json.loads(r.stdout)), r.output
    r = CliRunner().invoke(cli, ["retry", job_id, "--wait", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["state"] == "done" and out["requeued"] == 0, out
    status, err, _ = daemon.post(f"/v1/jobs/{job_id}/segments/x/redo", {})
    assert status == 400 and "segment index is a number" in err["error"]["message"]
    status, err, _ = daemon.post(f"/v1/jobs/{job_id}/segments/0/redo", {"seed": "five"})
    assert status == 400 and "'seed' must be a int" in err["error"]["message"]
    assert daemon.post("/v1/jobs/nope/segments/0/redo", {})[0] == 404


def test_cli_falls_back_in_process_without_daemon(tmp_path, monkeypatch):
    from appliance.cli import cli

    book = tmp_path / "b.txt"
    book.write_text(book_text(1))
    monkeypatch.setenv("TTS_APPLIANCE_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "daemon.json").write_text(json.dumps({"socket": str(tmp_path / "gone.sock")}))  # stale: no pid
    r = CliRunner().invoke(cli, ["submit", str(book), "--voice", "ryan", "--json"])
    assert r.exit_code == 0, r.output
    assert "no daemon is configured" in r.stderr  # said, not silent
    job_id = json.loads(r.stdout)[0]["job_id"]
    assert str(book) in CliRunner().invoke(cli, ["status", job_id, "--json"]).output


METRICS = {"tts_queue_up": "gauge", "tts_queue_segments": "gauge", "tts_jobs": "gauge",
           "tts_engine_active_slots": "gauge", "tts_engine_queued": "gauge", "tts_streams_active": "gauge",
           "tts_engine_frames_per_second": "gauge", "tts_ttfa_seconds": "histogram", "tts_realtime_factor": "gauge",
           "tts_audio_seconds": "counter", "tts_requests": "counter", "tts_errors": "counter",
           "tts_disk_free_bytes": "gauge", "tts_disk_ok": "gauge"}


def test_metrics(daemon):
    """GET /metrics read by prometheus_client's own parser: every metric name and label that exists (documented
    in docs/APPLIANCE.md), with values that follow from a speech request."""
    from prometheus_client.parser import text_string_to_metric_families

    daemon.post("/v1/audio/speech", speech(response_format="pcm"))
    status, body, headers = daemon.get("/metrics")
    assert status == 200 and headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8", headers
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert {n: f.type for n, f in families.items()} == METRICS
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert value[("tts_queue_up", ())] == 1 and value[("tts_engine_active_slots", ())] == 0
    assert value[("tts_requests_total", (("api", "speech"), ("outcome", "ok")))] >= 1
    assert value[("tts_audio_seconds_total", ())] > 0 and value[("tts_realtime_factor", ())] > 0
    assert ("tts_queue_segments", (("state", "done"),)) in value
    disk = daemon.get("/health")[1]["disk"]  # the same state: the spool folder's disk
    assert value[("tts_disk_ok", ())] == 1 and disk["ok"] is True
    assert abs(value[("tts_disk_free_bytes", ())] - disk["free_bytes"]) < 0.05 * disk["total_bytes"], disk
    count = value[("tts_ttfa_seconds_count", ())]
    buckets = [s for s in families["tts_ttfa_seconds"].samples if s.name == "tts_ttfa_seconds_bucket"]
    assert count >= 1 and [s.labels["le"] for s in buckets][-1] == "+Inf" and buckets[-1].value == count
    assert [s.value for s in buckets] == sorted(s.value for s in buckets)  # cumulative
    assert all(set(s.labels) <= {"state", "api", "outcome", "kind", "le"} for f in families.values() for s in f.samples)
    assert not [k for k in value if k[0].endswith("_created")]


def test_metrics_in_openmetrics_for_a_scraper_that_asks(daemon):
    """Prometheus asks for OpenMetrics first (its Accept header): it gets it, ending in `# EOF`, the same
    metrics; a plain scrape gets the text format."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    status, body, headers = daemon.request("GET", "/metrics", headers={"Accept": accept})
    assert status == 200 and headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    families = {f.name: f.type for f in text_string_to_metric_families(body.decode())}
    assert families == METRICS and body.decode().endswith("# EOF\n")


def test_reading_commands_of_a_user_with_another_home_read_the_daemons_queue(daemon, tmp_path, monkeypatch):
    """A member of the service's group has a home of their own (no jobs.home, or another one): `logs`, `status`
    and `list` show the daemon's jobs (they used to open a private queue for `logs`: "no job", and a spool
    folder made in the user's home), and no reading command creates anything there."""
    from appliance.cli import cli

    from appliance.client import DaemonClient
    from jobs.settings import JobSpec

    book = tmp_path / "logs.txt"
    book.write_text(book_text(1))
    job_id, _ = DaemonClient(daemon.socket).submit_file(book, JobSpec(voice="ryan", sampling={"max_new_tokens": 4}))
    daemon.wait_job(job_id)
    own = tmp_path / "own-home"
    monkeypatch.setenv("TTS_APPLIANCE_HOME", str(own))
    monkeypatch.setenv("TTS_APPLIANCE_SOCKET", daemon.socket)
    r = CliRunner().invoke(cli, ["logs", job_id, "--json"])
    assert r.exit_code == 0, r.output
    assert any("done" in e["message"] or "finished" in e["message"] for e in json.loads(r.stdout)), r.output
    assert CliRunner().invoke(cli, ["status", job_id, "--json"]).exit_code == 0
    assert job_id in CliRunner().invoke(cli, ["list", "--json"]).output
    r = CliRunner().invoke(cli, ["logs", "nope"])
    assert r.exit_code != 0 and "nope" in r.output
    monkeypatch.delenv("TTS_APPLIANCE_SOCKET")  # no daemon for this home: nothing to read, nothing made
    for args in (["logs", job_id], ["status", job_id], ["list"]):
        r = CliRunner().invoke(cli, args)
        assert (r.exit_code == 0) == (args == ["list"]), r.output
    assert not own.exists(), sorted(own.rglob("*"))
