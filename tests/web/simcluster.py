"""A web view over a simulated cluster of many nodes, for the page's speed test.

Stand-in, and says so: one real node (a prepared daemon on simulated GPUs,
tests/nodeharness.py) serves the real web face, but its cluster view is a
made-up document of ``NODES`` members with ``GPUS`` simulated H100s each (some
busy, some in MIG mode with instances), shaped exactly as the gossip face's
``cluster_document`` (each member's capacity built by the gossip code's own
``doc_from_view``). Running a hundred real daemons would not fit a 2-core CI
machine; the page cannot tell the difference.

Usage: python simcluster.py PORT STATE_DIR [NODES] [GPUS]; prints "ready" when serving.
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nodeharness import make_node  # noqa: E402
from simnodes import node_view  # noqa: E402

from hamid.cluster.capacity import doc_from_view  # noqa: E402
from hamid.cluster.report import live_views  # noqa: E402
from hamid.placement import place  # noqa: E402
from hamid.placement.usage import with_usage  # noqa: E402
from hamid.request import parse_docker_env  # noqa: E402
from hamid.web.face import WebFace  # noqa: E402


def cluster_document(nodes: int, gpus: int) -> dict:
    members = []
    for i in range(nodes):
        name = f"gpu-node-{i:03d}"
        mig = i % 10 == 9
        view = node_view(name, f"H100-80GB-HBM3:{gpus}", operatingMode="mig" if mig else "hami-core")
        decisions = []
        for j in range(i % 5):  # 0-4 tenants per node
            spec = "1g.10gb" if mig else f"mem={4 * (j + 1)}g,cores={10 * (j + 1)}"
            req = parse_docker_env({"HAMI_VGPU_SPEC": spec}, f"{name}-job{j}")
            got = place(req, [with_usage(name, view.gpus, decisions, view.gpu_policy)])
            decisions.append(got)
        view = with_usage(name, view.gpus, decisions, view.gpu_policy)
        members.append({"name": name, "addr": f"10.0.{i // 250}.{i % 250}:7947", "state": "alive",
                        "incarnation": 1, "self": False, "since_s": 60.0,
                        "capacity": doc_from_view(view, 1_700_000_000_000 + i)})
    return {"node": "web-node", "addr": "127.0.0.1:7947", "incarnation": 1, "health": 0, "encrypted": True,
            "members": members, "stats": {"probes": {"ok": 1000}, "suspicions": 0, "refutations": 0,
                                          "bytes_sent": 0, "bytes_received": 0, "dropped": {}}}


async def main(port: int, state: Path, nodes: int, gpus: int) -> None:
    from hamid import logs

    logs.configure("json", "warning")
    d = make_node(state, simulate="H100-80GB-HBM3:2", node="web-node")
    doc = cluster_document(nodes, gpus)
    face = WebFace(d.service, f"127.0.0.1:{port}", settings=d.settings, cluster=lambda: doc,
                   marks=lambda: d.ledger.change_stamp(), containers_root=str(state / "containers"),
                   live_views=lambda: live_views(doc))
    async with trio.open_nursery() as n:
        await n.start(face.run)
        print("ready", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    trio.run(main, int(args[0]), Path(args[1]), int(args[2]) if len(args) > 2 else 100,
             int(args[3]) if len(args) > 3 else 8)
