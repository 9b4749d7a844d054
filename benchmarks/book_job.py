"""Offline throughput of a whole book job: queue -> segments -> engine -> chapter files + book file.

    python -m benchmarks.book_job --dummy 0.6b --chapters 20 --paragraphs 16 --format flac   # 320 segments

Random weights of the real shape (no checkpoint), so every segment is given a fixed length
(`--frames`, EOS masked) instead of stopping where speech would. Reports audio seconds per wall
second from submit to the finished book, codec and file writing included.
"""
from __future__ import annotations

import argparse
import json
import logging
import tempfile
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


def write_book(path: Path, chapters: int, paragraphs: int) -> None:
    """Every paragraph distinct (its own number in words), so no segment is served from the audio cache."""
    parts = []
    for c in range(chapters):
        parts.append(f"Chapter {c + 1}\n")
        for p in range(paragraphs):
            lead = f"Part {p + 1} of chapter {c + 1}."
            parts.append(" ".join([lead] + [SENTENCES[(p + i) % len(SENTENCES)] for i in range(2)]) + "\n")
    path.write_text("\n".join(parts), encoding="utf-8")


def run_book(runner: EngineRunner, slots: int, args) -> dict:
    """Submit a generated book and work it through the real jobs path; its figures (steady state)."""
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        book = home / "book.txt"
        write_book(book, args.chapters, args.paragraphs)
        paths = Paths(home).ensure()
        queue = Queue(paths.db)
        spec = JobSpec(voice="vivian", language="english", format=args.format, title="Benchmark book",
                       sampling={"max_new_tokens": args.frames + 1, "min_new_tokens": args.frames + 1})
        t0, t0_wall = time.perf_counter(), time.time()
        job_id, error = submit_file(queue, paths, book, spec)
        if error:
            raise SystemExit(f"submit failed: {error}")
        t_submitted = time.perf_counter()
        # one worker keeps every slot busy: it tops up as segments finish (jobs.worker, pipelined)
        worker = Worker(Queue(paths.db), runner, paths, batch_size=slots, guard=GuardSettings(enabled=False))
        steps0, frames0 = runner.steps, runner.frames
        while queue.job(job_id)["state"] not in ("done", "failed", "partial"):
            if not worker.run_once():
                time.sleep(0.01)
        wall = time.perf_counter() - t0
        worker.close()
        manifest = json.loads((paths.output / job_id / "manifest.json").read_text())
        segs = [s for ch in manifest["chapters"] for s in ch["segments"]]
        audio = max(ch["book_end_s"] for ch in manifest["chapters"])
        last_segment = max(s["updated_at"] for s in queue.segments(job_id)) - t0_wall
        synthesized = runner.frames - frames0
        if synthesized < len(segs) * args.frames:  # a figure from cached audio would not be the engine's
            raise SystemExit(f"only {synthesized} of {len(segs) * args.frames} frames were synthesized: "
                             "segments came from the audio cache; the book must have distinct paragraphs")
        return {"segments": len(segs), "frames_synthesized": synthesized, "chapters": len(manifest["chapters"]), "book_audio_s": audio,
                "submit_s": t_submitted - t0, "wall_s": wall, "audio_s_per_s": audio / wall,
                "last_segment_s": last_segment, "assembly_tail_s": wall - last_segment,
                "state": queue.job(job_id)["state"], "decode_steps": runner.steps - steps0,
                "engine": runner.stats()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dummy", choices=["0.6b", "1.7b"], default="0.6b")
    ap.add_argument("--model", help="a checkpoint folder instead of random weights (e.g. the tiny test model)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--chapters", type=int, default=20)
    ap.add_argument("--paragraphs", type=int, default=16)
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument("--slots", type=int, default=0, help="engine slots (0: auto, what fits in free memory)")
    ap.add_argument("--codec", default="torch", help="codec backend: torch, torch-compiled, built, auto")
    ap.add_argument("--fuse", default="layer", help="decode-step regions: layer or pass")
    ap.add_argument("--format", default="flac")
    ap.add_argument("--codec-streams", default="on", help="codec lanes on their own CUDA streams: on, off, or "
                    "on,off (A/B: the book runs once per setting, same process)")
    ap.add_argument("--json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    import torch

    t_load = time.perf_counter()
    if args.model:
        from engines.api import TTSEngine

        eng = TTSEngine.load(args.model, device=args.device, dtype=args.dtype)
    else:
        eng = dummy_engine(args.dummy, args.device, args.dtype)
    ctx = 256 * ((args.frames + 150) // 256 + 1)
    slots = args.slots
    if not slots:
        from engines.runtime.memory import plan_for_engine

        plan = plan_for_engine(eng, ctx)
        logging.info("auto slots: %s", plan.describe())
        slots = plan.slots
    runner = EngineRunner(eng, max_slots=slots, max_context=ctx, max_queue=4096, codec_backend=args.codec,
                          fuse=args.fuse)
    t_prep = time.perf_counter()
    prep = runner.prepare()  # start-up (compile, capture) apart from the book's time
    startup = time.perf_counter() - t_prep
    runner.start()
    res = {"device": torch.cuda.get_device_name() if eng.device.type == "cuda" else "cpu",
           "model": args.model or f"dummy-{args.dummy}", "dtype": args.dtype, "codec": args.codec,
           "fuse": args.fuse, "slots": slots, "max_context": ctx, "load_s": t_prep - t_load,
           "startup_s": startup, "prepare": prep, "format": args.format}
    variants = args.codec_streams.split(",")
    for v in variants:
        for lane in runner.lanes.values():
            lane.use_stream(v == "on")
        out = run_book(runner, slots, args)
        key = f"codec_streams_{v}"
        key += f"_{sum(k.startswith(key) for k in res) + 1}" if key in res else ""
        res.update(out if len(variants) == 1 else {key: out})
        logging.info("book (codec streams %s): %.1f audio-s/s", v, out["audio_s_per_s"])
    runner.stop()
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
