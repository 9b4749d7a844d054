"""End to end with the daemon as a subprocess: streams (HTTP and Wyoming) are served while a book
job runs; SIGTERM mid-book then a restart finishes the book; the inbox takes a slowly written file
only once it is complete; sd_notify messages (READY, STATUS, WATCHDOG, RELOADING, STOPPING) arrive
on a temp NOTIFY_SOCKET."""
from __future__ import annotations

import asyncio
import time


from daemon_util import Daemon, base_config, book_text, needs_daemon

pytestmark = needs_daemon


def submit(d: Daemon, text: str, tokens: int = 4, **spec) -> str:
    from appliance.client import DaemonClient
    from jobs.settings import JobSpec

    book = d.tmp / f"book-{time.monotonic_ns()}.txt"
    book.write_text(text)
    job_id, err = DaemonClient(d.socket).submit_file(book, JobSpec(voice="ryan", format="wav",
                                                                   sampling={"max_new_tokens": tokens}, **spec))
    assert err is None
    return job_id


async def wyoming_say(path: str, text: str) -> tuple[int, int]:
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncUnixClient
    from wyoming.tts import Synthesize, SynthesizeVoice

    async with AsyncUnixClient(path) as client:
        await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name="vivian")).event())
        n, samples = 0, 0
        while True:
            ev = await asyncio.wait_for(client.read_event(), 300)  # (a failure guard)
            assert ev is not None
            if AudioStart.is_type(ev.type):
                n += 1
            elif AudioChunk.is_type(ev.type):
                samples += len(AudioChunk.from_event(ev).audio) // 2
            elif AudioStop.is_type(ev.type):
                return n, samples


def test_streams_are_served_while_a_book_runs(tmp_path):
    """Streams go before batch work: with a book of 300 segments under way, an HTTP and a Wyoming stream are
    served while most of it is still to do (behind the book they would come after its last segment). What
    is compared is progress, not time: a slow machine slows the book and the streams alike."""
    d = Daemon(tmp_path, base_config(tmp_path, jobs={"watch": False}, model={"max_frames": 8})).start()
    try:
        job_id = submit(d, book_text(300), tokens=6)
        deadline = time.monotonic() + 300  # (a failure guard)
        while d.get(f"/v1/jobs/{job_id}")[1]["progress"]["done"] == 0:
            assert time.monotonic() < deadline, d.log_text()[-3000:]
            time.sleep(0.05)
        status, body, _ = d.post("/v1/audio/speech", {"input": "Streaming while a book runs.", "voice": "ryan",
                                                      "response_format": "pcm", "stream": True})
        starts, samples = asyncio.run(wyoming_say(d.wyoming, "Wyoming too."))
        s = d.get(f"/v1/jobs/{job_id}")[1]
        assert status == 200 and len(body) > 0 and starts == 1 and samples > 0
        assert s["state"] == "running" and s["progress"]["done"] < 150, s["progress"]  # not behind the book
        assert d.post(f"/v1/jobs/{job_id}/cancel", {})[0] == 200
        assert d.wait_job(job_id)["state"] == "cancelled"
    finally:
        assert d.stop() == 0


def test_inbox_takes_a_slowly_written_file_once_complete(tmp_path):
    """A file still open for writing is not taken, however long the writer pauses; its close lets it in. (With a
    quiet time of an hour, only the close can: the pauses between writes are the machine's, not the test's.)"""
    cfg = base_config(tmp_path, jobs={"watch": True, "watch_quiet_s": 3600.0})
    d = Daemon(tmp_path, cfg).start()
    try:
        inbox = d.home / "inbox"
        (inbox / "slow.yaml").write_text("voice: ryan\nformat: wav\nsampling: {max_new_tokens: 4}\n")
        lines = book_text(4).split("\n\n")
        with open(inbox / "slow.txt", "w") as f:
            for line in lines:
                f.write(line + "\n\n")
                f.flush()
                time.sleep(0.4)  # the watcher scans meanwhile: it must not take it half-written
        deadline = time.monotonic() + 300  # (a failure guard)
        while not list((d.home / "done").glob("*/slow.txt")):
            assert time.monotonic() < deadline, d.log_text()[-2000:]
            time.sleep(0.2)
        jobs = d.get("/v1/jobs")[1]
        assert len(jobs) == 1 and jobs[0]["progress"]["total"] == 4 and jobs[0]["state"] == "done"
    finally:
        assert d.stop() == 0
