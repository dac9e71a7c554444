"""The kubelet face's own logic, in process (no daemon, no kubelet): what a gRPC call costs it.

GetPreferredAllocation is asked for every container kubelet admits. It reads
the reservations still waiting for their devices, and only those: on a node
holding a hundred pods it decoded all of them per call (2-3 ms at 100 pods,
run beside the PreStartContainer calls of other pods).
"""

from __future__ import annotations

import hamid.ledger.store as store
from hamid.daemon.service import request_defaults
from hamid.kubelet.devices import device_id
from hamid.kubelet.face import KubeletFace
from hamid.node.identity import Owner
from hamid.request import parse_docker_env
from nodeharness import make_node


def test_preferred_allocation_reads_only_the_waiting_pods(tmp_path, monkeypatch):
    d = make_node(tmp_path / "state", simulate="H100:2", deviceSplitCount=40)
    try:
        face = KubeletFace(d.service, kubelet_dir=str(tmp_path / "kubelet"), resource="nvidia.com/gpu",
                           strategy="envvar", cdi_dir=str(tmp_path / "cdi"), defaults=request_defaults(d), api=None)
        gpus = [g.uuid for g in d.ledger.view().gpus]
        for i in range(30):  # running pods on GPU 1
            env = {"HAMI_VGPU_SPEC": "mem=100m", "HAMI_VISIBLE_DEVICES": "1"}
            d.ledger.reserve(parse_docker_env(env, f"r{i}"), owner=Owner("pod", f"run{i}", name=f"ns/run{i}"),
                             prepare=lambda r: True)
        # one pod placed on GPU 0 waits for kubelet's devices: GPU 0 has less free memory, yet is preferred
        env = {"HAMI_VGPU_SPEC": "mem=60g", "HAMI_VISIBLE_DEVICES": "0"}
        d.ledger.reserve(parse_docker_env(env, "w"), owner=Owner("pod", "wait", name="ns/wait"))
        free = {g.uuid: g.mem_total - g.mem_used for g in d.ledger.view().gpus}
        assert free[gpus[0]] < free[gpus[1]]
        decoded = []
        real_row = store._row
        monkeypatch.setattr(store, "_row", lambda r: decoded.append(r["owner"]) or real_row(r))
        available = tuple(device_id(g, n) for g in reversed(gpus) for n in range(5, 10))
        got = face._preferred(available, (), 1)
        assert got == [device_id(gpus[0], 5)]
        assert decoded == ["pod:wait"]  # the running pods' rows are not read
    finally:
        d.close()


def test_a_pod_read_from_the_api_server_is_its_json_as_the_watch_holds_it(tmp_path, api_server, kubeconfig):
    """A pod the node's watch does not hold yet is read from the API server: as the server sent it
    (creationTimestamp as its RFC 3339 string, the same dict the watch holds), None when there is
    none."""
    from hamid.kube.client import api_client
    from hamid.kubelet.pods import PodDirectory

    api = api_client(kubeconfig)
    pods = PodDirectory("node-a", str(tmp_path), "nvidia.com/gpu", api)
    api_server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}})
    made = api_server.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
                              "spec": {"nodeName": "node-a", "containers": [{"name": "main", "image": "x"}]}})
    got = pods.get_pod("ns", "p")
    assert got == api_server.get("Pod", "ns", "p") == made
    assert isinstance(got["metadata"]["creationTimestamp"], str) and got["metadata"]["creationTimestamp"].endswith("Z")
    assert pods.get_pod("ns", "nope") is None
