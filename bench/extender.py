#!/usr/bin/env python3
"""The extender's ``filter`` latency at 1,000, 5,000 and 15,000 nodes of 8 GPUs, beside a baseline.

The extender's HTTP app (:mod:`hamid.scheduling.extender`) is served by
hypercorn on loopback as the daemon serves it, over the leader's cluster view
(:class:`hamid.scheduling.placer.ClusterView`) fed by a real gossip
``Membership`` holding N members and their capacity documents (built as
bench/placement.py builds the nodes: H100/A100 mixes, some in MIG mode, each
pre-loaded to a random 0-70 % use, turned into gossip documents and back by
``view_from_doc`` as the daemon does). kube-scheduler's call is made as
kube-scheduler makes it with ``nodeCacheCapable: true``: ``POST /filter``
with the pod and every node's name.

Between calls, ``--churn`` members publish a new document version (a node
whose bookings changed, as every bind does somewhere), so the incremental
view and the filter's verdict cache are exercised, not only hit: 0 (nothing
changes), 1 (the steady state of a busy scheduler: one bind, so one node's
document, per pod filtered) and 10 (ten times that). The pods alternate
between two workloads' shapes (replicas of each), so each shape sees twice
the churn since its last call.

Baseline, in the same run and on the same server: an echo verb that decodes
the same request and answers the same shape without fitting anything (what
HTTP and JSON alone cost). Prints p50 and p99 of each, the filter's p50 over
the echo's and its p99 as a multiple of the echo's, and (information) the
cost of a request shape never seen before (one full pass over every node).
Targets at 5,000 nodes (one changed node per call): p50 at most +2 ms over the echo, p99 at most 3x the echo's.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
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

from hamid.scheduling.extender import Extender  # noqa: E402
from hamid.scheduling.placer import ClusterView  # noqa: E402
from hamid.request.model import Defaults  # noqa: E402
from hamid.serving import serve_asgi  # noqa: E402

POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "p", "namespace": "default", "uid": "00000000-0000-0000-0000-000000000001"},
       "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": {
           "nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "20"}}}]}}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


POD2 = json.loads(json.dumps(POD).replace('"8000"', '"30000"').replace('"20"', '"50"'))


def _gossip(views, seed: int):
    """A real gossip membership holding every node as an alive member with its document."""
    from hamid.cluster.capacity import doc_from_view
    from hamid.gossip.membership import Membership
    from hamid.gossip.params import GossipParams
    from hamid.gossip.stats import Stats

    m = Membership("leader", "127.0.0.1:1", GossipParams(), Stats(), send=lambda addr, msg: None)
    for i, v in enumerate(views):
        m._on_alive(v.name, f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:7946", 1, 0, "", spread=False)
        doc = doc_from_view(v, 1)
        doc["peer"] = f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:7947"
        m._apply_doc(v.name, doc)
    return m


def _republish(m, rng: random.Random, k: int) -> None:
    """``k`` random members publish their next document version (content unchanged: the cost is the same)."""
    names = list(m.docs)
    for name in rng.sample(names, min(k, len(names))):
        doc = dict(m.docs[name], version=m.docs[name]["version"] + 1)
        m._apply_doc(name, doc)


class _gc_pauses:
    """Generation-2 collections while the calls ran, and the longest (gc.callbacks)."""

    def __init__(self) -> None:
        import gc

        self.n, self.longest, self._t = 0, 0.0, 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase, info) -> None:
        import time

        if info["generation"] != 2:
            return
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.n += 1
            self.longest = max(self.longest, time.perf_counter() - self._t)

    def stop(self) -> tuple[int, float]:
        import gc

        gc.callbacks.remove(self._cb)
        return self.n, self.longest


async def measure(n: int, calls: int, seed: int, churns: list[int], freeze: bool = True) -> dict:
    from hamid.cluster.capacity import view_from_doc
    from hamid.placement.usage import with_usage

    views = [with_usage(name, cap, decisions) for name, cap, decisions in build_cluster(n, random.Random(seed))]
    gossip = _gossip(views, seed)
    del views
    cluster = ClusterView(gossip, view_from_doc, freeze_gc=freeze)  # the daemon's leader freezes
    ext = Extender(None, None, cluster, defaults=Defaults(), node_policy="binpack",
                   is_leader=lambda: True, leader_url=lambda: None)
    rng = random.Random(seed)

    async def echo(req: Request):
        args = json.loads(await req.body())
        return JSONResponse({"NodeNames": args["NodeNames"], "FailedNodes": {}, "Error": ""})

    app = Starlette(routes=[Route("/baseline/filter", echo, methods=["POST"]), Mount("/", ext.app())])
    names = sorted(gossip.docs)
    bodies = [json.dumps({"Pod": p, "NodeNames": names}).encode() for p in (POD, POD2)]
    out = {}
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve_asgi(app, "127.0.0.1:0", task_status=task_status))
        async with httpx.AsyncClient(base_url=binds[0], timeout=60) as c:
            t = trio.current_time()
            await c.post("/filter", content=bodies[0])
            cold = trio.current_time() - t  # the first call: every view built, one full pass
            for path in ("/filter", "/baseline/filter"):
                for b in bodies:
                    await c.post(path, content=b)
            pauses = _gc_pauses()
            rows = {}
            for churn in churns:
                lat = {"/filter": [], "/baseline/filter": []}
                feasible = None
                for i in range(calls):
                    body = bodies[i % 2]
                    _republish(gossip, rng, churn)
                    for path in ("/filter", "/baseline/filter") if i % 2 else ("/baseline/filter", "/filter"):
                        t = trio.current_time()
                        r = await c.post(path, content=body)
                        lat[path].append(trio.current_time() - t)
                        if path == "/filter":
                            feasible = len(r.json()["NodeNames"])
                rows[churn] = (lat["/filter"], lat["/baseline/filter"], feasible)
            # a request shape never seen: one full pass of the engine over every node
            shape = []
            for k in range(3):
                pod = json.loads(json.dumps(POD).replace('"8000"', f'"{9000 + k}"'))
                b = json.dumps({"Pod": pod, "NodeNames": names}).encode()
                t = trio.current_time()
                await c.post("/filter", content=b)
                shape.append(trio.current_time() - t)
            out = {"rows": rows, "cold": cold, "new_shape": statistics.median(shape), "rebuilt": cluster.rebuilt,
                   "computed": ext.verdicts.computed, "gc": pauses.stop()}
        nursery.cancel_scope.cancel()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1000,5000,15000")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--churn", default="0,1,10", help="members republishing between two calls (a list)")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--no-freeze", action="store_true", help="without the leader's gc.freeze (what it saves)")
    args = ap.parse_args()
    from hamid import logs

    logs.configure("console", "error")  # a line per member joining would drown the figures
    churns = [int(x) for x in args.churn.split(",")]
    ms = 1000
    print("filter through the extender's HTTP app (hypercorn, loopback), nodeCacheCapable; baseline: an echo "
          "verb in the same run; churn: nodes republished between two calls")
    for n in (int(x) for x in args.nodes.split(",")):
        got = trio.run(measure, n, args.calls, args.seed, churns, not args.no_freeze)
        for churn, (f, b, feasible) in got["rows"].items():
            over50 = (pct(f, 50) - pct(b, 50)) * ms
            x99 = pct(f, 99) / pct(b, 99)
            print(f"{n:6} nodes x 8 GPUs, churn {churn:2}: filter p50 {pct(f, 50) * ms:6.2f} p99 {pct(f, 99) * ms:6.2f} ms"
                  f" | echo p50 {pct(b, 50) * ms:6.2f} p99 {pct(b, 99) * ms:6.2f} ms | p50 {over50:+6.2f} ms, "
                  f"p99 {x99:4.2f}x echo's | {feasible} feasible")
            if n == 5000 and churn == 1:
                ok = over50 <= 2 and x99 <= 3
                print(f"        target at 5000, churn 1 (p50 <= echo + 2 ms, p99 <= 3x echo's): "
                      f"{'met' if ok else 'NOT met'}")
        print(f"{n:6} nodes: first call {got['cold'] * ms:.0f} ms, a new request shape {got['new_shape'] * ms:.1f} ms"
              f" | views built {got['rebuilt']}, verdicts computed {got['computed']} | gen-2 GCs during the calls "
              f"{got['gc'][0]} (longest {got['gc'][1] * ms:.0f} ms) | max RSS "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
