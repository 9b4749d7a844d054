"""The API routes the page needs, which any client may use, and the guards of TCP requests: a document's
preview before submit (nothing queued), a job's output files (nothing outside its folder), the formats the
server writes, voice samples made once and kept (a changed voice gets a new one), renaming voices; a
browser's cross-site request is refused, http.api_key guards every route but the page's static files, and
beyond loopback without a key the page is not served. Real daemons on the tiny checkpoints over their
Unix socket and loopback TCP; the route sweep runs the app in-process."""
from __future__ import annotations

import asyncio
import base64
import http.client
import io
import json
import time
from pathlib import Path
from types import SimpleNamespace as NS
from urllib.parse import quote

import pytest
import soundfile as sf

from daemon_util import ROOT, Daemon, base_config, book_text, free_port, needs_daemon
from library_util import pandoc_epub, png

BASE = ROOT / "tests" / "data" / "tiny" / "base_small"
REF = ROOT / "tests" / "data" / "tiny" / "audio"
BOOK = "# One\n\n" + book_text(2) + "\n# Two\n\n" + book_text(1) + "\n# Three\n\n" + book_text(2)


def multipart(name: str, data: bytes, spec: dict | None = None) -> tuple[bytes, dict]:
    """A submit's body: the document as the `file` part, the `spec` part as JSON."""
    b = "pageTestBoundary"
    parts = [f'--{b}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
             f"Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n"]
    if spec is not None:
        parts.append(f'--{b}\r\nContent-Disposition: form-data; name="spec"\r\n\r\n{json.dumps(spec)}\r\n'.encode())
    return b"".join(parts) + f"--{b}--\r\n".encode(), {"Content-Type": f"multipart/form-data; boundary={b}"}


def tcp(port: int, method: str, path: str, body=None, headers=None):
    """(status, body, headers) of one request over loopback TCP; JSON bodies parsed."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        if isinstance(body, dict):
            body, headers = json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        ctype = r.getheader("Content-Type", "")
        return r.status, json.loads(data) if ctype.startswith("application/json") else data, dict(r.getheaders())
    finally:
        c.close()


@pytest.fixture(scope="module")
def cv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("web-api")
    port = free_port()
    cfg = base_config(tmp, jobs={"watch": False}, wyoming={"enabled": False},
                      http={"tcp": True, "tcp_host": "127.0.0.1", "tcp_port": port})
    d = Daemon(tmp, cfg).start()
    d.port = port
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def book(cv):
    """A finished three-chapter book of the cv daemon (chapters 1 and 3)."""
    body, headers = multipart("book.md", BOOK.encode(), {"chapters": "1,3", "format": "flac"})
    status, job, _ = cv.request("POST", "/v1/jobs", body, headers)
    assert status == 201, job
    return cv.wait_job(job["id"], timeout=180)


# -- preview, formats ---------------------------------------------------------------------------
@needs_daemon
def test_preview_plans_a_document_and_queues_nothing(cv):
    body, headers = multipart("plan.md", BOOK.encode(), {"chapters": "2-3", "speed": 2.0})
    before = cv.get("/v1/jobs")[1]
    status, plan, _ = cv.request("POST", "/v1/jobs/preview", body, headers)
    assert status == 200, plan
    assert plan["file"] == "plan.md" and plan["title"] == "plan"
    assert [(c["number"], c["title"], c["selected"]) for c in plan["chapters"]] == [
        (1, "One", False), (2, "Two", True), (3, "Three", True)]
    assert all(c["segments"] >= 1 and c["characters"] > 0 and c["audio_s"] > 0 for c in plan["chapters"])
    total = plan["total"]
    assert total["chapters"] == 2 and total["segments"] == sum(c["segments"] for c in plan["chapters"][1:])
    assert total["audio_s"] == pytest.approx(sum(c["audio_s"] for c in plan["chapters"][1:]), abs=0.11)
    assert "synthesis_s" in total and "rate_source" in total
    assert set(plan["voices"]) >= {"ryan", "vivian"} and plan["unknown_voices"] == {}
    assert cv.get("/v1/jobs")[1] == before  # nothing queued
    assert not [p for p in (cv.home / "uploads").glob("preview-*")]  # nothing kept

    body, headers = multipart("tags.md", b"[voice=nobody]Hello there.[/voice]\n")
    status, plan, _ = cv.request("POST", "/v1/jobs/preview", body, headers)
    assert status == 200 and plan["unknown_voices"] == {"nobody": [1]}, plan


@needs_daemon
def test_preview_of_what_cannot_be_read_says_why(cv):
    body, headers = multipart("book.doc", b"\xd0\xcf\x11\xe0" + bytes(4000))
    status, err, _ = cv.request("POST", "/v1/jobs/preview", body, headers)
    assert status == 422 and ".doc files are not supported" in err["error"]["message"], err
    body, headers = multipart("short.md", b"# One\n\nHello.\n", {"chapters": "4"})
    status, err, _ = cv.request("POST", "/v1/jobs/preview", body, headers)
    assert status == 422 and "names chapter 4, but the document has 1 chapter" in err["error"]["message"], err
    status, err, _ = cv.post("/v1/jobs/preview", {"path": "/etc/hostname"})
    assert status == 403, err  # a server-side path obeys jobs.allowed_dirs, as a submit's


@needs_daemon
def test_formats_are_the_servers_own(cv):
    from jobs.settings import FORMATS

    from appliance.http_speech import FORMATS as SPEECH

    status, f, _ = cv.get("/v1/formats")
    assert status == 200 and f["books"] == list(FORMATS) and f["speech"] == list(SPEECH), f
    assert {".txt", ".md", ".html", ".epub", ".docx", ".pdf", ".mobi", ".azw", ".azw3", ".prc", ".odt", ".rtf", ".fb2",
            ".fb2.zip"} <= set(f["documents"]), f


# -- output files -------------------------------------------------------------------------------
@needs_daemon
def test_a_jobs_files_are_listed_and_served(cv, book):
    out = Path(book["output_dir"])
    status, listed, _ = cv.get(f"/v1/jobs/{book['id']}/files")
    assert status == 200 and listed["state"] == "done"
    names = {f["name"]: f for f in listed["files"]}
    assert {"book.flac", "book.vtt", "book.srt", "manifest.json"} <= set(names), names
    assert any(n.startswith("chapters/") and n.endswith(".flac") for n in names), names
    assert names["book.flac"]["type"] == "audio/flac" and names["book.flac"]["bytes"] == (out / "book.flac").stat().st_size
    assert names["book.vtt"]["type"] == "text/vtt"
    manifest = cv.get(f"/v1/jobs/{book['id']}/files/manifest.json")[1]
    assert [c["title"] for c in manifest["chapter_list"]] == ["One", "Three"]  # the chapters asked for

    chapter = next(n for n in names if n.startswith("chapters/") and n.endswith(".flac"))
    quoted = "/".join(quote(p) for p in chapter.split("/"))
    status, data, headers = cv.get(f"/v1/jobs/{book['id']}/files/{quoted}")
    assert status == 200 and data == (out / chapter).read_bytes() and headers["Content-Type"] == "audio/flac"
    status, part, headers = cv.request("GET", f"/v1/jobs/{book['id']}/files/book.flac", headers={"Range": "bytes=0-99"})
    assert status == 206 and part == (out / "book.flac").read_bytes()[:100]  # seeking in a player
    status, _, headers = cv.get(f"/v1/jobs/{book['id']}/files/book.vtt?download=1")
    assert status == 200 and headers["Content-Disposition"] == "attachment; filename*=UTF-8''book.vtt"
    status, err, _ = cv.get("/v1/jobs/nojob/files")
    assert status == 404 and "no job" in err["error"]["message"]


@needs_daemon
def test_nothing_outside_a_jobs_folder_is_served(cv, book, tmp_path):
    out = Path(book["output_dir"])
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    (out / "link.txt").symlink_to(secret)  # a link out of the folder
    (out / ".hidden").write_text("x")
    (out / "half.flac.tmp").write_text("x")
    try:
        names = {f["name"] for f in cv.get(f"/v1/jobs/{book['id']}/files")[1]["files"]}
        assert not names & {"link.txt", ".hidden", "half.flac.tmp"}, names
        for name in ("link.txt", ".hidden", "half.flac.tmp", "..%2F..%2Fqueue.db", "../../queue.db",
                     "%2Fetc%2Fpasswd", "chapters/..%2F..%2F..%2Fqueue.db", "chapters", "nope.flac"):
            status, err, _ = cv.get(f"/v1/jobs/{book['id']}/files/{name}")
            assert status == 404 and b"not yours" not in json.dumps(err).encode(), (name, err)
    finally:
        for name in ("link.txt", ".hidden", "half.flac.tmp"):
            (out / name).unlink()


# -- a listener's library: covers, authors, lengths, the place in a book ---------------------------
@needs_daemon
def test_a_books_cover_author_and_length(cv, book, tmp_path):
    cover = png(40, 60, (200, 30, 30))
    epub = pandoc_epub(tmp_path, "# One\n\n" + book_text(2) + "\n# Two\n\n" + book_text(1), "Covered", "Ann Author", cover)
    body, headers = multipart("covered.epub", epub.read_bytes(), {"format": "flac"})
    status, job, _ = cv.request("POST", "/v1/jobs", body, headers)
    assert status == 201, job
    assert job["author"] == "Ann Author" and job["cover"] is True, job
    assert job["length"]["measured"] is False and job["length"]["seconds"] > 0  # the estimate, until it is made
    status, data, headers = cv.get(f"/v1/jobs/{job['id']}/cover")
    assert status == 200 and data == cover and headers["Content-Type"] == "image/png"
    assert "sandbox" in headers["Content-Security-Policy"]  # an image, never a document of this origin
    status, data, _ = tcp(cv.port, "GET", f"/v1/jobs/{job['id']}/cover")  # as the page gets it
    assert status == 200 and data == cover
    cv.wait_job(job["id"], timeout=180)
    listed = {j["id"]: j for j in cv.get("/v1/jobs")[1]}
    made = listed[job["id"]]
    manifest = cv.get(f"/v1/jobs/{job['id']}/files/manifest.json")[1]
    audio, sr = sf.read(manifest["output"]["book"])
    assert made["length"]["measured"] and made["length"]["seconds"] == pytest.approx(len(audio) / sr, abs=0.3)
    assert made["author"] == "Ann Author" and made["cover"] is True
    # a Markdown book has neither
    assert listed[book["id"]]["cover"] is False and listed[book["id"]]["author"] is None
    status, err, _ = cv.get(f"/v1/jobs/{book['id']}/cover")
    assert status == 404 and "no cover" in err["error"]["message"]
    assert cv.get("/v1/jobs/nojob/cover")[0] == 404


@needs_daemon
def test_the_place_in_a_book_is_kept_by_the_daemon(cv, book):
    where = f"/v1/jobs/{book['id']}/position"
    assert cv.get(where)[1] == {"id": book["id"], "position_s": 0.0, "chapter": None, "updated_at": None}
    before = time.time()
    status, saved, _ = cv.request("PUT", where, {"position_s": 3.5, "chapter": 1})
    assert status == 200 and saved["position_s"] == 3.5 and saved["chapter"] == 1 and saved["updated_at"] >= before - 1
    assert cv.get(where)[1] == saved
    status, seen, _ = tcp(cv.port, "GET", where)  # another client, over TCP: the same place
    assert status == 200 and seen == saved
    status, moved, _ = tcp(cv.port, "PUT", where, {"position_s": 1.25})
    assert status == 200 and cv.get(where)[1] == moved and moved["chapter"] is None
    for bad in ({"position_s": -1}, {"position_s": "3"}, {}, {"position_s": 1, "chapter": -1},
                {"position_s": 1, "chapter": 1.5}, {"position_s": 1, "at": 2}, {"position_s": 1e12}, b'{"position_s": NaN}'):
        status, err, _ = cv.request("PUT", where, bad, {"Content-Type": "application/json"})
        assert status == 400 and "error" in err, (bad, err)
    assert cv.get(where)[1] == moved  # nothing bad was kept
    assert cv.get("/v1/jobs/nojob/position")[0] == 404
    assert cv.request("PUT", "/v1/jobs/nojob/position", {"position_s": 1})[0] == 404


@needs_daemon
def test_cancel_keeps_the_job_for_a_retry(cv):
    body, headers = multipart("long.md", ("# Long\n\n" + book_text(60)).encode())
    status, job, _ = cv.request("POST", "/v1/jobs", body, headers)
    assert status == 201, job
    status, answer, _ = cv.post(f"/v1/jobs/{job['id']}/cancel", {})
    assert status == 200 and answer == {"id": job["id"], "state": "cancelled"}, answer
    assert cv.get(f"/v1/jobs/{job['id']}")[1]["state"] == "cancelled"
    status, err, _ = cv.post(f"/v1/jobs/{job['id']}/cancel", {})
    assert status == 409 and "already cancelled" in err["error"]["message"], err
    assert cv.post("/v1/jobs/nojob/cancel", {})[0] == 404


@needs_daemon
def test_a_test_checkpoint_says_so(cv):
    """The tiny checkpoints are random weights: the daemon says so where clients look (the page shows it)."""
    assert "random weights" in cv.get("/health")[1]["test_model"]
    assert "random weights" in cv.get("/v1/voices")[1]["test_model"]


@needs_daemon
def test_a_preview_of_nothing_to_read_says_so(cv):
    body, headers = multipart("marks.md", "!!! ... ??? --- *** ;;; …\n".encode())
    status, err, _ = cv.request("POST", "/v1/jobs/preview", body, headers)
    assert status == 422 and "nothing in it can be read aloud" in err["error"]["message"], err


# -- voice samples ------------------------------------------------------------------------------
def made(d: Daemon, name: str) -> int:
    return d.log_text().count(f"voice sample of {name} made")


@needs_daemon
def test_a_voice_sample_is_made_once_and_kept(cv):
    status, first, headers = cv.get("/v1/voices/ryan/sample")
    assert status == 200 and headers["Content-Type"] == "audio/flac", first
    audio, sr = sf.read(io.BytesIO(first))
    assert sr == 24000 and 0 < len(audio) <= 10 * sr
    status, again, _ = cv.get("/v1/voices/ryan/sample")
    assert status == 200 and again == first and made(cv, "ryan") == 1  # kept, not made again
    assert len(list((cv.home / "voice-samples").glob("*.flac"))) == 1
    status, _, headers2 = cv.request("GET", "/v1/voices/ryan/sample", headers={"If-None-Match": headers["Etag"]})
    assert status == 304  # a browser's copy stays valid
    status, err, _ = cv.get("/v1/voices/nobody/sample")
    assert status == 404 and "GET /v1/audio/voices" in err["error"]["message"]
    status, err, _ = cv.request("PATCH", "/v1/voices/ryan", {"name": "bob"})
    assert status == 400 and "only saved cloned voices" in err["error"]["message"], err


def clone(name: str, ref: str = "ref_a_24k.wav", **kw) -> dict:
    return {"name": name, "ref_audio": base64.b64encode((REF / ref).read_bytes()).decode(),
            "ref_text": "A reference sentence.", **kw}


@needs_daemon
def test_cloned_voices_samples_follow_renames_and_changes(tmp_path):
    cfg = base_config(tmp_path, model={"path": str(BASE)}, jobs={"enabled": False, "watch": False},
                      wyoming={"enabled": False})
    d = Daemon(tmp_path, cfg).start()
    samples = d.home / "voice-samples"
    try:
        assert d.post("/v1/voices", clone("anna"))[0] == 201
        status, first, _ = d.get("/v1/voices/anna/sample")
        assert status == 200 and made(d, "anna") == 1
        status, body, _ = d.request("PATCH", "/v1/voices/anna", {"name": "bea"})
        assert status == 200 and body == {"name": "bea", "renamed_from": "anna"}, body
        assert [v["name"] for v in d.get("/v1/voices")[1]["voices"]] == ["bea"]
        assert d.get("/v1/voices/anna/sample")[0] == 404
        assert d.get("/v1/voices/bea/sample")[1] == first and made(d, "bea") == 0  # the same voice: kept
        old = {p.name for p in samples.glob("*.flac")}

        assert d.post("/v1/voices", clone("bea", "ref_b_24k.wav", overwrite=True))[0] == 200
        assert not list(samples.glob("*.flac"))  # the changed voice's old sample is gone
        status, second, _ = d.get("/v1/voices/bea/sample")
        assert status == 200 and made(d, "bea") == 1 and {p.name for p in samples.glob("*.flac")}.isdisjoint(old)

        assert d.post("/v1/voices", clone("cleo"))[0] == 201
        status, err, _ = d.request("PATCH", "/v1/voices/cleo", {"name": "bea"})
        assert status == 409 and "overwrite" in err["error"]["message"], err
        for bad in ("../x", "", " x"):
            status, err, _ = d.request("PATCH", "/v1/voices/cleo", {"name": bad})
            assert status == 400, (bad, err)
        assert d.request("PATCH", "/v1/voices/nobody", {"name": "x"})[0] == 404
        assert d.request("DELETE", "/v1/voices/bea")[0] == 200
        assert not list(samples.glob("*.flac"))  # a deleted voice's sample goes with it
    finally:
        assert d.stop() == 0


@needs_daemon
def test_a_browser_recording_the_server_cannot_read_says_what_to_do(tmp_path):
    cfg = base_config(tmp_path, model={"path": str(BASE)}, jobs={"enabled": False, "watch": False},
                      wyoming={"enabled": False})
    d = Daemon(tmp_path, cfg).start()
    try:
        webm = b"\x1a\x45\xdf\xa3" + bytes(2000)  # what MediaRecorder gives in Chromium
        status, err, _ = d.post("/v1/voices", {"name": "mic", "ref_audio": base64.b64encode(webm).decode()})
        assert status == 400 and "WebM" in err["error"]["message"] and "convert it to WAV" in err["error"]["message"]
    finally:
        assert d.stop() == 0


# -- who may ask --------------------------------------------------------------------------------
@needs_daemon
def test_a_browsers_cross_site_requests_are_refused(cv):
    here = f"http://127.0.0.1:{cv.port}"
    jobs = len(cv.get("/v1/jobs")[1])
    body, headers = multipart("evil.md", b"Read me aloud.\n")
    for browser in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"},
                    {"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"}, {"Origin": "null"}):
        status, err, _ = tcp(cv.port, "POST", "/v1/jobs", body, {**headers, **browser})
        assert status == 403 and err["error"]["type"] == "cross_site", (browser, err)
        status, err, _ = tcp(cv.port, "GET", "/v1/jobs", None, browser)
        assert status == 403, (browser, err)
    assert len(cv.get("/v1/jobs")[1]) == jobs  # nothing was queued
    # DNS rebinding: a browser's same-origin request under a name that is not this machine's
    status, err, _ = tcp(cv.port, "GET", "/v1/jobs", None, {"Host": f"evil.example:{cv.port}",
                                                            "Sec-Fetch-Site": "same-origin"})
    assert status == 403 and "not loopback" in err["error"]["message"], err
    for path in ("/v1/jobs", "/v1/voices", "/health", "/metrics", "/"):  # no Origin, no Sec-Fetch-*: Chrome's GET
        status, err, _ = tcp(cv.port, "GET", path, None, {"Host": f"attacker.test:{cv.port}"})
        assert status == 403 and "not loopback" in err["error"]["message"], (path, err)
    # the page's own requests, a typed address, and clients that are not browsers pass
    for ok in ({"Origin": here, "Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"}, {},
               {"Host": f"localhost:{cv.port}", "Origin": f"http://localhost:{cv.port}"},
               {"Origin": f"https://127.0.0.1:{cv.port}"}):  # a TLS proxy in front: the same host and port
        assert tcp(cv.port, "GET", "/v1/formats", None, ok)[0] == 200, ok
    # the page itself may be opened from a link anywhere (it holds no data)
    status, page, headers = tcp(cv.port, "GET", "/", None, {"Sec-Fetch-Site": "cross-site"})
    assert status == 200 and b'<script type="module" src="/web/app.js">' in page
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"] and headers["X-Frame-Options"] == "DENY"
    # the Unix socket is as it was
    assert cv.request("GET", "/v1/formats", headers={"Origin": "http://evil.example"})[0] == 200
    assert cv.request("GET", "/v1/jobs", headers={"Host": "attacker.test"})[0] == 200


@needs_daemon
def test_the_page_and_its_files(cv):
    from appliance.http_web import WEB

    status, page, headers = tcp(cv.port, "GET", "/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    for f in sorted(WEB.iterdir()):
        status, data, headers = tcp(cv.port, "GET", f"/web/{f.name}")
        assert status == 200 and data == f.read_bytes(), f.name
    assert tcp(cv.port, "GET", "/web/app.js")[2]["Content-Type"] == "text/javascript; charset=utf-8"
    for bad in ("/web/../http_web.py", "/web/%2e%2e/http_web.py", "/web/nope.js", "/web/"):
        assert tcp(cv.port, "GET", bad)[0] == 404, bad


def _app(**http):
    """The daemon's HTTP app with a stand-in daemon: enough for the middlewares and the page."""
    from appliance.http_api import make_app

    cfg = NS(http=NS(**{"api_key": None, "tcp_host": "127.0.0.1", "max_body_bytes": 1 << 20, **http}))
    return make_app(NS(cfg=cfg, metrics=NS(error=lambda *a: None, request=lambda *a: None)))


async def _each_route(app, headers=None) -> dict:
    """Every route of `app` (its {placeholders} filled) -> the status of one request over TCP."""
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    out = {}
    async with TestServer(app, host="127.0.0.1") as server, ClientSession() as s:
        for route in app.router.routes():
            path = route.resource.canonical.replace("{name:.+}", "x").replace("{", "").replace("}", "")
            async with s.request(route.method, server.make_url(path), headers=headers or {}) as r:
                out[f"{route.method} {route.resource.canonical}"] = r.status
    return out


def test_the_key_guards_every_route_but_the_pages_files():
    statuses = asyncio.run(_each_route(_app(api_key="sesame")))
    page = {k: v for k, v in statuses.items() if k.split()[1] == "/" or k.split()[1].startswith("/web/")}
    assert set(page) == {"GET /", "HEAD /", "GET /web/{name}", "HEAD /web/{name}"}, page
    assert all(v in (200, 404) for v in page.values()), page
    rest = {k: v for k, v in statuses.items() if k not in page}
    assert len(rest) > 20 and all(v == 401 for v in rest.values()), rest


def test_beyond_loopback_without_a_key_the_page_is_not_served():
    statuses = asyncio.run(_each_route(_app(tcp_host="0.0.0.0")))
    assert statuses["GET /"] == 403 and statuses["GET /web/{name}"] == 403

    async def text():
        from aiohttp import ClientSession
        from aiohttp.test_utils import TestServer

        async with TestServer(_app(tcp_host="0.0.0.0"), host="127.0.0.1") as server, ClientSession() as s:
            async with s.get(server.make_url("/")) as r:
                return await r.text()

    assert "set http.api_key" in asyncio.run(text())
    with_key = asyncio.run(_each_route(_app(tcp_host="0.0.0.0", api_key="sesame")))
    assert with_key["GET /"] == 200 and with_key["GET /v1/models"] == 401


REBOUND = ("attacker.test:8080", "attacker.test", "ATTACKER.TEST.", "127.0.0.1.attacker.test:8080",
           "localhost.attacker.test", "[::ffff:7f00:1]:8080", "myhost:8080")
LOOPBACK = ("127.0.0.1:8080", "127.0.0.1", "127.1.2.3:80", "localhost:8080", "LOCALHOST.", "app.localhost:8080",
            "[::1]:8080", "[::1]")


def test_on_loopback_without_a_key_a_name_that_is_not_loopback_is_refused_on_every_route():
    """DNS rebinding: a page of another site whose name resolves here is same-origin to the browser, which then
    sends no Origin on a GET and no Sec-Fetch-* to a plain-http name that is not localhost. Every route (GET and
    the others, the WebSockets, the page's files) refuses a Host that is not a loopback name or address,
    whatever the other headers; loopback names and addresses pass."""
    for host in REBOUND:
        for extra in ({}, {"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"}):
            statuses = asyncio.run(_each_route(_app(), {"Host": host, **extra}))
            assert len(statuses) > 20 and all(v == 403 for v in statuses.values()), (host, extra, statuses)
    for host in LOOPBACK:
        statuses = asyncio.run(_each_route(_app(), {"Host": host}))
        assert not [k for k, v in statuses.items() if v == 403], (host, statuses)
        assert statuses["GET /"] == 200, host


def test_the_refusal_of_a_name_that_is_not_loopback_says_what_to_open():
    async def get():
        from aiohttp import ClientSession
        from aiohttp.test_utils import TestServer

        async with TestServer(_app(), host="127.0.0.1") as server, ClientSession() as s:
            async with s.get(server.make_url("/v1/jobs"), headers={"Host": "attacker.test"}) as r:
                return r.status, await r.json(), server.port

    status, err, port = asyncio.run(get())
    assert status == 403 and err["error"]["type"] == "cross_site", err
    assert "'attacker.test'" in err["error"]["message"] and f"http://127.0.0.1:{port}/" in err["error"]["message"]
    assert "\n" not in err["error"]["message"]


def test_a_websocket_under_a_name_that_is_not_loopback_is_refused(cv):
    """A real upgrade (aiohttp's client) to each WebSocket route of the real daemon: refused under another
    name, opened under a loopback one."""
    import aiohttp

    async def handshake(path: str, host: str):
        async with aiohttp.ClientSession() as s:
            try:
                async with s.ws_connect(f"http://127.0.0.1:{cv.port}{path}", headers={"Host": host}) as ws:
                    await ws.close()
                    return 101
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status

    for path in ("/v1/audio/speech/live", "/v1/audio/speech/ws", "/v1/audio/speech/stream"):
        assert asyncio.run(handshake(path, f"attacker.test:{cv.port}")) == 403, path
        assert asyncio.run(handshake(path, f"localhost:{cv.port}")) == 101, path


def test_the_rebinding_rule_is_for_a_loopback_listener_without_a_key():
    """A key (on loopback or beyond) guards the routes as before; a listener beyond loopback without a key is as
    it was (open, warned, no page); the Unix socket has no Host rule (test_a_browsers_cross_site_requests_...)."""
    rebound = {"Host": "attacker.test:8080"}
    keyed = asyncio.run(_each_route(_app(api_key="sesame"), {**rebound, "Authorization": "Bearer sesame"}))
    assert not [k for k, v in keyed.items() if v in (401, 403)], keyed
    beyond = asyncio.run(_each_route(_app(tcp_host="0.0.0.0", api_key="sesame"), {**rebound,
                                                                                  "Authorization": "Bearer sesame"}))
    assert not [k for k, v in beyond.items() if v in (401, 403)], beyond
    assert asyncio.run(_each_route(_app(tcp_host="0.0.0.0", api_key="sesame"), rebound))["GET /v1/jobs"] == 401
    open_beyond = asyncio.run(_each_route(_app(tcp_host="0.0.0.0"), rebound))
    assert open_beyond["GET /"] == 403 and open_beyond["GET /v1/jobs"] != 403


def test_cross_site_refusals_come_before_any_work():
    statuses = asyncio.run(_each_route(_app(), {"Sec-Fetch-Site": "cross-site"}))
    assert all(v == 403 for k, v in statuses.items() if not (k.split()[1] == "/" or k.split()[1].startswith("/web/")))


def test_the_page_ships_with_the_package():
    """pyproject's package data holds every file of appliance/web, so `pip install .` serves the page."""
    from setuptools.config.pyprojecttoml import read_configuration

    from appliance.http_web import WEB, page_files

    data = read_configuration(ROOT / "pyproject.toml")["tool"]["setuptools"]["package-data"]["appliance"]
    shipped = {p.relative_to(WEB).as_posix() for pattern in data for p in WEB.parent.glob(pattern) if p.is_file()}
    assert set(page_files()) <= shipped and "index.html" in shipped, (data, sorted(page_files()))
    assert not [p for p in WEB.rglob("*") if p.is_dir()]  # one level: the package-data pattern covers it
