"""Where a process's threads spent a run: a summary of py-spy's raw output (`py-spy record -f raw --threads`).

    python -m benchmarks.profile_summary profile_123.txt [--rate 50] [--top 12] [--depth 3]

Per thread: the samples it was seen busy (py-spy leaves idle samples out unless --idle) as seconds and as a
share of the wall time (samples / rate / duration), then the functions it was in most, counted once per
sample however deep (inclusive), shown as `function (file:line)`; with --depth N the N innermost frames of the
busiest stacks.
"""
from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict

_FRAME = re.compile(r"^(?P<fn>.+?) \((?P<file>[^:()]+)(?::\d+)?\)$")


def parse(path: str) -> dict[str, list[tuple[list[str], int]]]:
    """{thread: [(frames outermost first, samples)]}"""
    out: dict[str, list] = defaultdict(list)
    for line in open(path, encoding="utf-8", errors="replace"):
        line = line.rstrip("\n")
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        thread = frames[0]
        out[thread].append((frames[1:], int(count)))
    return out


def short(frame: str) -> str:
    m = _FRAME.match(frame)
    return f"{m.group('fn')} ({m.group('file')})" if m else frame


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.profile_summary", description=__doc__.split("\n\n")[0])
    ap.add_argument("path")
    ap.add_argument("--rate", type=float, default=50.0, help="samples per second the profile was taken at")
    ap.add_argument("--seconds", type=float, default=None, help="how long it ran (default: the busiest thread's)")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--depth", type=int, default=0)
    args = ap.parse_args(argv)
    threads = parse(args.path)
    totals = {t: sum(n for _, n in rows) for t, rows in threads.items()}
    wall = args.seconds or max(totals.values()) / args.rate
    for thread, rows in sorted(threads.items(), key=lambda kv: -totals[kv[0]]):
        n = totals[thread]
        print(f"\n== {thread}: {n} samples, {n / args.rate:.1f} s busy ({100 * n / args.rate / wall:.0f}% of {wall:.0f} s)")
        incl: Counter = Counter()
        for frames, count in rows:
            for f in set(short(f) for f in frames):
                incl[f] += count
        for f, c in incl.most_common(args.top):
            print(f"  {100 * c / n:5.1f}%  {f}")
        if args.depth:
            tails: Counter = Counter()
            for frames, count in rows:
                tails[" <- ".join(short(f) for f in reversed(frames[-args.depth:]))] += count
            for f, c in tails.most_common(args.top):
                print(f"  {100 * c / n:5.1f}%  {f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
