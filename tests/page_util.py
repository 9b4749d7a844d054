"""The page's browser tests share these (tests/test_web_page.py, tests/test_web_listener.py): a daemon on the tiny
checkpoint listening on loopback TCP, a browser of its own on it (tests/browser_util.py), keyboard presses and
what has the focus, the library's entries, the player's audio."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from browser_util import SCREENSHOTS, Page, chromium, start_browser
from daemon_util import Daemon, base_config, free_port

AUDIO = "document.querySelector('#player audio')"  # the player's <audio>, in the page's JavaScript


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
    jobs = {"watch": False, **sections.pop("jobs", {})}
    d = Daemon(tmp, base_config(tmp, jobs=jobs, wyoming={"enabled": False}, http=http, **sections))
    d.url = f"http://127.0.0.1:{port}"
    return d.start()


def page(tmp: Path, d: Daemon, shots: Path, prefix: str, *extra, profile: str = "profile") -> Page:
    """A browser of its own (`profile`: its folder; another name is another browser, sharing nothing)."""
    (tmp / "downloads").mkdir(exist_ok=True)
    return Page(start_browser(tmp / profile, tmp / "downloads", extra), d.url, shots, prefix)


def enter(p: Page, css_or_element) -> None:
    """Press Enter on a control, as a keyboard user does (the control takes the focus first)."""
    from selenium.webdriver.common.keys import Keys

    (p.find(css_or_element) if isinstance(css_or_element, str) else css_or_element).send_keys(Keys.ENTER)


def focused(p: Page) -> str:
    """What has the keyboard's focus: its tag, id, classes and text ("BODY" when the focus was dropped)."""
    return p.js("const e = document.activeElement; return e === document.body || !e ? 'BODY' : "
                "`${e.tagName}#${e.id}.${e.className}:${e.textContent.trim().slice(0, 40)}`")


def fits(p: Page) -> bool:
    """Nothing is wider than the window: the page, and its main part where that scrolls (a book playing)."""
    return p.js("const m = document.querySelector('main'); return document.documentElement.scrollWidth <= "
                "innerWidth + 1 && m.scrollWidth <= m.clientWidth + 1")


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
    p.wait(lambda: len(p.all(".book-view .chapters button")) == 2 and p.all(".book-view .text span"), 30,
           "the book's chapters and text")
    button = [b for b in p.all(".book-view .chapters button") if b.text.startswith(chapter)][0]
    start = float(button.get_attribute("data-start"))
    button.click()
    p.wait(lambda: p.js(f"const a = {AUDIO}; return !a.paused && a.currentTime > {start} + 0.5"), 30,
           "the book to play from the chapter")
    current = p.wait(lambda: p.all(".book-view .text span.current"), 10, "the sentence being read to be highlighted")
    assert float(current[0].get_attribute("data-start")) <= p.js(f"return {AUDIO}.currentTime")
    p.wait(lambda: p.text("#player .caption").strip(), 10, "the caption from the WebVTT subtitles")


def job_item(p: Page, title: str):
    """The library's entry of the job titled `title` (once it is there)."""
    return p.wait(lambda: [x for x in p.all("ul.jobs li") if x.find_element("css selector", ".title").text == title],
                  60, f"the job {title!r} in the library")[0]


def languages(p: Page, screen: str) -> list[str]:
    p.wait(lambda: p.all(f"#{screen} select[name=language] option"), 30, "the languages")
    return [o.get_attribute("value") for o in p.all(f"#{screen} select[name=language] option")]


def mmss(seconds: float) -> str:
    """Seconds as the page writes them (m:ss, h:mm:ss)."""
    s = int(seconds + 0.5)
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def upload(d: Daemon, name: str, text: str, spec: dict) -> str:
    """Submit `text` as the file `name` over the daemon's socket; the job's id."""
    b = "pageTestBoundary"
    body = (f'--{b}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n\r\n{text}\r\n'
            f'--{b}\r\nContent-Disposition: form-data; name="spec"\r\n\r\n{json.dumps(spec)}\r\n--{b}--\r\n').encode()
    status, job, _ = d.request("POST", "/v1/jobs", body, {"Content-Type": f"multipart/form-data; boundary={b}"})
    assert status == 201, job
    return job["id"]
