#!/usr/bin/env python3
"""Placement decisions per second and p99 latency at 100, 1000 and 5000 nodes.

Each cluster has nodes of 8 GPUs (H100/A100 mixes, some nodes in MIG mode),
pre-loaded to a random 0-70% use. A stream of mixed requests (shim shares,
whole GPUs, multi-GPU, MIG profiles) is placed one at a time; each decision is
applied to the cluster so later ones see it, as the extender would.

Baseline in the same run: the cost of ranking the nodes alone (one sort by
node score), so the ratio shows how much the fitting adds on top of the
unavoidable O(N log N) ordering, and how cost grows with cluster size.

Target at 1000 nodes: >= 2000 decisions/s and p99 < 5 ms on one core.
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
            for j, g in enumerate(cap):
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


def run(n: int, k: int, seed: int = 1):
    rng = random.Random(seed)
    cluster = build_cluster(n, rng)
    views = {name: with_usage(name, cap, decs) for name, cap, decs in cluster}
    index = {name: (cap, decs) for name, cap, decs in cluster}
    reqs = requests(k, rng)

    # Baseline: ranking the nodes only.
    t0 = time.perf_counter()
    for _ in range(k):
        sorted(views.values(), key=lambda v: v.usage_score, reverse=True)
    base = (time.perf_counter() - t0) / k

    lat = []
    placed = 0
    for req in reqs:
        t = time.perf_counter()
        got = place(req, list(views.values()))
        if isinstance(got, Decision):
            cap, decs = index[got.node]
            decs.append(got)
            views[got.node] = with_usage(got.node, cap, decs)
            placed += 1
        lat.append(time.perf_counter() - t)
    total = sum(lat)
    lat.sort()
    p99 = lat[int(len(lat) * 0.99) - 1]
    return {"nodes": n, "decisions": k, "placed": placed, "per_s": k / total, "p50_ms": statistics.median(lat) * 1e3,
            "p99_ms": p99 * 1e3, "rank_only_ms": base * 1e3, "ratio": (total / k) / base}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="100,1000,5000")
    ap.add_argument("--decisions", type=int, default=2000)
    args = ap.parse_args()
    print(f"{'nodes':>6} {'decisions/s':>12} {'p50 ms':>8} {'p99 ms':>8} {'rank-only ms':>13} {'x rank-only':>12} {'placed':>7}")
    ok = True
    for n in (int(x) for x in args.nodes.split(",")):
        r = run(n, args.decisions)
        print(f"{r['nodes']:>6} {r['per_s']:>12.0f} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} {r['rank_only_ms']:>13.3f} "
              f"{r['ratio']:>12.2f} {r['placed']:>7}")
        if n == 1000:
            ok = r["per_s"] >= 2000 and r["p99_ms"] < 5
            print(f"       target at 1000 nodes (>=2000/s, p99<5 ms): {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
