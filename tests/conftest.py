"""Shared test setup: the `gpu` marker skips cleanly where no NVIDIA GPU is present; with
$TTS_APPLIANCE_REQUIRE_SYSTEM_TESTS=1 (what .ci/run sets where it installed their packages) a
`system`, `browser`, `epubcheck`, `ace`, `converters` or `decoders` test that skips fails instead, so CI cannot go
green with the live systemd checks, the page's browser test, the narrated EPUBs' validation or accessibility check,
the books converted by pandoc and calibre or the FLAC books read back by ffmpeg and flac unrun; likewise an
`oracle` test (the official qwen-tts package) with $TTS_APPLIANCE_REQUIRE_ORACLE_TESTS=1. Folders of screenshots
the tests saved are named at the end of the run."""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
TINY = DATA / "tiny"
REQUIRE_SYSTEM = "TTS_APPLIANCE_REQUIRE_SYSTEM_TESTS"
REQUIRE_ORACLE = "TTS_APPLIANCE_REQUIRE_ORACLE_TESTS"
# marker -> (the variable that turns a skip of such a test into a failure, what to do about it); .ci/run sets both
REQUIRED = {
    "system": (REQUIRE_SYSTEM, "install what .ci/run installs as root, or unset the variable where it cannot run"),
    "browser": (REQUIRE_SYSTEM, "install chromium and chromium-driver (apt-get install chromium chromium-driver, as "
                                ".ci/run and ./install.sh --dev do as root) and the test extras (selenium), or unset "
                                "the variable where they cannot be installed"),
    "oracle": (REQUIRE_ORACLE, "build the oracle with tests/fixtures/oracle_venv.sh (./install.sh --dev does), "
                               "or unset the variable where it cannot run"),
    "epubcheck": (REQUIRE_SYSTEM, "apt-get install epubcheck (.ci/run and ./install.sh --dev do as root), "
                                  "or unset the variable where it cannot run"),
    "ace": (REQUIRE_SYSTEM, "run tests/fixtures/ace_install.sh (./install.sh --dev does; it needs npm) and apt-get "
                            "install chromium, or unset the variable where they cannot be installed"),
    "converters": (REQUIRE_SYSTEM, "apt-get install pandoc calibre (./install.sh --dev does as root), "
                                   "libreoffice-writer-nogui, texlive-xetex texlive-lang-chinese fonts-noto-cjk "
                                   "(.ci/run installs them all), "
                                   "or unset the variable where they cannot be installed"),
    "decoders": (REQUIRE_SYSTEM, "apt-get install ffmpeg flac (.ci/run and ./install.sh --dev do as root), "
                                 "or unset the variable where they cannot be installed"),
}
# the codec's debug guard (engines.codec.decoder.check_codes): a code out of range fails loudly, with a message;
# set before engines is imported (it is read once), inherited by the daemons the tests start
os.environ["TTS_APPLIANCE_CHECK_CODES"] = "1"


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (CUDA not available here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, config):
    """Name the folders of screenshots the browser tests saved (tests/browser_util.py)."""
    from browser_util import SCREENSHOTS

    for folder in config.stash.get(SCREENSHOTS, []):
        terminalreporter.write_line(f"page screenshots: {folder}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skipped `system`, `browser`, `epubcheck` or `ace` (`oracle`) test is a failure where
    $TTS_APPLIANCE_REQUIRE_SYSTEM_TESTS ($TTS_APPLIANCE_REQUIRE_ORACLE_TESTS) is set (not 0)."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped:
        return
    for marker, (var, todo) in REQUIRED.items():
        if item.get_closest_marker(marker) and os.environ.get(var, "0") not in ("", "0"):
            why = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            why = why.removeprefix("Skipped: ")
            report.outcome = "failed"
            report.longrepr = f"{var}=1: this {marker} test must run here, but it skipped: {why}\n({todo})"
            return


@pytest.fixture(autouse=True, scope="session")
def no_machine_config(tmp_path_factory):
    """Commands under test read an empty config file, not this machine's (/etc/tts-appliance or
    ~/.config/tts-appliance): $TTS_APPLIANCE_CONFIG names it (an explicit --config still wins)."""
    path = tmp_path_factory.mktemp("config") / "config.yaml"
    path.write_text("# empty: the shipped defaults only\n")
    saved = os.environ.get("TTS_APPLIANCE_CONFIG")
    os.environ["TTS_APPLIANCE_CONFIG"] = str(path)
    yield path
    if saved is None:
        os.environ.pop("TTS_APPLIANCE_CONFIG", None)
    else:
        os.environ["TTS_APPLIANCE_CONFIG"] = saved


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    return TINY


def tiny_codec_dir() -> Path | None:
    """The tiny codec folder shared by the tiny checkpoints (None when the fixtures are not built)."""
    meta = TINY / "golden" / "codec.json"
    if meta.is_file():
        d = TINY / json.loads(meta.read_text())["codec_dir"]
        if (d / "model.safetensors").is_file():
            return d
    found = sorted(TINY.glob("*/speech_tokenizer/model.safetensors"))
    return found[0].parent if found else None


@pytest.fixture(scope="module")
def codec_dir() -> Path:
    """The tiny codec folder; skips the test when the fixtures are not built."""
    d = tiny_codec_dir()
    if d is None:
        pytest.skip("tiny codec fixture missing (tests/data/tiny/*/speech_tokenizer)")
    return d


@pytest.fixture(scope="module")
def decoder(codec_dir):
    """The tiny codec decoder, fp32 on the CPU (one per test module)."""
    import torch

    from engines.codec.decoder import load_codec_decoder

    return load_codec_decoder(codec_dir, "cpu", torch.float32)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread is fastest and immune to CPU contention on shared runners."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def pg():
    """A throwaway PostgreSQL server for the module's tests (tests/pg_util.py; skips where it cannot run)."""
    from pg_util import pg_server

    server = pg_server()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request, tmp_path):
    """Where a fresh queue lives: a SQLite file, or a new database on a real PostgreSQL server."""
    if request.param == "sqlite":
        return tmp_path / "queue.db"
    return request.getfixturevalue("pg").url(f"t{uuid.uuid4().hex[:12]}")


@pytest.fixture(scope="session")
def narrated(tmp_path_factory):
    """An EPUB, a Markdown and a plain text file narrated by the tiny model (tests/narrated_util.py), once a
    session: {suffix: (input, manifest, output folder)}."""
    from narrated_util import engine_missing, narrate

    if engine_missing():
        pytest.skip(engine_missing())
    return narrate(tmp_path_factory.mktemp("narrated"))
