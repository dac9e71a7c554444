#!/usr/bin/env python3
"""What ``--runtime=hami`` adds to a container's start-to-exit time, over ``--runtime=runc``.

Runs its own dockerd and hamid daemon (simulated GPUs), as the runtime tests
do (tests/dockerharness.py), then times ``docker run --rm IMAGE true`` in
rounds, each round running, in a shuffled order, the same container with:

- ``--runtime=runc`` (the baseline),
- ``--runtime=hami`` and ``HAMI_VGPU_SPEC=mem=1g,cores=10`` (a limited container:
  one call to the daemon, which admits it, writes its limits file and answers
  with its edits),
- ``--runtime=hami`` with no ``HAMI_*`` variable (a pass-through: the launcher
  hands it to runc without starting Python),
- ``--runtime=runc-named``: runc itself registered as another runtime in
  daemon.json, as ``hami`` is: what dockerd and containerd add for any runtime
  that is not the default, which no launcher can save; the pass-through's own
  cost is its difference to this one;
- with ``--compare DIR``: the same limited and pass-through containers through
  another build of the runtime (``DIR/hamid-runtime`` and its helpers beside
  it, e.g. the previous commit's), registered as ``hami-compare`` on the same
  state directory and daemon: the two builds measured in the same rounds.

Each round's hami times are paired with the same round's runc time, so both
see the same machine load. Prints, for each hami variant, the median of the
paired differences in milliseconds, that median as a share of runc's own
median time, and the ratio of medians. Targets (issue 25): a pass-through
container adds at most 2 % to runc's time, a limited one at most 10 %, with
another process keeping one core busy (``--busy``, on by default). Needs root.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import dockerharness as dh  # noqa: E402

TARGETS = {"limited": 0.10, "pass-through": 0.02}  # added time over runc's median


def _spin() -> None:
    while True:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=25, help="rounds (each runs every variant once)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-busy", action="store_true", help="do not keep a core busy meanwhile")
    ap.add_argument("--compare", type=Path, metavar="DIR",
                    help="also run the containers through DIR/hamid-runtime (another build), same rounds")
    args = ap.parse_args()
    if args.compare is not None and not os.access(args.compare / "hamid-runtime", os.X_OK):
        raise SystemExit(f"--compare {args.compare}: no executable hamid-runtime there")
    busy = None
    if not args.no_busy:  # the machine a runtime meets: something else computing
        import multiprocessing

        busy = multiprocessing.Process(target=_spin, daemon=True)
        busy.start()
    import shutil
    import tempfile

    runc = shutil.which("runc")
    if runc is None:
        raise SystemExit("runc not on PATH")
    root = Path(tempfile.mkdtemp(prefix="hamid-docker-"))
    os.chmod(root, 0o755)
    env = dh.Env(root, simulate="T4:2", mode="hami-core")  # as dh.new_env, with one more runtime in daemon.json
    env.daemon_json = {"runtimes": {
        "hami": {"path": str(env.bin_dir / "hamid-runtime"), "runtimeArgs": ["--state-dir", str(env.state)]},
        "runc-named": {"path": runc}}}
    if args.compare is not None:
        env.daemon_json["runtimes"]["hami-compare"] = {"path": str(args.compare.resolve() / "hamid-runtime"),
                                                       "runtimeArgs": ["--state-dir", str(env.state)]}
    env.make_nodes(2)
    env.start_hamid()
    env.start_docker()
    variants = {
        "runc": ["run", "--rm", "--runtime=runc", dh.IMAGE, "true"],
        "limited": ["run", "--rm", "--runtime=hami", "-e", "HAMI_VGPU_SPEC=mem=1g,cores=10", dh.IMAGE, "true"],
        "pass-through": ["run", "--rm", "--runtime=hami", dh.IMAGE, "true"],
        "runc-named": ["run", "--rm", "--runtime=runc-named", dh.IMAGE, "true"],
    }
    targets = dict(TARGETS)
    if args.compare is not None:
        variants["limited (compare)"] = ["run", "--rm", "--runtime=hami-compare", "-e",
                                         "HAMI_VGPU_SPEC=mem=1g,cores=10", dh.IMAGE, "true"]
        variants["pass-through (compare)"] = ["run", "--rm", "--runtime=hami-compare", dh.IMAGE, "true"]
        targets.update({f"{k} (compare)": v for k, v in TARGETS.items()})
    rnd = random.Random(args.seed)
    try:
        for argv in variants.values():  # warm-up
            env.docker(*argv, check=True)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.runs):
            order = list(variants)
            rnd.shuffle(order)
            for name in order:
                t = time.perf_counter()
                env.docker(*variants[name], check=True)
                times[name].append(time.perf_counter() - t)
        time.sleep(1.0)  # the last poststop marker is drained on the daemon's next look
        leftover = env.reservations()
    finally:
        env.stop()
        if busy is not None:
            busy.terminate()
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    print(f"rounds: {args.runs}, each running every variant once in a shuffled order"
          f"{'' if args.no_busy else ', one core kept busy by another process'}")
    for k in variants:
        print(f"{k:22} median {med[k]:7.1f} ms   min {min(times[k]) * 1000:7.1f} ms   "
              f"max {max(times[k]) * 1000:7.1f} ms")
    ok = True
    for k, target in targets.items():
        diffs = [(h - r) * 1000 for h, r in zip(times[k], times["runc"])]
        added = statistics.median(diffs)
        share = added / med["runc"]
        met = share <= target
        ok &= met
        print(f"{k:22} added over runc: median {added:+6.1f} ms (paired, same round) = {share:+.1%} of runc's "
              f"time; ratio of medians {med[k] / med['runc']:.3f}; target <= {target:.0%}: {'met' if met else 'NOT met'}")
    diffs = [(h - r) * 1000 for h, r in zip(times["pass-through"], times["runc-named"])]
    named = statistics.median([(h - r) * 1000 for h, r in zip(times["runc-named"], times["runc"])])
    print(f"runc under another runtime name, over runc: median {named:+6.1f} ms = {named / med['runc']:+.1%} "
          f"(dockerd's and containerd's, for any runtime not the default)")
    print(f"pass-through over runc under another name (the launcher's own): median {statistics.median(diffs):+6.1f} ms"
          f" = {statistics.median(diffs) / med['runc-named']:+.1%}")
    if args.compare is not None:
        diffs = [(h - r) * 1000 for h, r in zip(times["pass-through (compare)"], times["runc-named"])]
        print(f"the same through {args.compare}: median {statistics.median(diffs):+6.1f} ms"
              f" = {statistics.median(diffs) / med['runc-named']:+.1%}")
    print(f"reservations left after the runs: {len(leftover)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
