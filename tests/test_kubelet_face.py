"""The kubelet face's own logic, in process (no daemon, no kubelet): what a gRPC call costs it.

GetPreferredAllocation is asked for every container kubelet admits. It reads
the reservations still waiting for their devices, and only those: on a node
holding a hundred pods it decoded all of them per call (2-3 ms at 100 pods,
run beside the PreStartContainer calls of other pods).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

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


def test_allocate_mounts_and_device_nodes_are_what_realize_gives_the_same_share(tmp_path):
    """Allocate answers before the pod is known; realize builds the Docker path's edits and
    PreStartContainer's CDI spec. A shim share of the same GPU and slot gets the same mounts and
    device nodes from both (one builder), and a node without the shim is refused by both alike."""
    from hamid.kubelet.admission import AdmissionError
    from hamid.kubelet.devices import slot_of
    from hamid.ledger import Details
    from hamid.node.realize import RealizeError, realize

    d = make_node(tmp_path / "state", simulate="H100:2")
    try:
        face = KubeletFace(d.service, kubelet_dir=str(tmp_path / "kubelet"), resource="nvidia.com/gpu",
                           strategy="envvar", cdi_dir=str(tmp_path / "cdi"), defaults=request_defaults(d), api=None)
        gpu = d.ledger.view().gpus[1].uuid
        ids = (device_id(gpu, 3),)
        resp = face.admission.allocate(ids)
        res = d.ledger.reserve(parse_docker_env({"HAMI_VGPU_SPEC": "mem=1g", "HAMI_VISIBLE_DEVICES": "1"}, "c"),
                               owner=Owner("pod", "p1", name="ns/p1"))
        name = res.decision.containers[0].name
        res = d.ledger.update(res.owner, details=Details(container_slots={name: slot_of(ids)}))
        edits = realize(res, d.core.facts, name)
        assert [(m.container_path, m.host_path, m.read_only) for m in resp.mounts] == \
            [(m.container_path, m.host_path, m.readonly) for m in edits.mounts]
        assert [(n.container_path, n.host_path, n.permissions) for n in resp.devices] == \
            [(n.path, n.host_path, n.permissions) for n in edits.device_nodes]
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == gpu

        d.core.facts = replace(d.core.facts, shim_library=None)  # a node whose shim is missing
        face = KubeletFace(d.service, kubelet_dir=str(tmp_path / "kubelet"), resource="nvidia.com/gpu",
                           strategy="envvar", cdi_dir=str(tmp_path / "cdi"), defaults=request_defaults(d), api=None)
        with pytest.raises(RealizeError) as docker_side:
            realize(res, d.core.facts, name)
        with pytest.raises(AdmissionError) as kubelet_side:
            face.admission.allocate((device_id(gpu, 4),))
        assert str(kubelet_side.value) == str(docker_side.value)
    finally:
        d.close()
