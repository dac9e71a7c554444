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
alone allow. Target (issue 25): pods placed/s at least 0.8x the baseline's,
with 3 and with 50 nodes. Also printed: the leader's CPU time (user + system,
from /proc) per pod placed, over the placement window.

The daemons run with the default ``reconcileInterval`` (30 s), as deployed:
the test clusters' 1 s would have every node look up each placed pod that is
not bound yet (there is no kube-scheduler here to bind them) once a second,
which is the reconciler's cost, not placement's. The stand-in API server runs
in this process; the wait for the last gate reads one pod at a time, in order,
so the bench's own polling does not compete with it for the interpreter.
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
    """When the last of ``names`` has no gate (each pod read until it has none, then the next)."""
    deadline = time.time() + timeout
    left = list(names)
    while left and time.time() < deadline:
        while left and not api.get("Pod", "default", left[-1])["spec"].get("schedulingGates"):
            left.pop()
        if left:
            time.sleep(0.02)
    if left:
        raise SystemExit(f"{len(left)} pods still gated after {timeout} s")
    return time.time()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    import os

    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--pods", type=int, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hamid-gate-") as tmp, ApiServer(bookmark_interval=1.0) as api:
        from hamid.config.schema import Config

        env = ClusterEnv(Path(tmp), api, nodes=args.nodes, split=max(10, args.pods // (2 * args.nodes) + 5),
                         reconcile_interval=Config().reconcileInterval)
        env.start(webhook=False)
        try:
            leader = env.nodes[env.leader()].proc.pid
            time.sleep(2.0 + args.nodes / 10)  # every node has seen the Lease holder (retry period 0.5 s): it takes its commits
            names = [f"p{i}" for i in range(args.pods)]
            c0, t0 = cpu_s(leader), time.time()
            for n in names:
                api.create(pod(n, 200))
            t_created = time.time()
            t1 = wait_ungated(api, names, timeout=300)
            c1 = cpu_s(leader)
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
    ratio = placed / baseline
    print(f"{args.pods} gated pods over {args.nodes} nodes x 2 H100")
    print(f"gate mode: {placed:7.1f} pods placed/s (choice + peer commit + one pod update each); "
          f"reservations on the nodes: {booked}")
    print(f"leader's CPU: {(c1 - c0) * 1000 / args.pods:.2f} ms per pod placed ({c1 - c0:.2f} s over {t1 - t0:.2f} s)")
    print(f"the {args.pods} creates (in the window, on the stand-in every daemon watches) took {t_created - t0:.2f} s")
    print(f"baseline (read + remove the gate, one client, no placement): {baseline:7.1f} pods/s")
    print(f"ratio {ratio:.2f}x the baseline; target >= 0.8x: {'met' if ratio >= 0.8 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
