#!/usr/bin/env python3
"""Where the slowest timed calls of a bench went, from a stage trace (``bench/stagetrace/sitecustomize.py``).

    report.py TRACE [--slowest N] [--skip-first K]

Reads the lines the daemon wrote and the bench's own ``BENCH <start> <end> main <round>`` lines;
prints, per traced call, how often it ran and its p50 / max / total milliseconds, then for each of
the N slowest bench calls every traced event that overlapped it (its offset from the call's start
and its length, in ms; the thread it ran on). ``--skip-first K`` leaves the first K rounds out of
the summary line of the rest (a daemon still starting up shows there).
"""

from __future__ import annotations

import argparse
import collections


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--slowest", type=int, default=5)
    ap.add_argument("--skip-first", type=int, default=10)
    args = ap.parse_args()
    events = []
    with open(args.trace) as f:
        for line in f:
            parts = line.split(None, 4)
            if len(parts) < 4:
                continue
            extra = parts[4].strip() if len(parts) > 4 else ""
            events.append((parts[0], float(parts[1]), float(parts[2]), parts[3], extra))
    bench = [e for e in events if e[0] == "BENCH"]
    other = [e for e in events if e[0] not in ("BENCH", "IMPORT")]
    ms = lambda e: (e[2] - e[1]) * 1000  # noqa: E731
    by = collections.defaultdict(list)
    for e in other:
        by[e[0]].append(ms(e))
    for name, xs in sorted(by.items()):
        xs.sort()
        print(f"{name:32} n={len(xs):5}  p50 {xs[len(xs) // 2]:7.2f}  max {xs[-1]:7.2f}  total {sum(xs):8.1f} ms")
    imports = [e for e in events if e[0] == "IMPORT"]
    if bench:
        first = min(e[1] for e in bench)
        late = [e for e in imports if e[1] >= first]
        print(f"modules imported while the bench ran: {len(late)}")
        rest = sorted(ms(e) for e in bench if int(e[4] or 0) >= args.skip_first)
        if rest:
            print(f"bench calls from round {args.skip_first}: n={len(rest)}  p50 {rest[len(rest) // 2]:.2f}  "
                  f"p99 {rest[min(len(rest) - 1, round(0.99 * (len(rest) - 1)))]:.2f}  max {rest[-1]:.2f} ms")
    for b in sorted(bench, key=ms)[-args.slowest:]:
        print(f"--- round {b[4]}: {ms(b):.2f} ms")
        for e in other:
            if e[2] > b[1] and e[1] < b[2]:
                print(f"   {e[0]:32} {1000 * (e[1] - b[1]):+8.2f} {ms(e):7.2f}  {e[3]} {e[4]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
