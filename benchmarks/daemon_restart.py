"""A daemon killed with SIGKILL mid-book and started again: how long until the book moves again.

    python -m benchmarks.daemon_restart --model tests/data/tiny/cv_small --kills 6 --json restart.json

A book of `--segments` segments goes to a daemon (started here on the checkpoint, on the CPU by default);
at random moments while it is synthesized the daemon is killed with SIGKILL and started again on the
same spool. For each restart: `start_s` (the new process started -> ready: HOME/daemon.json written and
/health answering, the moment it sends READY=1), `moving_s` (ready -> the segments the dead daemon had in
flight finished: they come back by process, not after `jobs.lease_s`) and `first_s` (ready -> any new
segment finished). The medians and maxima are printed and, with --json, written.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.load.daemon import DaemonProcess

BOOK = "Alpha sentence number {i} is read aloud.\n\n"


def _leased_and_done(db: Path, job: str) -> tuple[set, set]:
    from jobs.queue import Queue

    q = Queue(db)
    try:
        return ({s["id"] for s in q.segments(job, state="leased")}, {s["id"] for s in q.segments(job, state="done")})
    finally:
        q.close()


async def _restart(daemon: DaemonProcess, db: Path, job: str, timeout: float) -> dict:
    """Kill, start again, time it (see the module docstring)."""
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait(30)
    held, done = _leased_and_done(db, job)
    t0 = time.monotonic()
    daemon.start()
    await daemon.wait_ready(timeout)
    ready = time.monotonic()
    first = moving = None
    while moving is None and time.monotonic() - ready < timeout:
        now_done = _leased_and_done(db, job)[1]
        first = first or (time.monotonic() - ready if now_done - done else None)
        moving = time.monotonic() - ready if held <= now_done else None
        await asyncio.sleep(0.02)
    return {"done_at_kill": len(done), "in_flight": len(held), "start_s": round(ready - t0, 2),
            "moving_s": None if moving is None else round(moving, 2), "first_s": None if first is None else round(first, 2)}


async def measure(args) -> dict:
    from appliance.client import DaemonClient

    work = Path(tempfile.mkdtemp(prefix="tts-restart-"))
    run = Path(tempfile.mkdtemp(prefix="tts-run-"))  # AF_UNIX paths must stay short
    cfg = {"model": {"path": str(Path(args.model).resolve()), "device": args.device, "threads": 1},
           "jobs": {"home": str(work / "home"), "watch": False, "guard": False, "batch_size": 4, "lease_s": args.lease_s},
           "wyoming": {"enabled": False}, "service": {"runtime_dir": str(run)}}
    daemon = DaemonProcess(cfg, work, work / "daemon.log")
    daemon.start()
    target, _ = await daemon.wait_ready(args.timeout)
    book = work / "book.txt"
    book.write_text("".join(BOOK.format(i=i) for i in range(args.segments)))
    job, err = DaemonClient(target.socket).submit_file(book, {"format": "wav", "sampling": {"max_new_tokens": 10}})
    if err:
        raise SystemExit(f"submit failed: {err}")
    db, rng, runs = daemon.home / "queue.db", random.Random(args.seed), []
    try:
        for k in range(args.kills):
            await asyncio.sleep(rng.uniform(1.0, 4.0))
            runs.append(await _restart(daemon, db, job, args.timeout))
            print(f"kill {k}: {runs[-1]}", flush=True)
    finally:
        daemon.stop()
    out = {"runs": runs, "log": str(daemon.log_path)}
    for key in ("start_s", "moving_s", "first_s"):
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = {"median": statistics.median(values), "max": max(values)} if values else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint folder (e.g. tests/data/tiny/cv_small)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--segments", type=int, default=300)
    ap.add_argument("--kills", type=int, default=6)
    ap.add_argument("--lease-s", type=float, default=120.0, help="jobs.lease_s (the default: 120)")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    res = asyncio.run(measure(args))
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
