"""Offline throughput of a whole book job: queue -> segments -> engine -> chapter files + book file.

    python -m benchmarks.book_job --dummy 0.6b --chapters 20 --paragraphs 16 --format flac   # 320 segments
    python -m benchmarks.book_job --dummy 0.6b --devices cuda:0 --devices cuda:0,cuda:1      # 1 vs 2 GPUs

Random weights of the real shape (no checkpoint), so every segment is given a fixed length
(`--frames`, EOS masked) instead of stopping where speech would. Reports audio seconds per wall
second from submit to the finished book, codec and file writing included.

`--devices LIST` (repeatable) runs the book on one engine per device of LIST, fed by one jobs worker
through the daemon's EnginePool (as `model.device: cuda:0,cuda:1` does), once per LIST in the same
process; engines are kept between runs (cuda:0 is loaded once for both runs above). Reports each
run's audio-s/s and its ratio to the first run's (`scaling`).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path

from appliance.engine_pool import EnginePool
from appliance.settings import WorkerSettings
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


def run_book(engines: EnginePool, slots: int, args) -> dict:
    """Submit a generated book and work it through the real jobs path on `engines` (one or more runners);
    its figures (steady state)."""
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
        # one worker keeps every slot of every engine busy: it tops up as segments finish (jobs.worker, pipelined)
        in_flight = args.in_flight or WorkerSettings().batch_for(slots)  # the daemon's choice unless given
        worker = Worker(Queue(paths.db), engines, paths, batch_size=in_flight, guard=GuardSettings(enabled=False))
        before = [r.stats() for r in engines.runners]
        prof = profile_window(args.profile, args.json) if args.profile else None
        while queue.job(job_id)["state"] not in ("done", "failed", "partial"):
            if not worker.run_once():
                time.sleep(0.01)
        wall = time.perf_counter() - t0
        worker.close()
        manifest = json.loads((paths.output / job_id / "manifest.json").read_text())
        segs = [s for ch in manifest["chapters"] for s in ch["segments"]]
        audio = max(ch["book_end_s"] for ch in manifest["chapters"])
        last_segment = max(s["updated_at"] for s in queue.segments(job_id)) - t0_wall
        if prof is not None:
            prof.join()
        per = [{"device": str(r.device), "slots": r.cfg.max_slots, "decode_steps": r.stats()["steps"] - b["steps"],
                "frames": r.stats()["frames"] - b["frames"],
                "loop_s": {k: round(v - b["loop_s"][k], 3) for k, v in r.stats()["loop_s"].items()}}
               for r, b in zip(engines.runners, before)]
        synthesized = sum(e["frames"] for e in per)
        if synthesized < len(segs) * args.frames:  # a figure from cached audio would not be the engine's
            raise SystemExit(f"only {synthesized} of {len(segs) * args.frames} frames were synthesized: "
                             "segments came from the audio cache; the book must have distinct paragraphs")
        steps = sum(e["decode_steps"] for e in per)
        return {"segments": len(segs), "frames_synthesized": synthesized, "in_flight": in_flight,
                "rows_per_step": round(synthesized / max(steps, 1), 1), "chapters": len(manifest["chapters"]),
                "book_audio_s": audio,
                "submit_s": t_submitted - t0, "wall_s": wall, "audio_s_per_s": audio / wall,
                "last_segment_s": last_segment, "assembly_tail_s": wall - last_segment,
                "state": queue.job(job_id)["state"], "decode_steps": sum(e["decode_steps"] for e in per),
                "engines": per, "engine": engines.stats()}


def profile_window(spec: str, json_path) -> threading.Thread:
    """Profile every thread's torch ops and the device's kernels for a window of the run ("START,SECONDS" after
    the submit); the table (by device time) goes to the log and next to the JSON as .profile.txt."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    start, seconds = (float(x) for x in spec.split(","))

    def run():
        time.sleep(start)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        with profile(activities=acts) as prof:
            time.sleep(seconds)
        events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
        busy = sum(e.self_device_time_total for e in events) / 1e6
        table = prof.key_averages().table(sort_by="self_cuda_time_total" if events else "self_cpu_time_total",
                                          row_limit=40, max_name_column_width=80)
        text = f"window {seconds} s from {start} s: device kernel time {busy:.3f} s ({busy / seconds:.0%})\n{table}"
        logging.info("profile: %s", text)
        if json_path:
            Path(json_path).with_suffix(".profile.txt").write_text(text)

    t = threading.Thread(target=run, name="profile-window", daemon=True)
    t.start()
    return t


def make_runner(device: str, args) -> tuple[EngineRunner, dict]:
    """One started engine on `device` (auto slots unless --slots) and its start-up figures."""
    t_load = time.perf_counter()
    if args.model:
        from engines.engine import TTSEngine

        eng = TTSEngine.load(args.model, device=device, dtype=args.dtype)
    else:
        eng = dummy_engine(args.dummy, device, args.dtype)
    ctx = 256 * ((args.frames + 150) // 256 + 1)
    slots = args.slots
    if not slots:
        from engines.runtime.memory import plan_for_engine

        plan = plan_for_engine(eng, ctx)
        logging.info("auto slots on %s: %s", device, plan.describe())
        slots = plan.slots
    runner = EngineRunner(eng, max_slots=slots, max_context=ctx, max_queue=4096, codec_backend=args.codec,
                          fuse=args.fuse, linear=args.linear)
    t_prep = time.perf_counter()
    prep = runner.prepare()  # start-up (compile, capture) apart from the book's time
    runner.start()
    return runner, {"device": device, "slots": slots, "max_context": ctx, "load_s": t_prep - t_load,
                    "startup_s": time.perf_counter() - t_prep, "prepare": prep}


def run_name(r: dict, args) -> str:
    """A run's name: its devices and the settings that vary between the runs."""
    name = f"{r['devices']} codec_streams_{r['codec_streams']}"
    if "," in args.codec_fast:
        name += f" codec_fast_{r['codec_fast']}"
    if args.gil_switch_ms:
        name += f" gil_{r['gil_switch_ms']:g}ms"
    return name


def set_codec_fast(runner: EngineRunner, on: bool) -> None:
    """Switch the eager torch codec of every lane to the fused stack (on) or the reference one; codec graphs
    captured for the other setting are dropped and captured again (start-up, not timed)."""
    changed = False
    for lane in runner.lanes.values():
        stream = getattr(lane.codec, "stream", None)
        if stream is None or getattr(lane.codec, "compiled", False) or stream.fast == on:
            continue
        stream.fast, changed = on, True
        lane.graphs.clear()
    if changed:
        runner.prepare()


def device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else device


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dummy", choices=["0.6b", "1.7b"], default="0.6b")
    ap.add_argument("--model", help="a checkpoint folder instead of random weights (e.g. the tiny test model)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--devices", action="append", help="comma list of devices, one engine each (e.g. "
                    "cuda:0,cuda:1; cpu,cpu); repeat to compare (e.g. --devices cuda:0 --devices cuda:0,cuda:1)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--chapters", type=int, default=20)
    ap.add_argument("--paragraphs", type=int, default=16)
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument("--slots", type=int, default=0, help="engine slots, each engine (0: auto, what fits in free memory)")
    ap.add_argument("--codec", default="torch", help="codec backend: torch, torch-compiled, built, auto")
    ap.add_argument("--fuse", default="layer", help="decode-step regions: layer or pass")
    ap.add_argument("--linear", default="auto", help="runtime.linear: auto, model or int8 (CPU)")
    ap.add_argument("--in-flight", type=int, default=0, help="segments the worker keeps in flight (0: the daemon's "
                    "choice for these slots, appliance.settings.WorkerSettings.batch_for)")
    ap.add_argument("--format", default="flac")
    ap.add_argument("--codec-streams", default="on", help="codec lanes on their own CUDA streams: on, off, or "
                    "on,off (A/B: the book runs once per setting, same process)")
    ap.add_argument("--codec-fast", default="on", help="eager torch codec with the fused channels-last stack: on, "
                    "off, or on,off (A/B in one process; the codec graphs are captured again for each)")
    ap.add_argument("--gil-switch-ms", help="the GIL switch interval for each run, e.g. 0.5,5 (A/B; default: Python's, "
                    "5 ms)")
    ap.add_argument("--profile", help="START,SECONDS: profile that window of each run (torch profiler, CPU and device)")
    ap.add_argument("--json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    sets = [[d.strip() for d in x.split(",") if d.strip()] for x in (args.devices or [args.device])]
    made: dict = {}  # (device, n-th engine on it) -> (runner, start-up figures): kept between runs
    res = {"model": args.model or f"dummy-{args.dummy}", "dtype": args.dtype, "codec": args.codec, "linear": args.linear,
           "fuse": args.fuse, "format": args.format}
    variants = [(f, v, g) for f in args.codec_fast.split(",") for v in args.codec_streams.split(",")
                for g in (args.gil_switch_ms.split(",") if args.gil_switch_ms else [None])]
    runs = []
    for devices in sets:
        keys = [(d, devices[:i].count(d)) for i, d in enumerate(devices)]
        for k in keys:
            if k not in made:
                made[k] = make_runner(k[0], args)
        pool = EnginePool([made[k][0] for k in keys])
        slots = sum(r.cfg.max_slots for r in pool.runners)
        for f, v, g in variants:
            if g is not None:
                sys.setswitchinterval(float(g) / 1e3)
            for r in pool.runners:
                set_codec_fast(r, f == "on")
                for lane in r.lanes.values():
                    lane.use_stream(v == "on")
            out = run_book(pool, slots, args)
            out.update(devices=",".join(devices), device=", ".join(device_name(d) for d in devices), slots=slots,
                       codec_streams=v, codec_fast=f, gil_switch_ms=sys.getswitchinterval() * 1e3,
                       startup=[made[k][1] for k in keys])
            runs.append(out)
            logging.info("book on %s (codec fast %s, codec streams %s, GIL switch %.2f ms): %.1f audio-s/s",
                         out["devices"], f, v, out["gil_switch_ms"], out["audio_s_per_s"])
    for runner, _ in made.values():
        runner.stop()
    if len(runs) == 1:  # one run: its figures at the top level, as before
        first = runs[0]["startup"][0]
        res.update(runs[0], max_context=first["max_context"], load_s=first["load_s"], startup_s=first["startup_s"],
                   prepare=first["prepare"])
    else:
        res["runs"] = runs
        base = runs[0]["audio_s_per_s"]
        res["scaling"] = {run_name(r, args): round(r["audio_s_per_s"] / base, 3) for r in runs}
        for r in runs:
            logging.info("%s (codec fast %s, codec streams %s, GIL switch %.2f ms): %.1f audio-s/s, x%.2f of the "
                         "first run", r["devices"], r["codec_fast"], r["codec_streams"], r["gil_switch_ms"],
                         r["audio_s_per_s"], r["audio_s_per_s"] / base)
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
