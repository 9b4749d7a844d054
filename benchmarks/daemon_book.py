"""A book through the real daemon: submit it to the running daemon, time it to the finished book.

    # GPU: the shipped daemon (auto slots, auto dtype) on random weights of the 0.6B shape, one book of
    # about 680 segments of 150 frames (12 s) each, FLAC files
    python -m benchmarks.daemon_book --dummy 0.6b --segments 680 --json book.json
    # every GPU of the machine (model.device: all)
    python -m benchmarks.daemon_book --dummy 0.6b --segments 680 --device all --json book_all.json
    # the tiny test model on the CPU (figures mean little there)
    python -m benchmarks.daemon_book --model tests/data/tiny/cv_small --device cpu --segments 6 --frames 4
    # a book of real text on the CPU: the segments the project's segmenter makes of it, each as long as the
    # mean of their expected durations (random weights cannot end a segment where its speech would)
    python -m benchmarks.daemon_book --dummy 0.6b --device cpu --text benchmarks/texts/founding.txt --frames auto

What is measured (the book as a user's `tts-appliance submit` meets it): the daemon is started (or a
running one used, --socket/--url) and its start-up reported apart (`daemon_start_s`); the book goes in
through `POST /v1/jobs` (as `submit` uploads it); then GET /v1/jobs/ID is polled until the job ends.
Reported: the wall time from the upload to the finished book (chapters and book file written: the job
is `done` only then), the time to the last stored segment (what follows is the book's assembly: its last
chapters and the rest of the book file), the segments done at each poll, the audio it holds (segments x
frames x 80 ms with fixed-length segments, else the queue's own durations), audio seconds per wall second, the steady pace (segments finished between 20% and
80% of the book, over the time between), the time to the first finished segment, and the engines' figures
from /health. With `--text FILE` the book is that text (a plain-text file, as `tts-appliance submit` takes it):
its segments are the project's segmenter's (jobs.segment, the submit's settings), their lengths in characters
and expected seconds reported (`workload`); on random weights each still runs --frames frames (--fixed-length;
`--frames auto`: their mean expected length), so a segment's cache positions are its prompt (its text's tokens
and the voice's prefix) plus --frames.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import time
from pathlib import Path

from benchmarks.load.book import TERMINAL, BookLoad
from benchmarks.load.client import http_request
from benchmarks.load.harness import add_daemon_args, base_result, check_alive, check_daemon_args, pick_voices, run_cli, served

log = logging.getLogger(__name__)
FRAME_S = 0.08


async def measure(args, res: dict) -> None:
    async with served(args, res, args.frames + 1) as srv:
        target = srv.target
        voices = await pick_voices(args, target)
        spec = {"voice": voices[0], "language": args.language or "english", "format": args.format, "seed": 7}
        if args.fixed_length:
            spec["sampling"] = {"max_new_tokens": args.frames + 1}
        db = srv.daemon.home / "queue.db" if srv.daemon is not None else None
        book = BookLoad(target, args.segments, spec, db, text=args.book_text)
        t0 = time.perf_counter()
        job = await book.submit_next()
        log.info("book job %s: %s segments", job["id"], job["total"])
        first, progress = None, []
        while True:
            await asyncio.sleep(args.poll)
            check_alive(srv.daemon, args.daemon_log)
            s = await book.sample(keep_running=False)
            if first is None and s["done"]:
                first = s["t"] - t0
            progress.append((s["t"], s["done"]))
            if s["state"] in TERMINAL:
                break
            if time.perf_counter() - t0 > args.timeout:
                await book.cancel()
                raise TimeoutError(f"the book did not finish within {args.timeout:.0f} s ({s['done']} segments done)")
        wall = time.perf_counter() - t0
        job = book.current
        last = next((t - t0 for t, d in progress if d >= (job["total"] or 0) > 0), None)  # every segment stored
        audio = (job["total"] * args.frames * FRAME_S) if args.fixed_length else s["audio_s"]
        _, _, health = await http_request(target, "GET", "/health", timeout=30.0)
        level = {"state": job["state"], "segments": job["total"], "segments_done": job["done"],
                 "frames_per_segment": args.frames if args.fixed_length else None, "audio_s": audio,
                 "wall_s": round(wall, 2), "first_segment_s": None if first is None else round(first, 2),
                 "last_segment_s": None if last is None else round(last, 2),
                 "progress": [[round(t - t0, 2), d] for t, d in progress],
                 "audio_s_per_s": None if not audio else round(audio / wall, 1),
                 "steady_audio_s_per_s": steady(progress, job["total"], args.frames) if args.fixed_length else None,
                 "engines": [{k: e.get(k) for k in ("device", "max_slots", "dtype", "slots_reason", "frames", "steps",
                                              "loop_s")}
                             for e in health.get("engine", {}).get("engines", [])] if isinstance(health, dict) else None}
        if job["state"] != "done":
            res["error"] = f"the book ended {job['state']} ({job['done']}/{job['total']} segments)"
        res["levels"].append(level)
        res["workload"] = {"segments": args.segments, "frames": args.frames, "format": args.format,
                           "text": args.text or "generated (benchmarks.load.text.book_text)"} | args.text_stats


def text_workload(path: str) -> tuple[str, dict]:
    """(the text of `path`, its segments as the daemon's submit makes them: count, characters and expected
    seconds (engines.model.text), and the frames of their mean expected length)."""
    import statistics

    from engines.model.text import expected_seconds
    from jobs.ingest import load_document
    from jobs.settings import JobSpec
    from jobs.submit import document_chapters

    chapters = document_chapters(load_document(path), JobSpec(language="english"), select=False)
    segs = [s.text for _, ss in chapters for s in ss]
    chars, secs = [len(t) for t in segs], [expected_seconds(t) for t in segs]
    stats = {"segments": len(segs), "chapters": len(chapters),
             "segment_chars": {"min": min(chars), "median": statistics.median(chars), "max": max(chars)},
             "segment_expected_s": {"min": round(min(secs), 1), "median": round(statistics.median(secs), 1),
                                    "mean": round(statistics.mean(secs), 2), "max": round(max(secs), 1),
                                    "total": round(sum(secs), 1)},
             "mean_frames": max(1, round(statistics.mean(secs) / FRAME_S))}
    return open(path, encoding="utf-8").read(), stats


def distinct_copies(text: str, copies: int) -> str:
    """`copies` copies of `text`, the k-th (from 1) with the number k written after every 8th word of each
    paragraph (a heading, a line that starts "Chapter", kept): the same sentences and punctuation, a little
    longer, and (but for a few short ones) no segment of one copy is a segment of another, so the daemon's
    audio cache (a segment's audio reused for the same text, voice and seed) serves almost none of them."""
    out = []
    for k in range(copies):
        for para in text.split("\n\n"):
            words = para.split()
            if k and words and not para.lstrip().startswith("Chapter"):
                para = " ".join(w + (f" {k}" if i % 8 == 7 or i == len(words) - 2 else "") for i, w in enumerate(words))
            out.append(para)
    return "\n\n".join(out) + "\n"


def steady(progress: list, total: int, frames: int, lo: float = 0.2, hi: float = 0.8):
    """Audio seconds per second while the book runs at full pace: the segments finished between `lo` and `hi`
    of the book over the time between (start-up of the job and its last, thinning rows left out)."""
    a = next(((t, d) for t, d in progress if d >= lo * total), None)
    b = next(((t, d) for t, d in progress if d >= hi * total), None)
    if a is None or b is None or b[0] <= a[0]:
        return None
    return round((b[1] - a[1]) * frames * FRAME_S / (b[0] - a[0]), 1)


def _workload_lines(w: dict) -> list:
    """The book's text and segments, where it came from a file (`--text`)."""
    if "segment_chars" not in w:
        return []
    c, e = w["segment_chars"], w["segment_expected_s"]
    return [f"book: {w['text']}, {w['segments']} segments in {w['chapters']} chapters as the segmenter makes them "
            f"(characters min / median / max {c['min']} / {c['median']} / {c['max']}; expected seconds "
            f"{e['min']} / {e['median']} / {e['max']}, mean {e['mean']}, total {e['total']}), each run to "
            f"{w['frames']} frames ({w['frames'] * FRAME_S:.2f} s)", ""]


def markdown(res: dict) -> str:
    lines = [f"# Book through the daemon: {res.get('model')} on {res.get('device')}", "",
             f"`{res.get('command')}`", "", f"start-up (apart): {res.get('daemon_start_s')} s", "",
             *_workload_lines(res.get("workload") or {}),
             "| state | segments | audio s | wall s | first segment s | audio-s/s | steady audio-s/s (20-80%) |",
             "|---|---|---|---|---|---|---|"]
    for lv in res["levels"]:
        lines.append(f"| {lv['state']} | {lv['segments']} | {lv['audio_s']} | {lv['wall_s']} | {lv['first_segment_s']} "
                     f"| {lv['audio_s_per_s']} | {lv.get('steady_audio_s_per_s')} |")
    if res.get("error"):
        lines += ["", f"error: {res['error']}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.daemon_book", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_daemon_args(ap, "python -m benchmarks.daemon_book")
    ap.add_argument("--segments", type=int, default=680, help="segments in the book (about)")
    ap.add_argument("--frames", default="150", help="frames per segment (fixed length); auto (with --text): the "
                                                    "segments' mean expected length")
    ap.add_argument("--text", help="the book: this text file, segmented as a submit does (default: a generated "
                                   "book of about --segments segments)")
    ap.add_argument("--copies", type=int, default=1, help="with --text: the book is this many copies of the text, "
                                                         "made distinct (distinct_copies: no segment repeats)")
    ap.add_argument("--format", default="flac", help="the book's format (job setting)")
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between progress polls")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds the book may take")
    args = ap.parse_args(argv)
    check_daemon_args(ap, args)
    args.book_text, args.text_stats = None, {}
    if args.text and args.copies > 1:
        import tempfile

        tmp = Path(tempfile.mkdtemp(prefix="daemon-book-")) / f"{Path(args.text).stem}_x{args.copies}.txt"
        tmp.write_text(distinct_copies(Path(args.text).read_text(encoding="utf-8"), args.copies), encoding="utf-8")
        args.text = str(tmp)
    if args.text:
        args.book_text, args.text_stats = text_workload(args.text)
        args.segments = args.text_stats["segments"]
    if args.frames == "auto":
        if not args.text:
            ap.error("--frames auto needs --text")
        args.frames = args.text_stats["mean_frames"]
    args.frames = int(args.frames)
    res = base_result(args, argv if argv is not None else __import__("sys").argv[1:],
                      "a book through the daemon: upload to finished book", "python -m benchmarks.daemon_book")
    return run_cli(args, res, measure, markdown, "daemon_book")


if __name__ == "__main__":
    raise SystemExit(main())
