"""Headless Chromium for the page's tests: Debian's `chromium` driven through its `chromedriver` by Selenium,
with nothing downloaded (the driver is named, so Selenium Manager has nothing to fetch; Chromium's own
background networking is off), a fresh profile per browser, and screenshots saved to a folder the run names
at its end (tests/conftest.py)."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

SCREENSHOTS = pytest.StashKey[list]()  # folders of screenshots saved in this run
# axe-core, the accessibility checker (npm; ./install.sh --dev runs `npm ci` in tests/fixtures/axe)
AXE = Path(__file__).resolve().parent / "fixtures" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--autoplay-policy=no-user-gesture-required", "--window-size=1280,900")


def chromium() -> tuple[Optional[str], Optional[str], str]:
    """(browser, driver, why not): the Chromium and chromedriver on PATH, or the reason they cannot run."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return None, None, "selenium is not installed (pip install -e '.[test]')"
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        missing = " and ".join(n for n, p in (("chromium", browser), ("chromedriver", driver)) if not p)
        return None, None, f"{missing} not found (apt-get install chromium chromium-driver)"
    return browser, driver, ""


def start_browser(profile: Path, downloads: Path, extra: tuple = ()):
    """A headless Chromium with a fresh profile in `profile`, saving downloads into `downloads`."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver, why = chromium()
    if why:
        pytest.skip(why)
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager, should it run at all, fetches nothing
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (*FLAGS, f"--user-data-dir={profile}", *extra):
        options.add_argument(flag)
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                              "download.prompt_for_download": False})
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    d.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    return d


class Page:
    """One browser on the page: waiting for what it shows, and screenshots numbered in order."""

    def __init__(self, driver, base: str, shots: Path, prefix: str = ""):
        self.d, self.base, self.shots, self.prefix, self.n = driver, base, shots, prefix, 0

    def open(self, fragment: str = "") -> None:
        self.d.get(f"{self.base}/{fragment}")

    def js(self, script: str, *args):
        return self.d.execute_script(script, *args)

    def find(self, css: str):
        from selenium.webdriver.common.by import By

        return self.d.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list:
        from selenium.webdriver.common.by import By

        return self.d.find_elements(By.CSS_SELECTOR, css)

    def text(self, css: str) -> str:
        found = self.all(css)
        return found[0].text if found else ""

    def wait(self, what: Callable[[], object], timeout: float = 30.0, why: str = ""):
        """Wait until `what()` is truthy (errors count as not yet); its value, else a failure with the
        page's console and a screenshot."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                got = what()
                if got:
                    return got
            except Exception as exc:  # the element is not there yet, or went stale
                last = exc
            time.sleep(0.2)
        self.shot("failed-wait")
        pytest.fail(f"waited {timeout} s for {why or what}: last error {last!r}\nconsole: {self.console()}\n"
                    f"notice: {self.text('#notice')!r}")

    def console(self) -> list:
        try:
            return [e["message"] for e in self.d.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
        except Exception:
            return []

    def shot(self, name: str) -> Path:
        """A screenshot of the whole page (the window made as tall as the page) as PREFIX-NN-name.png."""
        self.n += 1
        width = self.d.get_window_size()["width"]
        height = self.js("const main = document.querySelector('main'), rest = main ? document.body.offsetHeight - "
                         "main.clientHeight : 0; return Math.max(document.documentElement.scrollHeight, "
                         "main ? main.scrollHeight + rest : 0)")  # also where only the page's main part scrolls
        self.d.set_window_size(width, min(max(int(height) + 140, 700), 4000))
        path = self.shots / f"{self.prefix}{self.n:02d}-{name}.png"
        self.d.save_screenshot(str(path))
        return path

    def axe(self, why: str) -> None:
        """Run axe-core on the page as it is now: fail with the violations (rule, impact, the elements) when
        there are any. `why`: what the page shows, for the message."""
        if not AXE.is_file():
            pytest.skip(f"axe-core is not installed ({AXE}): cd tests/fixtures/axe && npm ci (./install.sh --dev does)")
        if not self.js("return Boolean(window.axe)"):
            self.js(AXE.read_text(encoding="utf-8"))  # run by the driver: the page's own policy allows no scripts
        self.d.set_script_timeout(60)
        found = self.d.execute_async_script("""
            const done = arguments[arguments.length - 1];
            axe.run(document, {resultTypes: ["violations"]}).then(
              (r) => done(r.violations.map((v) => ({id: v.id, impact: v.impact, help: v.help,
                                                     nodes: v.nodes.map((n) => n.target.join(" ")).slice(0, 5)}))),
              (e) => done([{id: "axe-error", impact: "", help: String(e), nodes: []}]));""")
        if found:
            self.shot("axe-violations")
            pytest.fail(f"axe-core found {len(found)} accessibility violation(s) on {why}:\n" +
                        "\n".join(f"  {v['id']} ({v['impact']}): {v['help']}: {v['nodes']}" for v in found))
