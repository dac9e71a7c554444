#!/usr/bin/env python3
"""Pods placed per second by the leader in gate mode, through the API-server stand-in.

Starts the API-server stand-in and N nodes (a kubelet stand-in and a real
``hamid run`` each, gossip, peer API, the scheduling face), creates P gated GPU
pods (directly, not through the webhook, so only the placement is timed):
each placement is a choice on the gossiped view, a commit on the chosen
node's ledger through the peer API, and one pod update.

Baseline, in the same run, on the same stand-in with the same daemons running:
a bare controller that removes another gate: a process of its own (as the
leader is), watching pods and sending one update per gated pod it sees (the
pod from the watch event, as a controller does: no read), sequentially, with
the official Kubernetes client over raw JSON (nothing deserialized into
models): what the API round trips alone allow.

Both are timed by the SAME definition: from the first of their P creates to
the moment the stand-in stored the last of their P gate removals (each
removal's time recorded by the stand-in itself, in this process, so no
polling interval lands in either window). The creates are inside both
windows, because a controller works while pods arrive: timing hamid after its
creates would hand it the pods it placed during them for free, and timing
the baseline before its watch sees them would not be a controller at all.
The bare controller is started, its watch open, before its first create.
Target (issue 25): pods placed/s at least 0.8x the baseline's, with 3 and
with 50 nodes. Also printed: the leader's and the bare controller's CPU time
(user + system, from /proc) per pod over their windows, and when the pods'
gates were removed (median, p99, the last), which shows a straggler.
``--baseline-first`` runs the baseline before hamid's pods (each sees the
other's pods in the store afterwards; the order is printed).

The daemons run with the default ``reconcileInterval`` (30 s), as deployed:
the test clusters' 1 s would have every node look up each placed pod that is
not bound yet (there is no kube-scheduler here to bind them) once a second,
which is the reconciler's cost, not placement's. Gossip and leader election
run at the daemon's defaults too (gossip every 0.2 s, probes every 1 s, the
Lease tried every 2 s), not the test clusters' quick ones (0.05 s, 0.5 s,
0.5 s): at 50 daemons those are 100 Lease reads a second at the API server and
four times the gossip, a load no deployed cluster carries, landing on both
hamid's window and the baseline's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "k8s"))
sys.path.insert(0, str(ROOT / "tests" / "standins"))

GATE = "hamid.io/placement"
BASE_GATE = "example.com/baseline"


def pod(name: str, mem: int, gate: str = GATE) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulingGates": [{"name": gate}],
                     "containers": [{"name": "main", "image": "x", "resources": {"limits": {
                         "nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem)}, "requests": {"cpu": "10m"}}}]}}


class Ungated:
    """When the stand-in stored each pod's update that left it with no scheduling gate (this process)."""

    def __init__(self, api) -> None:
        self.at: dict[str, float] = {}
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        real = api.do_update

        def do_update(rt, ns, name, mutate, subresource=None):
            out = real(rt, ns, name, mutate, subresource=subresource)
            if rt.kind == "Pod" and subresource is None and not (out.get("spec") or {}).get("schedulingGates"):
                with self._lock:
                    self.at.setdefault(name, time.time())
                    self._done.notify_all()
            return out

        api.do_update = do_update

    def wait(self, names: list[str], timeout: float) -> list[float]:
        """Each of ``names``' ungating time, once all are ungated."""
        deadline = time.time() + timeout
        with self._lock:
            while not all(n in self.at for n in names):
                left = deadline - time.time()
                if left <= 0:
                    missing = sum(1 for n in names if n not in self.at)
                    raise SystemExit(f"{missing} pods still gated after {timeout} s")
                self._done.wait(min(left, 1.0))
            return [self.at[n] for n in names]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bare_controller(kubeconfig: str, count: int) -> int:
    """The baseline: watch pods, remove ``BASE_GATE`` from each with one update, ``count`` of them."""
    from kubernetes import client, config
    from kubernetes.watch.watch import iter_resp_lines

    core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    rv = json.loads(core.list_namespaced_pod("default", _preload_content=False).data)["metadata"]["resourceVersion"]
    resp = core.list_namespaced_pod("default", watch=True, resource_version=rv, timeout_seconds=600,
                                    _preload_content=False)
    print("ready", flush=True)
    done = 0
    for line in iter_resp_lines(resp):
        ev = json.loads(line)
        if ev.get("type") not in ("ADDED", "MODIFIED"):
            continue
        p = ev["object"]
        gates = (p.get("spec") or {}).get("schedulingGates") or []
        if not any(g.get("name") == BASE_GATE for g in gates):
            continue
        rest = [g for g in gates if g.get("name") != BASE_GATE]
        if rest:
            p["spec"]["schedulingGates"] = rest
        else:
            del p["spec"]["schedulingGates"]
        core.replace_namespaced_pod(p["metadata"]["name"], "default", p, _preload_content=False)
        done += 1
        if done >= count:
            return 0
    return 1


def timed(api, ungated: Ungated, names: list[str], gate: str, pid: int) -> tuple[float, float, list[float], float]:
    """Create ``names`` under ``gate``; (window s, CPU s of ``pid``, each pod's ungating s after the first
    create, the creates' own s)."""
    c0, t0 = cpu_s(pid), time.time()
    for n in names:
        api.create(pod(n, 200, gate))
    t_created = time.time()
    at = ungated.wait(names, timeout=300)
    c1 = cpu_s(pid)
    return max(at) - t0, c1 - c0, sorted(a - t0 for a in at), t_created - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--pods", type=int, default=300)
    ap.add_argument("--baseline-first", action="store_true")
    ap.add_argument("--keep-logs", metavar="DIR", help="copy every daemon's log (JSON lines) into DIR")
    ap.add_argument("--bare-controller", metavar="KUBECONFIG", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare_controller:
        return bare_controller(args.bare_controller, args.pods)
    from apiserver import ApiServer
    from clusterenv import ClusterEnv

    from hamid.config.schema import Config

    with tempfile.TemporaryDirectory(prefix="hamid-gate-") as tmp, ApiServer(bookmark_interval=1.0) as api:
        ungated = Ungated(api)
        env = ClusterEnv(Path(tmp), api, nodes=args.nodes, split=max(10, args.pods // (2 * args.nodes) + 5),
                         reconcile_interval=Config().reconcileInterval, deployed_timings=True)
        env.start(webhook=False)
        bare = None
        try:
            leader = env.nodes[env.leader()].proc.pid
            # every node has read the Lease and knows its holder (a candidate reads it every retry period,
            # jittered up to 2.2x), so it takes the leader's commits; and the gossip has converged
            time.sleep(2.2 * env.lease_retry_s + 1.0 + args.nodes / 10)

            def run_hamid():
                return timed(api, ungated, [f"p{i}" for i in range(args.pods)], GATE, leader)

            def run_base():
                nonlocal bare
                bare = subprocess.Popen([sys.executable, __file__, "--bare-controller", env.nodes[0].kubeconfig,
                                         "--pods", str(args.pods)], stdout=subprocess.PIPE, text=True)
                if bare.stdout.readline().strip() != "ready":
                    raise SystemExit("the bare controller did not start")
                got = timed(api, ungated, [f"b{i}" for i in range(args.pods)], BASE_GATE, bare.pid)
                bare.wait(timeout=30)
                return got

            if args.baseline_first:
                b, h = run_base(), run_hamid()
            else:
                h, b = run_hamid(), run_base()
            booked = sum(1 for ne in env.nodes for _ in ne.reservations())
            last = sorted(((n, t) for n, t in ungated.at.items() if n.startswith("p")), key=lambda kv: kv[1])
        finally:
            if bare is not None and bare.poll() is None:
                bare.kill()
            env.stop()
            if args.keep_logs:
                import shutil

                os.makedirs(args.keep_logs, exist_ok=True)
                for ne in env.nodes:
                    shutil.copy(ne.log, Path(args.keep_logs) / f"{ne.node}.log")
    placed, baseline = args.pods / h[0], args.pods / b[0]
    ratio = placed / baseline

    def spread(xs: list[float]) -> str:
        return (f"median {statistics.median(xs):.2f} s, p99 {xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]:.2f} s, "
                f"last {xs[-1]:.2f} s")

    print(f"{args.pods} gated pods over {args.nodes} nodes x 2 H100; "
          f"{'baseline first' if args.baseline_first else 'hamid first'}; both timed from their first create "
          f"to the stand-in storing their last gate removal")
    print(f"gate mode: {placed:7.1f} pods placed/s over {h[0]:.2f} s (choice + peer commit + one pod update each); "
          f"reservations on the nodes: {booked}")
    print(f"  gates removed: {spread(h[2])}; the creates took {h[3]:.2f} s")
    print(f"  leader's CPU: {h[1] * 1000 / args.pods:.2f} ms per pod placed ({h[1]:.2f} s)")
    print(f"baseline (a bare controller: watch + one update per pod): {baseline:7.1f} pods/s over {b[0]:.2f} s")
    print(f"  gates removed: {spread(b[2])}; the creates took {b[3]:.2f} s")
    print(f"  its CPU: {b[1] * 1000 / args.pods:.2f} ms per pod ({b[1]:.2f} s)")
    print("hamid's last gates removed: " + ", ".join(f"{n} {t - last[-1][1]:+.3f} s" for n, t in last[-4:]))
    print(f"ratio {ratio:.2f}x the baseline; target >= 0.8x: {'met' if ratio >= 0.8 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
