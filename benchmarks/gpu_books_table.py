"""The short table of benchmarks/device_gpu_books.sh: what each part of the call answered, from its logs.

    python -m benchmarks.gpu_books_table LOGS_FOLDER
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def tests(folder: Path) -> list[str]:
    out = []
    for log in sorted(folder.glob("gpu_*tests.log")):
        text = log.read_text(errors="replace")
        summary = [ln.strip("= ") for ln in text.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
        failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)))
        out += [f"## GPU parity, {log.stem} (pytest -m gpu)",
                summary[-1] if summary else f"no summary (the part was cut: see {log.name})"]
        out += [f"- failed: {name}" for name in failed]
    return out


def asm(folder: Path) -> list[str]:
    log = folder / "kernel_asm.log"
    rows = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("|")] if log.exists() else []
    if not rows:
        return []
    return ["## What this image's Triton makes of each kernel (benchmarks.kernel_asm: per thread registers, local "
            "bytes; per program shared bytes; PTX instruction counts)"] + rows


def kernels(folder: Path) -> list[str]:
    data = _json(folder / "attention_bench.json")
    if not data:
        return []
    out = [f"## Talker attention alone ({data['device']}; rows at {data['context']}-{data['context'] + 49} of "
           f"{data['slots']}-position rows; us per call (TB/s of keys/values read); default launch: "
           "attention_split.launch_for)",
           "| rows | cache | one program | split, default launch (best count) | split, best of all (count, "
           "BLOCK_S/warps/stages) | err |",
           "|---|---|---|---|---|---|"]
    for rows, res in data["rows"].items():
        for cache in dict.fromkeys(r["cache"] for r in res):
            mine = [r for r in res if r["cache"] == cache and "us" in r]
            one = next((r for r in mine if r["kernel"] == "one"), None)
            splits = [r for r in mine if r["kernel"] == "split"]
            if not splits:
                continue
            best = min(splits, key=lambda r: r["us"])
            default = [r for r in splits if "BLOCK_S" not in r]
            plain = min(default, key=lambda r: r["us"]) if default else best
            fmt = lambda r: f"{r['us']:.1f} ({r['tb_s']:.2f})"  # noqa: E731
            launch = "/".join(str(best.get(k, "-")) for k in ("BLOCK_S", "num_warps", "num_stages"))
            err = max(r["err"] for r in mine)
            out.append(f"| {rows} | {cache} | {fmt(one) if one else '-'} | {fmt(plain)} (x{plain['splits']}) | "
                       f"{fmt(best)} (x{best['splits']}, {launch}) | {err:.1e} |")
    return out


def ab(folder: Path) -> list[str]:
    data = _json(folder / "ab_step.json")
    if not data:
        return []
    base = {r["batch"]: r["step_ms"] for r in data["rows"] if r["variant"] == data["rows"][0]["variant"]}
    out = [f"## Decode step ({data['model']}, {data['device']}, contexts {data['context']}-{data['context'] + 49}; "
           "graph replay, median)", "| variant | rows | step ms | vs first | decode-only audio-s/s |",
           "|---|---|---|---|---|"]
    for r in data["rows"]:
        ratio = base.get(r["batch"], r["step_ms"]) / r["step_ms"]
        out.append(f"| {r['variant']} | {r['batch']} | {r['step_ms']:.2f} | x{ratio:.2f} | "
                   f"{r['audio_s_per_s_decode_only']:.0f} |")
    probes = [r["probe"] for r in data["rows"] if "probe" in r]
    good = [p for p in probes if "one" in p]
    if good:
        from benchmarks.attention_probe import table

        out += ["", "Talker attention per launch in us, on the engine's own cache (benchmarks.attention_probe):",
                table(good)]
    for p in probes:
        for e in p.get("errors", []) + ([p["error"]] if "error" in p else []):
            out.append(f"- probe {p.get('variant')}: {e}")
    return out


def books(folder: Path) -> list[str]:
    files = sorted(folder.glob("book_*.json"))
    if not files:
        return []
    out = ["## Books through the shipped daemon (one GPU)",
           "| configuration | state | segments | audio-s/s end to end | steady (20-80%) | first segment s | "
           "last segment s | wall s | start s (apart) | slots |", "|---|---|---|---|---|---|---|---|---|---|"]
    for f in files:
        data = _json(f)
        if not data:
            continue
        name = f.stem.removeprefix("book_")
        for lv in data.get("levels", []):
            slots = ",".join(str(e.get("max_slots")) for e in lv.get("engines") or [])
            out.append(f"| {name} | {lv['state']} | {lv['segments']} | {lv['audio_s_per_s']} | "
                       f"{lv.get('steady_audio_s_per_s')} | {lv['first_segment_s']} | {lv.get('last_segment_s')} | "
                       f"{lv['wall_s']} | "
                       f"{data.get('daemon_start_s')} | {slots} |")
        if data.get("segment_lengths"):
            out.append(f"| {name}: segment lengths | {data['segment_lengths']} | | | | | | | | |")
        if data.get("error"):
            out.append(f"- {name}: {str(data['error'])[:300]}")
    return out


def main(argv=None) -> int:
    folder = Path((argv or sys.argv[1:])[0])
    lines = ["# benchmarks/device_gpu_books.sh", ""]
    gpu = folder / "gpu.txt"
    if gpu.exists():
        lines += [gpu.read_text().strip(), ""]
    parts = folder / "parts.txt"
    if parts.exists():
        lines += ["parts: " + "; ".join(parts.read_text().strip().splitlines()), ""]
    for section in (tests, asm, kernels, ab, books):
        try:
            got = section(folder)
        except Exception as e:  # noqa: BLE001 (one unreadable part keeps the others' lines)
            got = [f"## {section.__name__}: could not read ({type(e).__name__}: {e})"]
        if got:
            lines += got + [""]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
