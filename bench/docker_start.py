#!/usr/bin/env python3
"""Container start-to-exit time: ``--runtime=hami`` (vGPU spec) over ``--runtime=runc``.

Runs its own dockerd and hamid daemon (simulated GPUs), as the runtime tests
do (tests/dockerharness.py), then times ``docker run --rm IMAGE true``
alternately with ``--runtime=runc`` and with ``--runtime=hami -e
HAMI_VGPU_SPEC=mem=1g,cores=10``, so both see the same machine load. Prints
the median of each and their ratio. Target: hami/runc <= 1.15. Needs root.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import dockerharness as dh  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    env = dh.new_env(simulate="T4:2", mode="hami-core")
    try:
        variants = {
            "runc": ["run", "--rm", "--runtime=runc", dh.IMAGE, "true"],
            "hami": ["run", "--rm", "--runtime=hami", "-e", "HAMI_VGPU_SPEC=mem=1g,cores=10", dh.IMAGE, "true"],
        }
        for argv in variants.values():  # warm-up
            env.docker(*argv, check=True)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.runs):
            for name, argv in variants.items():
                t = time.perf_counter()
                env.docker(*argv, check=True)
                times[name].append(time.perf_counter() - t)
        time.sleep(1.0)  # the last poststop marker is drained on the daemon's next look
        leftover = env.reservations()
    finally:
        env.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["hami"] / med["runc"]
    print(f"runs: {args.runs} each, alternating")
    for k in variants:
        print(f"{k:5} median {med[k] * 1000:7.1f} ms   min {min(times[k]) * 1000:7.1f} ms   max {max(times[k]) * 1000:7.1f} ms")
    print(f"hami/runc start-to-exit ratio: {ratio:.3f} (target <= 1.15: {'met' if ratio <= 1.15 else 'NOT met'})")
    print(f"reservations left after the runs: {len(leftover)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
