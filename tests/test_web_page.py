"""The page in a real browser (headless Chromium through Selenium, tests/browser_util.py) against the real
daemon on the tiny checkpoints over loopback TCP: a document dropped, previewed with a chapter left out,
made into a book, followed to the end, played with its chapters, captions and the sentence highlighted,
and downloaded; a stream tried with its time to first audio; voice samples; then, on a Base checkpoint
behind an API key, the sign-in (a wrong key refused), a voice cloned from a file and one from the
(fake) microphone, renamed and deleted, and a book made and played with the key; a cross-site request
from another origin in the same browser queues nothing. Each screen is saved as a screenshot in a folder
the run names at its end."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from browser_util import SCREENSHOTS, Page, chromium, start_browser
from daemon_util import ROOT, Daemon, base_config, book_text, free_port, needs_daemon

pytestmark = [needs_daemon, pytest.mark.browser]
BASE = ROOT / "tests" / "data" / "tiny" / "base_small"
REF = ROOT / "tests" / "data" / "tiny" / "audio"
STORY = "# One\n\n" + book_text(2) + "\n# Two\n\n" + book_text(1) + "\n# Three\n\n" + book_text(2)
# a file dropped on the drop zone, as the browser delivers one: a DataTransfer with a File, in drag events
DROP = """
const [text, name] = arguments;
const data = new DataTransfer();
data.items.add(new File([text], name, {type: "text/markdown"}));
const zone = document.querySelector("#new .drop");
for (const type of ["dragenter", "dragover", "drop"])
  zone.dispatchEvent(new DragEvent(type, {dataTransfer: data, bubbles: true, cancelable: true}));
"""
KEY = "open-sesame-for-the-test"


@pytest.fixture(scope="module")
def shots(tmp_path_factory, request) -> Path:
    folder = tmp_path_factory.mktemp("page-screenshots")
    request.config.stash.setdefault(SCREENSHOTS, []).append(folder)
    return folder


@pytest.fixture(scope="module", autouse=True)
def browser_present():
    why = chromium()[2]
    if why:
        pytest.skip(why)


def daemon(tmp: Path, **sections) -> Daemon:
    port = free_port()
    http = {"tcp": True, "tcp_host": "127.0.0.1", "tcp_port": port, **sections.pop("http", {})}
    d = Daemon(tmp, base_config(tmp, jobs={"watch": False}, wyoming={"enabled": False}, http=http, **sections))
    d.url = f"http://127.0.0.1:{port}"
    return d.start()


def page(tmp: Path, d: Daemon, shots: Path, prefix: str, *extra) -> Page:
    (tmp / "downloads").mkdir(exist_ok=True)
    return Page(start_browser(tmp / "profile", tmp / "downloads", extra), d.url, shots, prefix)


@contextmanager
def elsewhere():
    """Another site's page (localhost, another port; no policy of ours), as any local web app could serve."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<!doctype html><title>elsewhere</title><p>another site"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def downloaded(folder: Path, name: str, timeout: float = 30.0) -> bytes:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (folder / name).is_file() and not list(folder.glob("*.crdownload")):
            return (folder / name).read_bytes()
        time.sleep(0.2)
    raise AssertionError(f"{name} was not downloaded into {folder}: {sorted(p.name for p in folder.iterdir())}")


def wait_done(p: Page, title: str, timeout: float = 240.0):
    """The library's entry for the job titled `title`, once it shows `done`."""
    def done():
        for li in p.all("ul.jobs li"):
            if li.find_element("css selector", ".title").text == title:
                return li if li.find_element("css selector", ".badge").text == "done" else None
    return p.wait(done, timeout, f"the job {title!r} to be done in the library")


def play_book(p: Page, chapter: str) -> None:
    """Play from `chapter`: the audio runs, the caption shows and a sentence of the text is highlighted."""
    p.wait(lambda: len(p.all(".player .chapters button")) == 2 and p.all(".player .text span"), 30,
           "the player's chapters and text")
    button = [b for b in p.all(".player .chapters button") if b.text.startswith(chapter)][0]
    start = float(button.get_attribute("data-start"))
    button.click()
    p.wait(lambda: p.js("const a = document.querySelector('.player audio'); return !a.paused && a.currentTime > "
                        f"{start} + 0.5"), 30, "the book to play from the chapter")
    current = p.wait(lambda: p.all(".player .text span.current"), 10, "the sentence being read to be highlighted")
    assert float(current[0].get_attribute("data-start")) <= p.js("return document.querySelector('.player audio').currentTime")
    p.wait(lambda: p.text(".player .caption").strip(), 10, "the caption from the WebVTT subtitles")


def test_a_book_from_drop_to_playback_a_stream_and_samples(tmp_path, shots):
    d = daemon(tmp_path)
    p = page(tmp_path, d, shots, "a-")
    try:
        p.open("#status")
        p.wait(lambda: "cpu" in p.text("#status .health") and "reachable" in p.text("#status .health"), 30, "status")
        p.shot("status")

        p.open("#new")
        p.wait(lambda: len(p.all("#new select[name=format] option")) > 1, 30, "the formats the server writes")
        offered = [o.get_attribute("value") for o in p.all("#new select[name=format] option")][1:]
        assert offered == d.get("/v1/formats")[1]["books"]  # whatever the server lists
        p.js(DROP, STORY, "story.md")
        p.wait(lambda: len(p.all("#new .preview tbody tr")) == 3, 60, "the preview's three chapters")
        assert p.text("#new .totals").startswith("3 of 3 chapters")
        p.all("#new .preview tbody input[type=checkbox]")[1].click()  # leave chapter 2 out
        p.wait(lambda: p.text("#new .totals").startswith("2 of 3 chapters"), 5, "the totals without chapter 2")
        segments = int(p.text("#new .totals").split(", ")[1].split()[0])
        p.find("#new select[name=format] option[value=mp3]").click()
        p.find("#new select[name=voice] option[value=ryan]").click()
        p.shot("new-book-preview")
        p.find("#new button[type=submit]").click()

        p.wait(lambda: p.js("return location.hash") == "#library", 30, "the library after submit")
        p.wait(lambda: p.all("ul.jobs li progress"), 10, "the job in the library")
        p.shot("library-progress")
        li = wait_done(p, "story")
        job = li.get_attribute("data-id")
        summary = d.get(f"/v1/jobs/{job}")[1]
        assert summary["progress"]["total"] == segments  # chapters 1 and 3, as previewed
        li.find_element("css selector", ".actions button").click()  # Play
        play_book(p, "Three")
        assert p.js("return document.querySelector('.player audio').src").endswith("/files/story.mp3")
        p.shot("library-playing")

        files = {a.text: a for a in p.all(".player .files a")}
        assert {"story.mp3", "story.vtt", "manifest.json"} <= set(files), files
        files["story.vtt"].click()
        assert downloaded(tmp_path / "downloads", "story.vtt") == (Path(summary["output_dir"]) / "story.vtt").read_bytes()

        # another book: cancelled while it is made, then retried
        p.open("#new")
        p.wait(lambda: p.all("#new select[name=voice] option"), 30, "the voices")
        p.find("#new textarea").send_keys("# Long\n\n" + book_text(12))
        p.wait(lambda: len(p.all("#new .preview tbody tr")) == 1, 60, "the preview of pasted text")
        p.find("#new button[type=submit]").click()
        li = p.wait(lambda: [x for x in p.all("ul.jobs li") if x.find_element("css selector", ".title").text == "Long"],
                    30, "the second job")[0]
        p.wait(lambda: li.find_element("css selector", ".actions button").text == "Cancel", 10, "its Cancel button")
        li.find_element("css selector", ".actions button").click()
        p.wait(lambda: li.find_element("css selector", ".badge").text == "cancelled", 30, "the job cancelled")
        p.shot("library-cancelled")
        li.find_element("css selector", ".actions button").click()  # Retry
        p.wait(lambda: li.find_element("css selector", ".badge").text in ("queued", "running", "done"), 30, "the retry")
        assert d.get(f"/v1/jobs/{li.get_attribute('data-id')}")[1]["state"] in ("queued", "running", "done")

        p.open("#try")
        p.wait(lambda: p.all("#try select[name=voice] option"), 30, "the voices")
        p.find("#try textarea").clear()
        p.find("#try textarea").send_keys("Hello there. This is a test of the streaming route.")
        p.find("#try button[type=submit]").click()
        ttfa = p.wait(lambda: p.find("#try .ttfa").get_attribute("data-ms"), 60, "the time to first audio")
        assert int(ttfa) > 0 and p.text("#try .ttfa") == f"{ttfa} ms"
        p.wait(lambda: float(p.text("#try .seconds").split()[0]) > 0.5, 60, "audio to arrive")
        p.shot("try-it")

        p.open("#voices")
        p.wait(lambda: len(p.all("ul.voices li")) == 4, 30, "the checkpoint's speakers")
        assert not p.find("#clone-form").is_displayed()  # CustomVoice: nothing to clone
        p.find("ul.voices li[data-voice=vivian] .actions button").click()
        p.wait(lambda: p.js("const a = document.querySelector('li[data-voice=vivian] audio');"
                            "return !a.hidden && a.readyState >= 1"), 60, "vivian's sample")
        p.shot("voices")

        # narrow: a phone's width
        p.d.set_window_size(400, 900)
        p.open("#new")
        p.wait(lambda: len(p.all("#new select[name=format] option")) > 1, 30, "the page at a narrow width")
        assert p.js("return document.documentElement.scrollWidth <= window.innerWidth + 1")
        p.shot("new-book-narrow")
        p.d.set_window_size(1280, 900)

        # a page of another site on this machine posting a book here: refused, nothing queued
        jobs = len(d.get("/v1/jobs")[1])
        with elsewhere() as other:
            p.d.get(other)
            p.d.set_script_timeout(30)
            sent = p.d.execute_async_script("""
                const done = arguments[arguments.length - 1];
                const form = new FormData();
                form.append("file", new File(["Read me aloud."], "evil.txt"));
                fetch(arguments[0] + "/v1/jobs", {method: "POST", mode: "no-cors", body: form})
                  .then(() => done("sent"), (e) => done(String(e)));""", d.url)
        assert sent == "sent"  # the browser sent it (the answer is opaque to that page)
        time.sleep(1)
        assert len(d.get("/v1/jobs")[1]) == jobs
        assert "refused a cross-site request: POST /v1/jobs (Origin http://localhost:" in d.log_text()
    finally:
        p.d.quit()
        assert d.stop() == 0


def test_sign_in_clone_rename_delete_and_a_book_with_the_key(tmp_path, shots):
    d = daemon(tmp_path, model={"path": str(BASE)}, http={"api_key": KEY})
    mic = (REF / "ref_b_24k.wav").resolve()
    p = page(tmp_path, d, shots, "b-", "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
             f"--use-file-for-fake-audio-capture={mic}")
    try:
        p.open()
        p.wait(lambda: p.find("#signin").is_displayed(), 30, "the sign-in form")
        assert not p.find("#library").is_displayed()
        p.shot("sign-in")
        p.find("#signin input[name=key]").send_keys("wrong key")
        p.find("#signin button").click()
        p.wait(lambda: "refused" in p.text("#signin-error"), 30, "a wrong key refused")
        p.find("#signin input[name=key]").send_keys(KEY)
        p.find("#signin button").click()
        p.wait(lambda: p.find("#library").is_displayed(), 30, "the library after signing in")
        assert p.js("return sessionStorage.length") == 1

        p.open("#voices")  # a reload: the key is kept for the session
        p.wait(lambda: p.find("#clone-form").is_displayed(), 30, "the clone form of a Base checkpoint")
        assert "none yet" in p.text("#voices .note")
        p.find("#clone-form input[name=audio]").send_keys(str(REF / "ref_a_24k.wav"))
        p.wait(lambda: "ready" in p.text("#clone-form .rec-state"), 30, "the uploaded file")
        p.find("#clone-form input[name=name]").send_keys("upload")
        p.find("#clone-form textarea").send_keys("A reference sentence.")
        p.find("#clone-form button[type=submit]").click()
        p.wait(lambda: p.all("li[data-voice=upload]"), 60, "the voice cloned from a file")

        p.find("#clone-form .record").click()  # the fake microphone plays a file
        p.wait(lambda: "Recording" in p.text("#clone-form .rec-state"), 10, "recording")
        time.sleep(2.5)
        p.find("#clone-form .record").click()
        p.wait(lambda: "recording:" in p.text("#clone-form .rec-state"), 30, "the recording as WAV")
        seconds = float(p.text("#clone-form .rec-state").split(": ")[1].split()[0])
        assert 1.5 < seconds < 5, p.text("#clone-form .rec-state")
        p.find("#clone-form input[name=name]").send_keys("mic")
        p.find("#clone-form button[type=submit]").click()
        p.wait(lambda: p.all("li[data-voice=mic]"), 60, "the voice cloned from the microphone")
        p.shot("voices-cloned")
        assert {v["name"] for v in d.get("/v1/voices")[1]["voices"]} == {"upload", "mic"}

        [b for b in p.all("li[data-voice=mic] .actions button") if b.text == "Rename"][0].click()
        box = p.find("li[data-voice=mic] input[name=new-name]")
        box.clear()
        box.send_keys("mike")
        p.find("li[data-voice=mic] form.inline button[type=submit]").click()
        p.wait(lambda: p.all("li[data-voice=mike]") and not p.all("li[data-voice=mic]"), 30, "the rename")
        [b for b in p.all("li[data-voice=upload] .actions button") if b.text == "Delete"][0].click()
        p.find("li[data-voice=upload] .inline button").click()  # "Yes, delete"
        p.wait(lambda: not p.all("li[data-voice=upload]"), 30, "the deletion")
        assert [v["name"] for v in d.get("/v1/voices")[1]["voices"]] == ["mike"]
        p.find("li[data-voice=mike] .actions button").click()  # its sample, fetched with the key
        p.wait(lambda: p.js("const a = document.querySelector('li[data-voice=mike] audio');"
                            "return a.src.startsWith('blob:') && a.readyState >= 1"), 60, "mike's sample")
        p.shot("voices-renamed")

        p.open("#try")
        p.wait(lambda: p.all("#try select[name=voice] option[value=mike]"), 30, "the cloned voice to try")
        p.find("#try button[type=submit]").click()
        p.wait(lambda: p.find("#try .ttfa").get_attribute("data-ms"), 60, "the time to first audio")
        p.shot("try-it-cloned")

        p.open("#new")
        p.wait(lambda: p.all("#new select[name=voice] option[value=mike]"), 30, "the voices")
        p.find("#new textarea").send_keys("# Hello\n\nA first sentence.\n\n# Again\n\nA second one.\n")
        p.wait(lambda: len(p.all("#new .preview tbody tr")) == 2, 60, "the preview of pasted text")
        p.find("#new button[type=submit]").click()
        li = wait_done(p, "Hello")
        li.find_element("css selector", ".actions button").click()
        play_book(p, "Again")
        assert p.js("return document.querySelector('.player audio').src").startswith("blob:")  # fetched with the key
        p.shot("library-signed-in")
        [a for a in p.all(".player .files a") if a.text == "Hello.vtt"][0].click()
        out = Path(d.get(f"/v1/jobs/{li.get_attribute('data-id')}")[1]["output_dir"])
        assert downloaded(tmp_path / "downloads", "Hello.vtt") == (out / "Hello.vtt").read_bytes()
    finally:
        p.d.quit()
        assert d.stop() == 0
