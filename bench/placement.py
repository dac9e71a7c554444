#!/usr/bin/env python3
"""Placement decisions per second and p99 latency at 100, 1000 and 5000 nodes.

Each cluster has nodes of 8 GPUs (H100/A100 mixes, some nodes in MIG mode),
pre-loaded to a random 0-70% use. A stream of mixed requests (shim shares,
whole GPUs, multi-GPU, MIG profiles) is placed one at a time; each decision is
applied to the cluster so later ones see it, as the leader would.

Two ways, on the same stream and the same cluster: ``place()`` over the list of
node views (what the engine did per decision: sort every node, then walk), and
:class:`hamid.placement.ranked.RankedNodes` (nodes kept in placement order,
one node re-ranked per decision, blocks of nodes skipped by their summaries).
The bench checks that both make the same decisions.

The stream (600 decisions) is short enough that no size fills up. Baselines
in the same run: the ranked index's decisions/s at the smallest size
(target: at 5000 nodes at least 0.8x that, i.e. flat with cluster size), and
the cost of ranking the nodes alone (one sort by node score).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hamid.devices.catalog import A100_80, H100_80  # noqa: E402
from hamid.devices.simulated import SimulatedBackend  # noqa: E402
from hamid.placement import Decision, place  # noqa: E402
from hamid.placement.ranked import RankedNodes  # noqa: E402
from hamid.placement.usage import with_usage  # noqa: E402
from hamid.placement.view import gpu_view_from_info  # noqa: E402
from hamid.request import parse_docker_env, parse_pod  # noqa: E402

SPECS = [
    {"HAMI_VGPU_SPEC": "mem=4g,cores=10"},
    {"HAMI_VGPU_SPEC": "mem=8g,cores=20"},
    {"HAMI_VGPU_SPEC": "mem=25%"},
    {"HAMI_VGPU_SPEC": "mem=2g,gpus=2"},
    {"HAMI_VISIBLE_DEVICES": "all", "HAMI_VGPU_SPEC": "mem=1g,cores=5"},
    {"HAMI_VGPU_SPEC": "1g.10gb"},
    {"HAMI_VGPU_SPEC": "mode=mig,mem=15g"},
]


def build_cluster(n: int, rng: random.Random):
    nodes = []
    for i in range(n):
        mig = i % 10 == 0
        model = H100_80 if i % 3 else A100_80
        backend = SimulatedBackend([model] * 8, f"node-{i}", mig_enabled=mig)
        cap = [gpu_view_from_info(g) for g in backend.gpus()]
        decisions = []
        if not mig:
            for j, _g in enumerate(cap):
                load = rng.randint(0, 7)
                if load:
                    req = parse_docker_env({"HAMI_VISIBLE_DEVICES": str(j),
                                            "HAMI_VGPU_SPEC": f"mem={load * 1024 * 8 // 10}m,cores={load * 5}"},
                                           f"pre-{i}-{j}")
                    got = place(req, [with_usage(f"node-{i}", cap, decisions)])
                    if isinstance(got, Decision):
                        decisions.append(got)
        nodes.append([f"node-{i}", cap, decisions])
    return nodes


def requests(k: int, rng: random.Random):
    out = []
    for i in range(k):
        if i % 5 == 4:
            out.append(parse_pod({"metadata": {"name": f"p{i}"}, "spec": {"containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000,
                                                        "nvidia.com/gpucores": 10}}},
                {"name": "b", "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000}}}]}}))
        else:
            out.append(parse_docker_env(rng.choice(SPECS), f"c{i}"))
    return out


def run(n: int, k: int, ranked: bool, seed: int = 1):
    rng = random.Random(seed)
    cluster = build_cluster(n, rng)
    views = {name: with_usage(name, cap, decs) for name, cap, decs in cluster}
    index = {name: (cap, decs) for name, cap, decs in cluster}
    reqs = requests(k, rng)

    # Baseline: ranking the nodes only.
    t0 = time.perf_counter()
    for _ in range(min(k, 200)):
        sorted(views.values(), key=lambda v: v.usage_score, reverse=True)
    base = (time.perf_counter() - t0) / min(k, 200)

    rank = RankedNodes(views.values(), "binpack") if ranked else None
    lat = []
    decisions = []
    for req in reqs:
        t = time.perf_counter()
        got = rank.place(req) if ranked else place(req, list(views.values()))
        if isinstance(got, Decision):
            cap, decs = index[got.node]
            decs.append(got)
            views[got.node] = with_usage(got.node, cap, decs)
            if ranked:
                rank.update(views[got.node])
        lat.append(time.perf_counter() - t)
        decisions.append(got if isinstance(got, Decision) else None)
    total = sum(lat)
    lat.sort()
    p99 = lat[int(len(lat) * 0.99) - 1]
    return {"nodes": n, "decisions": k, "placed": sum(d is not None for d in decisions), "per_s": k / total,
            "p50_ms": statistics.median(lat) * 1e3, "p99_ms": p99 * 1e3, "rank_only_ms": base * 1e3,
            "made": decisions}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="100,1000,5000")
    # short enough that 100 nodes do not fill up (about 900 fit there): a full cluster makes every
    # decision a NoFit that collects every node's reasons, another cost than placing
    ap.add_argument("--decisions", type=int, default=600)
    args = ap.parse_args()
    print(f"{'nodes':>6} {'way':>8} {'decisions/s':>12} {'p50 ms':>8} {'p99 ms':>8} {'rank-only ms':>13} {'placed':>7}")
    first = None
    for n in (int(x) for x in args.nodes.split(",")):
        today = run(n, args.decisions, ranked=False)
        r = run(n, args.decisions, ranked=True)
        same = today["made"] == r["made"]
        for way, x in (("place()", today), ("ranked", r)):
            print(f"{n:>6} {way:>8} {x['per_s']:>12.0f} {x['p50_ms']:>8.3f} {x['p99_ms']:>8.3f} "
                  f"{x['rank_only_ms']:>13.3f} {x['placed']:>7}")
        if not same:
            print(f"       DIFFERENT decisions from place() at {n} nodes")
        first = first or r
        print(f"       ranked at {n} nodes: {r['per_s'] / first['per_s']:.2f}x its rate at {first['nodes']} nodes; "
              f"{r['per_s'] / today['per_s']:.1f}x place() at this size; same decisions: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
