#!/usr/bin/env python3
"""The extender's ``filter`` latency at 100, 1000 and 5000 nodes of 8 GPUs, beside a baseline.

The extender's HTTP app (:mod:`hamid.control.extender`) is served by
hypercorn on loopback as the daemon serves it, over a cluster view of N
nodes (built as bench/placement.py builds them: H100/A100 mixes, some in MIG
mode, each pre-loaded to a random 0-70 % use), and kube-scheduler's call is
made as kube-scheduler makes it with ``nodeCacheCapable: true``: ``POST
/filter`` with the pod and every node's name. The baseline, in the same run
and on the same server, is an echo verb that decodes the same request and
answers the same shape without fitting anything: what HTTP and JSON alone
cost. Prints p50 and p99 of each, and of filter minus the echo. Target: filter
p99 at most 10 ms at 1000 nodes.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
import trio  # noqa: E402
from placement import build_cluster  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Mount, Route  # noqa: E402

from hamid.control.extender import Extender  # noqa: E402
from hamid.control.placer import ClusterView  # noqa: E402
from hamid.request.model import Defaults  # noqa: E402
from hamid.serving import serve_asgi  # noqa: E402

POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "p", "namespace": "default", "uid": "00000000-0000-0000-0000-000000000001"},
       "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": {
           "nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "20"}}}]}}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def measure(n: int, calls: int, seed: int) -> dict:
    from hamid.placement import NodeView
    from hamid.placement.usage import with_usage

    views = [with_usage(name, cap, decisions) for name, cap, decisions in build_cluster(n, random.Random(seed))]
    assert all(isinstance(v, NodeView) for v in views)
    docs = {v.name: {"node": v.name, "version": 1, "peer": "127.0.0.1:1"} for v in views}
    by_name = {v.name: v for v in views}
    cluster = ClusterView(read=lambda: docs, to_view=lambda d: by_name[d["node"]])
    ext = Extender(None, None, cluster, defaults=Defaults(), node_policy="binpack",
                   is_leader=lambda: True, leader_url=lambda: None)

    async def echo(req: Request):
        args = json.loads(await req.body())
        return JSONResponse({"NodeNames": args["NodeNames"], "FailedNodes": {}, "Error": ""})

    app = Starlette(routes=[Route("/baseline/filter", echo, methods=["POST"]), Mount("/", ext.app())])
    body = json.dumps({"Pod": POD, "NodeNames": [v.name for v in views]}).encode()
    out = {}
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve_asgi(app, "127.0.0.1:0", task_status=task_status))
        url = binds[0].replace("http://", "http://")
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            for path in ("/filter", "/baseline/filter"):
                for _ in range(5):
                    await c.post(path, content=body)
            lat = {"/filter": [], "/baseline/filter": []}
            feasible = None
            for i in range(calls):
                for path in ("/filter", "/baseline/filter") if i % 2 else ("/baseline/filter", "/filter"):
                    t = trio.current_time()
                    r = await c.post(path, content=body)
                    lat[path].append(trio.current_time() - t)
                    if path == "/filter":
                        feasible = len(r.json()["NodeNames"])
            out = {"filter": lat["/filter"], "baseline": lat["/baseline/filter"], "feasible": feasible}
        nursery.cancel_scope.cancel()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="100,1000,5000")
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    ms = 1000
    print("filter through the extender's HTTP app (hypercorn, loopback), nodeCacheCapable; baseline: an echo verb")
    met = None
    for n in (int(x) for x in args.nodes.split(",")):
        got = trio.run(measure, n, args.calls, args.seed)
        f, b = got["filter"], got["baseline"]
        print(f"{n:5} nodes x 8 GPUs: filter p50 {pct(f, 50) * ms:6.2f} ms p99 {pct(f, 99) * ms:6.2f} ms | "
              f"baseline p50 {pct(b, 50) * ms:6.2f} ms p99 {pct(b, 99) * ms:6.2f} ms | "
              f"filter - baseline p50 {(statistics.median(f) - statistics.median(b)) * ms:+6.2f} ms | "
              f"{got['feasible']} feasible")
        if n == 1000:
            met = pct(f, 99) * ms <= 10
    if met is not None:
        print(f"target filter p99 <= 10 ms at 1000 nodes: {'met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
