"""Ledger commit cost against the number of reservations already on the node.

Issue 25: a commit rebuilt the node's view from SQLite each time (every
reservation's decision parsed), so a commit on a node holding 400
reservations cost 2.5x one on an empty node. Here: a simulated 8-GPU node
(deviceSplitCount 100, so 400 small reservations fit), N commits of a small
container on the empty ledger and N on the ledger holding 400, each released
again so the count stays put; p50 of each and their ratio (target <= 1.2).

    .venv/bin/python bench/ledger.py [--rounds 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hamid.devices.simulated import SimulatedBackend, parse_simulate_spec  # noqa: E402
from hamid.ledger import Ledger  # noqa: E402
from hamid.node.capacity import capacity_views  # noqa: E402
from hamid.config.schema import NodeSettings  # noqa: E402
from hamid.request import parse_docker_env  # noqa: E402


def commits(led: Ledger, rounds: int, tag: str) -> list[float]:
    out = []
    for i in range(rounds):
        req = parse_docker_env({"HAMI_VISIBLE_DEVICES": "0", "HAMI_VGPU_SPEC": "mem=64m,cores=1"}, f"{tag}{i}")
        t0 = time.perf_counter()
        led.reserve(req, kind="docker")
        out.append(time.perf_counter() - t0)
        led.release(f"docker:{tag}{i}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--held", type=int, default=400)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        backend = SimulatedBackend(parse_simulate_spec("H100:8"), node_name="bench")
        settings = NodeSettings(deviceSplitCount=100)
        led = Ledger(Path(d) / "ledger.db")
        led.set_inventory("bench", capacity_views(backend.gpus(), settings), "spread")
        commits(led, 20, "warm")
        empty = commits(led, args.rounds, "e")
        for i in range(args.held):
            gpu = i % 8
            led.reserve(parse_docker_env({"HAMI_VISIBLE_DEVICES": str(gpu), "HAMI_VGPU_SPEC": "mem=128m,cores=1"},
                                         f"held{i}"), kind="docker")
        assert len(led.list()) == args.held
        full = commits(led, args.rounds, "f")
        led.close()
    e50, f50 = statistics.median(empty), statistics.median(full)
    ms = 1000
    print(f"ledger commit (reserve) on a simulated 8-GPU node, {args.rounds} rounds each")
    print(f"  with 0 reservations:   p50 {e50 * ms:6.2f} ms")
    print(f"  with {args.held} reservations: p50 {f50 * ms:6.2f} ms")
    ratio = f50 / e50
    print(f"ratio {ratio:.2f} (target <= 1.2: {'met' if ratio <= 1.2 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
