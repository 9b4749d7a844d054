"""Offline throughput of a whole book job: queue -> segments -> engine -> chapter files + book file.

    python -m benchmarks.book_job --dummy 0.6b --chapters 6 --paragraphs 12 --format flac

Random weights of the real shape (no checkpoint), so every segment is given a fixed length
(`--frames`, EOS masked) instead of stopping where speech would. Reports audio seconds per wall
second from submit to the finished book, codec and file writing included.
"""
from __future__ import annotations

import argparse
import json
import logging
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.dummy_engine import dummy_engine
from engines.runtime.runner import EngineRunner
from jobs.queue import Queue
from jobs.guard import GuardSettings
from jobs.submit import submit_file
from jobs.worker import Worker
from jobs.settings import JobSpec, Paths

SENTENCES = ["The morning light fell across the valley and the river shone like a ribbon of glass.",
             "She counted the steps to the old mill, forty-two of them, worn smooth by a century of boots.",
             "Nobody in the village remembered who had planted the row of chestnut trees along the road.",
             "When the bell rang at noon, the market emptied and the square belonged to the pigeons again."]


class RunnerSynthesizer:
    """`synthesize(list)` for the jobs runner, served by the continuous-batching EngineRunner."""

    def __init__(self, engine, runner: EngineRunner):
        self.runner, self.sample_rate, self.model_id = runner, engine.sample_rate, engine.model_id
        self.voices, self.languages = engine.voices, engine.languages

    def synthesize(self, requests):
        return self.runner.synthesize(requests, priority=1)


def write_book(path: Path, chapters: int, paragraphs: int) -> None:
    parts = []
    for c in range(chapters):
        parts.append(f"Chapter {c + 1}\n")
        for p in range(paragraphs):
            parts.append(" ".join(SENTENCES[(p + i) % len(SENTENCES)] for i in range(2)) + "\n")
    path.write_text("\n".join(parts), encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dummy", choices=["0.6b", "1.7b"], default="0.6b")
    ap.add_argument("--model", help="a checkpoint folder instead of random weights (e.g. the tiny test model)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--chapters", type=int, default=6)
    ap.add_argument("--paragraphs", type=int, default=12)
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument("--batch", type=int, default=128, help="segments claimed per engine call")
    ap.add_argument("--workers", type=int, default=1, help="jobs worker threads feeding the one engine")
    ap.add_argument("--format", default="flac")
    ap.add_argument("--json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    if args.model:
        from engines.api import TTSEngine

        eng = TTSEngine.load(args.model, device=args.device, dtype="float32")
    else:
        eng = dummy_engine(args.dummy, args.device, "bfloat16")
    runner = EngineRunner(eng, max_slots=args.batch, max_context=512, max_queue=4096)
    runner.synthesize([])  # nothing: graphs are captured on first use
    runner.start()
    synth = RunnerSynthesizer(eng, runner)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        book = home / "book.txt"
        write_book(book, args.chapters, args.paragraphs)
        paths = Paths(home).ensure()
        queue = Queue(paths.db)
        spec = JobSpec(voice="vivian", language="english", format=args.format, title="Benchmark book",
                       sampling={"max_new_tokens": args.frames + 1, "min_new_tokens": args.frames + 1})
        t0 = time.perf_counter()
        job_id, _ = submit_file(queue, paths, book, spec)
        def finished() -> bool:
            return Queue(paths.db).job(job_id)["state"] in ("done", "failed", "partial")

        def work() -> None:  # each worker claims a batch and waits for it: two keep the engine fed
            worker = Worker(Queue(paths.db), synth, paths, batch_size=args.batch,
                            guard=GuardSettings(enabled=False), model=None)
            while not finished():
                if not worker.run_once():
                    time.sleep(0.05)
            worker.close()

        threads = [threading.Thread(target=work) for _ in range(args.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        runner.stop()
        manifest = json.loads((paths.output / job_id / "manifest.json").read_text())
        segs = [s for ch in manifest["chapters"] for s in ch["segments"]]
        audio = max(ch["book_end_s"] for ch in manifest["chapters"])
        import torch

        res = {"device": torch.cuda.get_device_name() if eng.device.type == "cuda" else "cpu",
               "model": args.model or f"dummy-{args.dummy}",
               "segments": len(segs), "chapters": len(manifest["chapters"]), "book_audio_s": audio,
               "wall_s": wall, "audio_s_per_s": audio / wall, "format": args.format, "batch": args.batch, "workers": args.workers,
               "state": queue.job(job_id)["state"]}
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
