"""The load benchmark's markdown report, and keeping temp-folder paths out of its JSON."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]


def redact(obj, workdir: Optional[Path], model: Optional[str]):
    """`obj` with the benchmark's temp folder written as $WORKDIR and a --model folder as its name."""
    subs = []
    if workdir:
        subs.append((str(workdir), "$WORKDIR"))
    if model:
        p = Path(model).expanduser().resolve()
        subs.append((str(p), f"$MODEL({p.name})"))
    if isinstance(obj, dict):
        return {k: redact(v, workdir, model) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v, workdir, model) for v in obj]
    if isinstance(obj, str):
        for old, new in subs:
            obj = obj.replace(old, new)
    return obj


def describe_device(device: Optional[str]) -> str:
    if not device:
        return "unknown (external daemon; give --device to note it)"
    if device.startswith("cuda"):
        index = device.partition(":")[2] or "0"
        try:
            p = subprocess.run(["nvidia-smi", "-i", index, "--query-gpu=name,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)
            if p.returncode == 0 and p.stdout.strip():
                return f"{p.stdout.strip().splitlines()[0]} ({device})"
        except (OSError, subprocess.TimeoutExpired):
            pass
        return f"{device} (nvidia-smi gave no name)"
    if device == "cpu":
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} CPUs)"
        except OSError:
            pass
    return device


def git_commit() -> Optional[str]:
    try:
        p = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                           timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return p.stdout.strip() + ("+dirty" if dirty else "") if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def fmt(x, unit: str = "", nd: int = 1) -> str:
    """A figure for a table cell: `nd` decimals, '-' for None."""
    return "-" if x is None else f"{x:.{nd}f}{unit}"


def stopped_note(res: dict) -> list[str]:
    """The markdown note for a run that stopped early (res['error']), or none."""
    if not res.get("error"):
        return []
    first = " ".join(line.strip() for line in res["error"].splitlines()[:2])
    return [f"**run stopped early: {first}** (the JSON has the whole message)"]


def _rate(x: float) -> str:
    return f"{x:g}"


def markdown(res: dict) -> str:
    w = res["workload"]
    lines = [f"### Open-loop streaming load: {res['model']}, {res['dtype']}, {res['device']}", "",
             f"`{res['command']}`", "",
             f"{w['frames']} frames ({w['audio_s_per_request']:.2f} s of audio) per request, {w['arrivals']} arrivals; "
             f"per rate {w['warmup_s']:g} s warm-up, then requests sent in a {w['window_s']:g} s window are measured; "
             f"{res.get('slots', '?')} slots; pcm over {res.get('transport', '?')}; daemon "
             f"{res.get('daemon', '?')}. TTFA = request written -> first non-silent sample read; E2E = request "
             "written -> end of response; underrun = a real-time player starting at the first audio without a "
             "buffer runs dry before the end.", ""]
    book = bool(res.get("book"))
    head = ("| rate req/s (achieved) | measured | completed | TTFA p50 / p95 / p99 / max ms | E2E p50 / p95 s "
            "| underruns | peak in flight | errors |")
    if book:
        head += " book seg/s (audio-s/s) |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    notes = []
    for x in res["levels"]:
        t, e = x["ttfa_ms"], x["e2e_s"]
        errors = ", ".join(f"{k}: {v}" for k, v in x["errors"].items())
        if x["incomplete"]:
            errors = (errors + ", " if errors else "") + f"incomplete: {x['incomplete']}"
        share = "-" if x["completed_share"] is None else f"{100 * x['completed_share']:.1f}%"
        under = "-" if x["underrun_share"] is None else f"{x['underruns']} ({100 * x['underrun_share']:.1f}%)"
        row = (f"| {_rate(x['rate'])} ({fmt(x['achieved_rate'], nd=2)}) | {x['measured']} | {share} "
               f"| {fmt(t['p50'])} / {fmt(t['p95'])} / {fmt(t['p99'])} / {fmt(t['max'])} "
               f"| {fmt(e['p50'], nd=2)} / {fmt(e['p95'], nd=2)} | {under} | {x['peak_in_flight']} | {errors or '-'} |")
        if book:
            b = x.get("book") or {}
            row += f" {fmt(b.get('segments_per_s'), nd=2)} ({fmt(b.get('audio_s_per_s'))}) |"
        lines.append(row)
        r = _rate(x["rate"])
        if x["length_mismatches"]:
            notes.append(f"rate {r}: {x['length_mismatches']} responses of another length than "
                         f"{w['expect_samples']} samples (lengths: {x['lengths_samples']})")
        if x["silent"]:
            notes.append(f"rate {r}: {x['silent']} completed responses had no sample above the silence threshold")
        lag = x["client_loop_lag_ms"]["p99"]
        if lag is not None and lag > 5.0:
            notes.append(f"rate {r}: the client's event loop woke {lag:.1f} ms late at p99: the client may have "
                         "added to the figures")
        eng = x.get("engine") or {}
        if eng.get("graphs_captured_in_window"):
            notes.append(f"rate {r}: the engine captured {eng['graphs_captured_in_window']} new graphs during the "
                         "window (first use of a batch size): their capture time is in the figures")
        if eng.get("engine_ttfa_mean_ms"):
            notes.append(f"rate {r}: the engine's share of TTFA, mean ms per stream: " +
                         ", ".join(f"{k} {v}" for k, v in eng["engine_ttfa_mean_ms"].items() if k != "n"))
        b = x.get("book") or {}
        if book and b.get("state_at_end") not in (None, "running", "queued"):
            notes.append(f"rate {r}: the book job was '{b['state_at_end']}' at the window's end")
    if not res["fixed_length"]:
        notes.append("lengths are not fixed (a real checkpoint stops where its speech ends): see lengths_samples "
                     "in the JSON")
    if res.get("prime"):
        p = res["prime"]
        notes.append(f"primed with {p['requests']} requests ramped to the slot count in {p['wall_s']} s"
                     + (f" (errors: {p['errors']})" if p["errors"] else ""))
    if book:
        b = res["book"]
        frames = f", {b['frames_per_segment']} frames each" if b.get("frames_per_segment") else ""
        notes.append(f"book: {b.get('segments')} segments per book{frames}, resubmitted when finished "
                     f"({b.get('books_submitted', 1)} submitted); audio-s/s from "
                     f"{next((x['book'].get('audio_source') for x in res['levels'] if x.get('book')), None) or 'nowhere (unknown)'}")
    notes += stopped_note(res)
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"
