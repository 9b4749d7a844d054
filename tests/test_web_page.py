"""The page in a real browser (headless Chromium through Selenium, tests/browser_util.py) against the real
daemon on the tiny checkpoints over loopback TCP: a document dropped, previewed with a chapter left out,
made into a book, followed to the end, played with its chapters, captions and the sentence highlighted,
and downloaded; a stream tried with its time to first audio; voice samples; then, on a Base checkpoint
behind an API key, the sign-in (a wrong key refused), a voice cloned from a file and one from the
(fake) microphone, cloned again under a saved name (Replace), renamed and deleted, and a book made and
played with the key; a cross-site request from another origin in the same browser queues nothing. The
keyboard's focus stays on the page after every action (Make the book, Play, Cancel, Play sample, Replace),
"auto" is offered once among the languages, Status fits a phone's width with a long model path, and axe-core
finds no accessibility violation on any screen. The listener's player, the time left, a stopped daemon and
deleting: tests/test_web_listener.py. Each screen is saved as a screenshot in a folder the run names at its
end."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from daemon_util import CV, ROOT, book_text, needs_daemon
from page_util import (AUDIO, browser_present, daemon, downloaded, enter, fits, focused, languages, page,  # noqa: F401
                       play_book, shots, wait_done)

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


def test_a_book_from_drop_to_playback_a_stream_and_samples(tmp_path, shots):
    # the checkpoint in a folder of a long name without a break (as a model's folder often is): Status at a
    # phone's width must still fit it
    model = tmp_path / "checkpoints_of_this_appliance" / "Qwen3_TTS_12Hz_0_6B_CustomVoice_tiny_random_weights"
    model.parent.mkdir()
    model.symlink_to(CV)
    d = daemon(tmp_path, model={"path": str(model)})
    p = page(tmp_path, d, shots, "a-")
    try:
        p.open("#status")
        p.wait(lambda: "cpu" in p.text("#status .health") and "reachable" in p.text("#status .health"), 30, "status")
        p.shot("status")
        p.axe("Status")

        p.open("#new")
        p.wait(lambda: len(p.all("#new select[name=format] option")) > 1, 30, "the formats the server writes")
        offered = [o.get_attribute("value") for o in p.all("#new select[name=format] option")][1:]
        assert offered == d.get("/v1/formats")[1]["books"]  # whatever the server lists
        assert languages(p, "new").count("auto") == 1, languages(p, "new")  # offered once, not twice
        p.js(DROP, STORY, "story.md")
        p.wait(lambda: len(p.all("#new .preview tbody tr")) == 3, 60, "the preview's three chapters")
        assert p.text("#new .totals").startswith("3 of 3 chapters")
        p.all("#new .preview tbody input[type=checkbox]")[1].click()  # leave chapter 2 out
        p.wait(lambda: p.text("#new .totals").startswith("2 of 3 chapters"), 5, "the totals without chapter 2")
        segments = int(p.text("#new .totals").split(", ")[1].split()[0])
        p.find("#new select[name=format] option[value=mp3]").click()
        p.find("#new select[name=voice] option[value=ryan]").click()
        p.find("#new select[name=language] option[value=german]").click()  # the captions say "de" (below)
        p.wait(lambda: not p.find("#new .preview").get_attribute("aria-busy"), 30, "the preview read again")
        p.shot("new-book-preview")
        p.axe("New book with a preview")
        enter(p, "#new button[type=submit]")  # Make the book, from the keyboard

        p.wait(lambda: p.js("return location.hash") == "#library", 30, "the library after submit")
        p.wait(lambda: p.all("ul.jobs li progress"), 10, "the job in the library")
        # the keyboard goes on at the new book, not at the page's top
        p.wait(lambda: p.js("return document.activeElement.closest('ul.jobs li')?.querySelector('.title').textContent")
               == "story", 10, f"the focus on the new book (it is on {focused(p)})")
        p.shot("library-progress")
        li = wait_done(p, "story")
        job = li.get_attribute("data-id")
        summary = d.get(f"/v1/jobs/{job}")[1]
        assert summary["progress"]["total"] == segments  # chapters 1 and 3, as previewed
        enter(p, li.find_element("css selector", ".actions button"))  # Play, from the keyboard
        p.wait(lambda: p.js(f"return !{AUDIO}.paused"), 30, "the book to play")
        p.wait(lambda: p.js("return document.activeElement.id") == "player-title", 10,  # on in the player
               f"the focus in the player (it is on {focused(p)})")
        play_book(p, "Three")
        assert p.js(f"return {AUDIO}.src").endswith("/files/story.mp3")
        # the captions say what is spoken: the manifest's BCP-47 tag of the job's language (auto: text.language's guess)
        man = d.get(f"/v1/jobs/{job}/files/manifest.json")[1]
        assert p.js(f"return {AUDIO}.querySelector('track').srclang") == man["language"] == "de", man.get("language")
        p.shot("library-playing")
        p.axe("Library with a book playing")
        # the read-along text is the book as it shows: each chapter's spoken title is its heading, once, and no
        # paragraph starts with it again
        for section in p.all(".book-view .text section"):
            heading = section.find_element("css selector", "h5")
            assert heading.find_elements("css selector", "span"), heading.text  # the title, highlighted when heard
            paras = [x.text for x in section.find_elements("css selector", "p")]
            assert paras and not [x for x in paras if x.startswith(heading.text)], (heading.text, paras)

        files = {a.text: a for a in p.all(".book-view .files a")}
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
        enter(p, li.find_element("css selector", ".actions button"))  # Cancel, from the keyboard
        p.wait(lambda: li.find_element("css selector", ".badge").text == "cancelled", 30, "the job cancelled")
        p.wait(lambda: focused(p).startswith("BUTTON#.:Retry"), 10, f"the focus on Retry (it is on {focused(p)})")
        p.shot("library-cancelled")
        li.find_element("css selector", ".actions button").click()  # Retry
        p.wait(lambda: li.find_element("css selector", ".badge").text in ("queued", "running", "done"), 30, "the retry")
        assert d.get(f"/v1/jobs/{li.get_attribute('data-id')}")[1]["state"] in ("queued", "running", "done")

        p.open("#try")
        p.wait(lambda: p.all("#try select[name=voice] option"), 30, "the voices")
        assert languages(p, "try").count("auto") == 1
        p.find("#try textarea").clear()
        p.find("#try textarea").send_keys("Hello there. This is a test of the streaming route.")
        p.find("#try button[type=submit]").click()
        ttfa = p.wait(lambda: p.find("#try .ttfa").get_attribute("data-ms"), 60, "the time to first audio")
        assert int(ttfa) > 0 and p.text("#try .ttfa") == f"{ttfa} ms"
        p.wait(lambda: float(p.text("#try .seconds").split()[0]) > 0, 60, "audio to arrive")  # (random length)
        p.shot("try-it")
        p.axe("Try it")

        p.open("#voices")
        p.wait(lambda: len(p.all("ul.voices li")) == 4, 30, "the checkpoint's speakers")
        assert not p.find("#clone-form").is_displayed()  # CustomVoice: nothing to clone
        enter(p, "ul.voices li[data-voice=vivian] .actions button")  # Play sample, from the keyboard
        p.wait(lambda: p.js("const a = document.querySelector('li[data-voice=vivian] audio');"
                            "return !a.hidden && a.readyState >= 1"), 60, "vivian's sample")
        assert focused(p) == "BUTTON#.:Play sample"  # the focus stayed on it
        p.shot("voices")
        p.axe("Voices")

        # narrow: a phone's width
        p.d.set_window_size(400, 900)
        p.open("#new")
        p.wait(lambda: len(p.all("#new select[name=format] option")) > 1, 30, "the page at a narrow width")
        assert fits(p)
        p.shot("new-book-narrow")
        p.open("#status")  # the model's path is one long word
        p.wait(lambda: "reachable" in p.text("#status .health"), 30, "status at a narrow width")
        assert fits(p), p.js("return [document.documentElement.scrollWidth, innerWidth, "
                             "document.querySelector('main').scrollWidth]")
        p.shot("status-narrow")
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
        p.axe("Voices of a Base checkpoint")

        # cloned again under a name already saved: the page asks, and Replace replaces it
        p.find("#clone-form input[name=audio]").send_keys(str(REF / "ref_b_24k.wav"))
        p.wait(lambda: "ready" in p.text("#clone-form .rec-state"), 30, "the second file")
        p.find("#clone-form input[name=name]").send_keys("upload")
        enter(p, "#clone-form button[type=submit]")
        p.wait(lambda: p.all("#clone-form .conflict button"), 60, "the choice to replace the saved voice")
        assert "already saved" in p.text("#clone-form .conflict") and "overwrite" not in p.text("#clone-form")
        assert focused(p) == "BUTTON#.:Replace upload"
        p.shot("voices-replace")
        p.axe("the choice to replace a voice")
        enter(p, "#clone-form .conflict button")
        p.wait(lambda: p.text("#clone-form .rec-state") == "Replaced upload.", 60, "the voice replaced")
        assert "voice upload replaced" in d.log_text() and focused(p) != "BODY"
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
        assert p.js(f"return {AUDIO}.src").startswith("blob:")  # fetched with the key
        p.shot("library-signed-in")
        [a for a in p.all(".book-view .files a") if a.text == "Hello.vtt"][0].click()
        out = Path(d.get(f"/v1/jobs/{li.get_attribute('data-id')}")[1]["output_dir"])
        assert downloaded(tmp_path / "downloads", "Hello.vtt") == (out / "Hello.vtt").read_bytes()
    finally:
        p.d.quit()
        assert d.stop() == 0
