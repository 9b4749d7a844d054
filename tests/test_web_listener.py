"""A listener's page in a real browser (headless Chromium, tests/browser_util.py) against the real daemon on the
tiny checkpoint over loopback TCP: an EPUB's cover, author and length in the library; the player below every
screen, playing on while other screens are open, reached by the keyboard alone, with its skips, speed and sleep
timer at a chapter's end; the place where the listener stopped, kept by the daemon across a reload and in a second
browser; the time a running job has left as the daemon measures it; a daemon that stops noticed on every screen,
and its return; the test-model notice; a text with nothing to read; deleting a book (its route comes with another
branch: that test is marked until then). axe-core finds no accessibility violation on any of it."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from daemon_util import book_text, needs_daemon
from library_util import pandoc_epub, png
from page_util import (AUDIO, browser_present, daemon, enter, focused, job_item, mmss, page, shots,  # noqa: F401
                       upload, wait_done)

pytestmark = [needs_daemon, pytest.mark.browser]


def test_the_player_keeps_the_place_across_reloads_and_browsers(tmp_path, shots):
    from selenium.webdriver.support.ui import Select

    cover = png(48, 72, (30, 90, 160))
    epub = pandoc_epub(tmp_path / "epub", "# First\n\n" + book_text(4) + "\n# Second\n\n" + book_text(4),
                       "Blue Book", "Ann Author", cover)
    d = daemon(tmp_path)
    p = page(tmp_path, d, shots, "c-")
    second = None
    try:
        p.open("#new")
        p.wait(lambda: len(p.all("#new select[name=format] option")) > 1, 30, "the New book screen")
        p.find("#new input[type=file]").send_keys(str(epub))
        p.wait(lambda: p.all("#new .preview tbody tr"), 60, "the preview of the EPUB")
        p.find("#new select[name=format] option[value=mp3]").click()
        p.find("#new button[type=submit]").click()
        li = wait_done(p, "Blue Book")
        job = li.get_attribute("data-id")
        summary = d.get(f"/v1/jobs/{job}")[1]
        chapters = d.get(f"/v1/jobs/{job}/files/manifest.json")[1]["chapter_list"]
        # the library: the EPUB's cover, its author, the book's length
        assert p.wait(lambda: p.js(f"const i = document.querySelector('li[data-id=\"{job}\"] img.cover');"
                                   "return i && i.complete && i.naturalWidth"), 30, "the cover") == 48
        assert summary["length"]["measured"]
        assert li.find_element("css selector", ".byline").text == f"by Ann Author · {mmss(summary['length']['seconds'])} long"
        p.shot("library-cover")
        p.axe("Library with a cover")

        enter(p, li.find_element("css selector", ".actions button"))  # Play
        p.wait(lambda: p.js(f"return !{AUDIO}.paused && {AUDIO}.currentTime > 0.2"), 30, "the book to play")
        length = p.js(f"return {AUDIO}.duration")
        assert length == pytest.approx(summary["length"]["seconds"], abs=0.5)
        assert "Ann Author" in p.text("#player .where") and p.find("#player img.cover").is_displayed()

        # it plays on while the listener opens other screens
        for screen in ("voices", "new", "status", "try"):
            p.js(f"location.hash = '#{screen}'")
            p.wait(lambda: p.find(f"#{screen}").is_displayed(), 10, f"the {screen} screen")
            at = p.js(f"return {AUDIO}.currentTime")
            if at > length - 1.5:  # near its end: back to the start, to hear it go on
                p.js(f"{AUDIO}.currentTime = 0; {AUDIO}.play()")
                at = 0.0
            p.wait(lambda: p.js(f"return !{AUDIO}.paused && {AUDIO}.currentTime > {at} + 0.3"), 20,
                   f"the book playing on under {screen}")
            assert p.find("#player").is_displayed()
        p.shot("playing-under-try-it")
        p.axe("Try it with the player")
        p.js("location.hash = '#library'")

        # the keyboard alone reaches the library's actions and every control of the player
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.keys import Keys

        p.js("document.activeElement.blur()")
        reached = []
        for _ in range(60):
            ActionChains(p.d).send_keys(Keys.TAB).perform()
            reached.append(p.js("const e = document.activeElement; return e.tagName + ':' + (e.textContent.trim() || "
                                "e.getAttribute('aria-label') || e.className)"))
        wanted = {"BUTTON:Play", "BUTTON:Delete", "AUDIO:", "BUTTON:Back 15 s", "BUTTON:Forward 30 s",
                  "A:Chapters and text", "BUTTON:Close"}
        got = {r.split(":")[0] + ":" + (r.split(":", 1)[1] if not r.startswith(("AUDIO", "SELECT")) else "") for r in reached}
        assert wanted <= got, (wanted - got, reached)
        assert sum(r.startswith("SELECT") for r in set(reached)) >= 2  # the speed and the sleep timer

        # skips and speed
        p.js(f"{AUDIO}.pause(); {AUDIO}.currentTime = 1")
        p.wait(lambda: p.js(f"return {AUDIO}.paused && Math.abs({AUDIO}.currentTime - 1) < 0.01"), 10, "the pause at 1 s")
        p.find("#player .forward").click()
        assert p.js(f"return {AUDIO}.currentTime") == pytest.approx(min(31, length), abs=0.01)
        p.find("#player .back").click()
        assert p.js(f"return {AUDIO}.currentTime") == pytest.approx(max(min(31, length) - 15, 0), abs=0.01)
        Select(p.find("#player .speed")).select_by_value("1.5")
        assert p.js(f"return {AUDIO}.playbackRate") == 1.5

        # the sleep timer stops at the end of the chapter
        c = max(chapters, key=lambda c: c["end_s"] - c["start_s"])
        p.js(f"{AUDIO}.currentTime = {c['end_s'] - 1.2}")
        p.wait(lambda: p.js(f"return Math.abs({AUDIO}.currentTime - {c['end_s'] - 1.2}) < 0.01"), 10, "the seek")
        Select(p.find("#player .sleep")).select_by_value("chapter")
        assert "end of this chapter" in p.text("#player .sleep-left")
        p.js(f"{AUDIO}.play()")
        p.wait(lambda: p.js(f"return {AUDIO}.paused"), 20, "the sleep timer to stop the book")
        assert p.js(f"return {AUDIO}.currentTime") == pytest.approx(c["end_s"], abs=0.05)
        assert "end of the chapter" in p.text("#player .sleep-left")
        p.shot("sleep-timer")

        # where the listener stopped is kept on the appliance
        stop = round(length * 0.4, 2)
        p.js(f"{AUDIO}.currentTime = {stop}")
        p.wait(lambda: abs(float(p.find("#player").get_attribute("data-saved") or -1) - stop) < 0.01, 10,
               "the place saved")
        kept = d.get(f"/v1/jobs/{job}/position")[1]
        assert kept["position_s"] == pytest.approx(stop, abs=0.01)
        assert kept["chapter"] == max(i for i, ch in enumerate(chapters) if ch["start_s"] <= stop + 0.01)

        p.d.refresh()  # a later visit
        li = job_item(p, "Blue Book")
        assert p.find("#player .speed").get_attribute("value") == "1.5"  # this browser's speed
        enter(p, li.find_element("css selector", ".actions button"))
        p.wait(lambda: "Going on from" in p.text("#player .saved"), 30, "the book opened where it was left")
        assert p.text("#player .saved").startswith(f"Going on from {mmss(stop)}")
        assert p.js(f"return {AUDIO}.currentTime") >= stop - 0.01 and p.js(f"return {AUDIO}.playbackRate") == 1.5
        p.shot("resumed")
        p.axe("the player going on from the place kept")
        p.js(f"{AUDIO}.pause()")

        second = page(tmp_path, d, shots, "c2-", profile="another-browser")  # a browser of its own: nothing shared
        second.open()
        li2 = job_item(second, "Blue Book")
        assert second.js("return localStorage.length") == 0
        enter(second, li2.find_element("css selector", ".actions button"))
        second.wait(lambda: "Going on from" in second.text("#player .saved"), 30, "the second browser going on")
        assert second.js(f"return {AUDIO}.currentTime") >= stop - 0.01
        assert second.js(f"return {AUDIO}.playbackRate") == 1  # the speed is each browser's own
        second.shot("second-browser")
        for b in (p, second):  # the page's strict policy held: nothing it does was refused
            assert not [m for m in b.console() if "Content Security Policy" in m], b.console()
    finally:
        p.d.quit()
        if second is not None:
            second.d.quit()
        assert d.stop() == 0


def test_the_time_left_a_stopped_daemon_and_the_test_model(tmp_path, shots, monkeypatch):
    import jobs.queue.records as records
    from jobs.document import SegmentText
    from jobs.queue import Queue
    from jobs.settings import JobSpec

    d = daemon(tmp_path, jobs={"enabled": False})  # no worker: the job stays as made here
    p = page(tmp_path, d, shots, "d-")
    try:
        # a job some way through, as the queue recorded it: 20 segments finished, one every 6 s until 16 s ago
        q = Queue(d.home / "queue.db")
        job = q.add_job(JobSpec(title="Halfway"), [("One", [SegmentText(f"Sentence {i} here.", f"Sentence {i} here.")
                                                             for i in range(60)])])
        rows = q.claim("test-worker", 60, lease_s=3600)
        start = time.time() - 130
        for i, r in enumerate(rows[:20]):
            monkeypatch.setattr(records, "_now", lambda i=i: start + 6.0 * i)
            assert q.complete(r["id"], f"k{i}", f"/nowhere/{i}.wav", 24000, 24000, 1)
        q.close()
        eta = d.get(f"/v1/jobs/{job}")[1]["eta"]
        assert eta is not None

        p.open("#library")
        li = job_item(p, "Halfway")
        p.wait(lambda: li.get_attribute("data-finish-at"), 30, "the time left")
        assert float(li.get_attribute("data-finish-at")) == pytest.approx(eta["finish_at"], abs=0.01)
        shown = re.search(r"about (\d+):(\d\d) left", li.find_element("css selector", ".counts").text)
        assert shown, li.find_element("css selector", ".counts").text
        assert int(shown[1]) * 60 + int(shown[2]) == pytest.approx(eta["finish_at"] - time.time(), abs=15)
        p.shot("library-time-left")

        # the checkpoint is a test model: said where books are made, and on Status
        p.open("#new")
        p.wait(lambda: p.find("#new .test-model").is_displayed(), 30, "the test-model notice")
        assert "random weights" in p.text("#new .test-model") and "noise" in p.text("#new .test-model")
        # a text with nothing to read says so (not "0 of 0 chapters")
        p.find("#new textarea").send_keys("!!! ... ??? --- ***")
        p.wait(lambda: "nothing in it can be read aloud" in p.text("#new .error"), 60, "why nothing can be read")
        assert not p.all("#new .totals") and not p.find("#new button[type=submit]").is_enabled()
        p.shot("new-book-nothing-to-read")
        p.axe("New book with the test-model notice and an error")

        p.open("#status")
        p.wait(lambda: "reachable" in p.text("#status .health"), 30, "status")
        assert p.find("#status .test-model").is_displayed() and "random weights" in p.text("#status .test-model")
        assert "test model" in p.text("#status .health")
        assert p.text("#status .state") == "ok"

        # the daemon stops: Status says so, and every screen says why in words, not the browser's
        assert d.stop() == 0
        p.wait(lambda: "not answering" in p.text("#status .health"), 30, "Status to notice the daemon is gone")
        assert "ok" not in p.text("#status .state")
        p.wait(lambda: p.find("#offline").is_displayed(), 30, "the banner")
        assert "does not answer" in p.text("#offline")
        p.shot("status-daemon-stopped")
        p.axe("Status with the daemon stopped")
        for screen in ("library", "voices"):
            p.js(f"location.hash = '#{screen}'")
            p.wait(lambda: p.find(f"#{screen}").is_displayed(), 10, screen)
            time.sleep(1)  # its refresh had its chance to fail
            assert "Failed to fetch" not in p.find("body").text and p.find("#offline").is_displayed()

        d.start()  # back: the banner goes, the screens are read again
        p.wait(lambda: not p.find("#offline").is_displayed(), 60, "the banner to go once the daemon answers")
        p.js("location.hash = '#status'")
        p.wait(lambda: p.text("#status .state") == "ok", 30, "Status ok again")
    finally:
        p.d.quit()
        assert d.stop() == 0


def test_deleting_a_finished_book(tmp_path, shots):
    from selenium.webdriver.common.keys import Keys

    d = daemon(tmp_path)
    p = page(tmp_path, d, shots, "e-")
    try:
        job = upload(d, "gone.md", "# Gone\n\n" + book_text(2), {"format": "mp3"})
        out = Path(d.wait_job(job, timeout=180)["output_dir"])
        p.open("#library")
        li = wait_done(p, "gone")
        enter(p, li.find_element("css selector", ".actions button"))  # Play
        p.wait(lambda: p.js(f"return !{AUDIO}.paused"), 30, "the book to play")
        enter(p, [b for b in li.find_elements("css selector", ".actions button") if b.text == "Delete"][0])
        p.wait(lambda: focused(p) == "BUTTON#.:Yes, delete", 10, "the confirmation, focused")
        assert "Delete gone and its files?" in li.find_element("css selector", ".confirm").text
        p.shot("delete-confirm")
        p.axe("the confirmation to delete a book")
        p.d.switch_to.active_element.send_keys(Keys.ENTER)
        p.wait(lambda: not p.all(f"li[data-id='{job}']"), 30, "the book gone from the library")
        assert p.text("#library .said").startswith("Deleted gone")
        assert focused(p) != "BODY" and not p.find("#player").is_displayed()
        assert p.js(f"return {AUDIO}.paused")
        assert d.get(f"/v1/jobs/{job}")[0] == 404 and not out.exists()
        p.shot("deleted")
    finally:
        p.d.quit()
        assert d.stop() == 0
