#!/usr/bin/env python3
"""Pods placed per second by the leader in gate mode, through the API-server stand-in.

Starts the API-server stand-in and N nodes (a kubelet stand-in and a real
``hamid run`` each, gossip, peer API, the control face), creates P gated GPU
pods at once (directly, not through the webhook, so only the placement is
timed), and times from the first create to the last pod with its gate
removed: each placement is a choice on the gossiped view, a commit on the
chosen node's ledger through the peer API, and one pod update. Baseline in
the same run and on the same stand-in: a controller that only removes the
gate (read, one update per pod) over P other pods: what the API round trips
alone allow. Target: at least 100 pods placed per second.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "k8s"))
sys.path.insert(0, str(ROOT / "tests" / "standins"))
from apiserver import ApiServer  # noqa: E402
from clusterenv import ClusterEnv  # noqa: E402

GATE = "hamid.io/placement"


def pod(name: str, mem: int, gated: bool = True) -> dict:
    p = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
         "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": {
             "nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem)}, "requests": {"cpu": "10m"}}}]}}
    if gated:
        p["spec"]["schedulingGates"] = [{"name": GATE}]
    return p


def wait_ungated(api, names, timeout) -> float:
    deadline = time.time() + timeout
    left = set(names)
    while left and time.time() < deadline:
        for n in list(left):
            if not api.get("Pod", "default", n)["spec"].get("schedulingGates"):
                left.discard(n)
        if left:
            time.sleep(0.02)
    if left:
        raise SystemExit(f"{len(left)} pods still gated after {timeout} s")
    return time.time()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--pods", type=int, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hamid-gate-") as tmp, ApiServer(bookmark_interval=1.0) as api:
        env = ClusterEnv(Path(tmp), api, nodes=args.nodes, split=max(10, args.pods // (2 * args.nodes) + 5))
        env.start(webhook=False)
        try:
            env.leader()
            names = [f"p{i}" for i in range(args.pods)]
            t0 = time.time()
            for n in names:
                api.create(pod(n, 200))
            t1 = wait_ungated(api, names, timeout=300)
            placed = args.pods / (t1 - t0)
            # baseline: read and one update per pod, nothing else
            base = [f"b{i}" for i in range(args.pods)]
            for n in base:  # under a gate of another controller, so hamid's leader leaves them alone
                p = pod(n, 200)
                p["spec"]["schedulingGates"] = [{"name": "example.com/baseline"}]
                api.create(p)
            from kubernetes import client, config

            core = client.CoreV1Api(config.new_client_from_config(config_file=env.nodes[0].kubeconfig))
            t2 = time.time()
            for n in base:
                p = core.read_namespaced_pod(n, "default")
                p.spec.scheduling_gates = None
                core.replace_namespaced_pod(n, "default", p)
            t3 = time.time()
            baseline = args.pods / (t3 - t2)
            booked = sum(1 for ne in env.nodes for _ in ne.reservations())
        finally:
            env.stop()
    print(f"{args.pods} gated pods over {args.nodes} nodes x 2 H100")
    print(f"gate mode: {placed:7.1f} pods placed/s (choice + peer commit + one pod update each); "
          f"reservations on the nodes: {booked}")
    print(f"baseline (read + remove the gate, one client, no placement): {baseline:7.1f} pods/s")
    print(f"target >= 100 pods/s: {'met' if placed >= 100 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
