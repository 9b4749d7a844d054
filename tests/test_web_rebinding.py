"""DNS rebinding in a real browser: headless Chromium (tests/browser_util.py) with a resolver rule that maps
attacker.test to 127.0.0.1, standing in for a DNS answer made to point here, against the real daemon on
loopback TCP without a key. A script on http://attacker.test:PORT/ is same-origin to everything the daemon
serves there, and Chromium sends it no Origin on a GET and no Sec-Fetch-* (a plain-http name that is not
localhost): only the Host header tells it apart. It must read nothing (the jobs, a book's text and audio,
logs, voices and their samples, /health, /metrics) and open no WebSocket, while the same script on
http://127.0.0.1:PORT/ and http://localhost:PORT/ (the page's own addresses) reads them all."""
from __future__ import annotations

import pytest

from browser_util import chromium, start_browser
from daemon_util import Daemon, base_config, book_text, free_port, needs_daemon

pytestmark = [needs_daemon, pytest.mark.browser]
RULE = "--host-resolver-rules=MAP attacker.test 127.0.0.1"
# every route family that answers a GET with the user's data, and a WebSocket; statuses and what came back
READ_ALL = """
const [paths, sockets, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
const out = {};
for (const path of paths) {
  try {
    const r = await fetch(path);
    out[path] = {status: r.status, body: await r.text()};
  } catch (e) {
    out[path] = {status: 0, body: String(e)};
  }
}
for (const path of sockets) {
  out[path] = await new Promise((resolve) => {
    const ws = new WebSocket(`ws://${location.host}${path}`);
    ws.onopen = () => { ws.close(); resolve({status: 101, body: "open"}); };
    ws.onerror = () => resolve({status: 0, body: "refused"});
  });
}
done(out);
"""
SOCKETS = ["/v1/audio/speech/live", "/v1/audio/speech/ws", "/v1/audio/speech/stream"]


@pytest.fixture(scope="module", autouse=True)
def browser_present():
    why = chromium()[2]
    if why:
        pytest.skip(why)


def test_a_page_under_a_rebound_name_reads_nothing_and_the_page_under_loopback_reads_all(tmp_path):
    port = free_port()
    d = Daemon(tmp_path, base_config(tmp_path, jobs={"watch": False}, wyoming={"enabled": False},
                                     http={"tcp": True, "tcp_host": "127.0.0.1", "tcp_port": port})).start()
    (tmp_path / "downloads").mkdir()
    browser = start_browser(tmp_path / "profile", tmp_path / "downloads", (RULE,))
    try:
        src = tmp_path / "secret-diary.md"
        src.write_text("# Secret diary\n\n" + book_text(1), encoding="utf-8")
        job = _submit(d, src)
        d.wait_job(job, timeout=180)
        names = [f["name"] for f in d.get(f"/v1/jobs/{job}/files")[1]["files"]]
        assert "manifest.json" in names and any(n.endswith(".vtt") for n in names), names
        paths = ["/v1/jobs", f"/v1/jobs/{job}", f"/v1/jobs/{job}/log", f"/v1/jobs/{job}/files",
                 *[f"/v1/jobs/{job}/files/{n}" for n in names], "/v1/voices", "/v1/voices/ryan/sample",
                 "/v1/audio/voices", "/v1/models", "/v1/formats", "/health", "/metrics", "/"]
        browser.set_script_timeout(120)

        browser.get(f"http://attacker.test:{port}/")
        rebound = browser.execute_async_script(READ_ALL, paths, SOCKETS)
        assert {p: r["status"] for p, r in rebound.items()} == {p: 403 if p not in SOCKETS else 0 for p in rebound}
        assert not [p for p, r in rebound.items() if "Secret diary" in r["body"] or "secret-diary" in r["body"]]
        assert "not loopback" in browser.page_source  # the page too: the daemon itself answered, and refused
        log = d.log_text()
        for p in paths:  # each request reached the daemon (the resolver rule) and was refused there
            assert f"GET {p.split('?')[0]} (Host attacker.test:{port})" in log, p
        for p in SOCKETS:
            assert f"GET {p} (Host attacker.test:{port})" in log, p

        for base in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
            browser.get(f"{base}/")
            assert '<script type="module" src="/web/app.js">' in browser.page_source
            here = browser.execute_async_script(READ_ALL, paths, SOCKETS)
            assert {p: r["status"] for p, r in here.items()} == {p: 200 if p not in SOCKETS else 101 for p in here}, base
            assert "secret-diary" in here["/v1/jobs"]["body"] and "tts_queue_up" in here["/metrics"]["body"]
    finally:
        browser.quit()
        assert d.stop() == 0


def _submit(d: Daemon, src) -> str:
    """Upload `src` as a job over the Unix socket; its id."""
    b = "rebindingTestBoundary"
    body = (f'--{b}\r\nContent-Disposition: form-data; name="file"; filename="{src.name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n").encode() + src.read_bytes() + f"\r\n--{b}--\r\n".encode()
    status, job, _ = d.request("POST", "/v1/jobs", body, {"Content-Type": f"multipart/form-data; boundary={b}"})
    assert status == 201, job
    return job["id"]
