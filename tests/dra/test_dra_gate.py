"""DRA GPUs and the leader's placement (gate mode): a real cluster of hamid daemons (gossip, leader
election, the peer API, the webhook) on the stand-ins, one node serving GPU 0 through DRA
(``draDevices: '0'``) and GPU 1 through the device plugin, with ``deviceListStrategy: cdi-cri`` (the
ledger, not kubelet's device IDs, says which GPU a pod gets: where the leader places it, it runs).

Owns the proof that the leader's gate pass, reading the node's gossiped capacity document, never
places a device-plugin pod on a DRA GPU, and that a pod only DRA GPUs could take stays gated with the
reason that the GPU serves DRA.
"""

from __future__ import annotations

import time

import pytest

from clusterenv import ClusterEnv
from nodeenv import RESOURCE

pytestmark = pytest.mark.slow

GATE = "hamid.io/placement"


def gated_pod(name: str, mem: int, gpus: int = 1) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulingGates": [{"name": GATE}],
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": {RESOURCE: str(gpus), "nvidia.com/gpumem": str(mem)},
                                                   "requests": {"cpu": "100m"}}}]}}


def wait_for(what, fn, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.1)


def ungated(api, name):
    p = api.get("Pod", "default", name)
    return None if p["spec"].get("schedulingGates") else p


def placed_condition(api, name):
    st = api.get("Pod", "default", name).get("status") or {}
    return next((c for c in st.get("conditions") or () if c["type"] == "hamid.io/Placed" and c["status"] == "False"),
                None)


def test_the_leader_never_places_a_device_plugin_pod_on_a_dra_gpu(tmp_path, api_server):
    env = ClusterEnv(tmp_path / "c", api_server, nodes=1, simulate="H100:2", split=4, dra="0",
                     strategy="cdi-cri").start()
    try:
        api, node = env.api, env.nodes[0]
        env.leader()
        names = [f"p{i}" for i in range(3)]
        for n in names:  # spread over two idle GPUs: without DRA the first goes to GPU 0
            api.create(gated_pod(n, 1000))
        placed = {n: wait_for(f"{n} placed", lambda n=n: ungated(api, n)) for n in names}
        for n, p in placed.items():
            assert p["metadata"]["annotations"]["hami.io/vgpu-node"] == node.node
            api.do_bind("default", n, {"target": {"kind": "Node", "name": node.node}})
            bound = api.get("Pod", "default", n)
            got = node.kubelet.admit(bound)
            assert got.admitted, got.message
            cfg = node.kubelet.start_container(bound, "main")
            (dev,) = node.limits_of(cfg).devices
            assert dev.memory_bytes >> 20 == 1000
        booked = {d["index"] for r in node.reservations() if r["owner"].startswith("pod:")
                  for c in r["decision"]["containers"] for d in c["devices"]}
        assert booked == {1}, node.reservations()

        # two GPUs: only one serves the device plugin, so the pod stays gated, saying why
        api.create(gated_pod("two", 1000, gpus=2))
        cond = wait_for("two refused", lambda: placed_condition(api, "two"))
        assert cond["message"].startswith("0/1 nodes are available"), cond["message"]
        assert "GPU serves DRA (draDevices)" in cond["message"], cond["message"]
        assert api.get("Pod", "default", "two")["spec"].get("schedulingGates")
    finally:
        env.stop()
