"""The DRA face's parts in process: the pool it publishes (validated by the API server
stand-in's resource.k8s.io/v1 rules), how a claim's allocation is read, and the gRPC services
under both package names."""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace

import grpc
import pytest
import trio

from apiserver.dra import _claim_validate, _slice_validate
from hamid.daemon.service import request_defaults
from hamid.dra import names
from hamid.dra.api import dra_pb2 as pb
from hamid.dra.api import pluginregistration_pb2 as reg_pb
from hamid.dra.api import pluginregistration_pb2_grpc as reg_grpc
from hamid.dra.claims import ClaimError, parse_claim
from hamid.dra.face import DraFace, semver
from hamid.dra.prepare import claim_plan
from hamid.dra.slices import GpuFacts, pool
from hamid.node.dragpus import DraDevicesError, dra_gpus
from hamid.node.identity import Owner
from nodeharness import make_node


@pytest.fixture
def node(tmp_path):
    d = make_node(tmp_path / "state", simulate="H100:2", draDevices="all")
    yield d
    d.close()


def _claim(results, config=(), uid="u1"):
    return {"metadata": {"namespace": "ns", "name": "c", "uid": uid},
            "status": {"allocation": {"devices": {"results": list(results), "config": list(config)}}}}


def _result(**kw):
    return {"request": "gpu", "driver": names.DRIVER, "pool": "node-t", "device": "gpu-0", **kw}


def test_published_slices_pass_the_api_servers_validation(tmp_path):
    shared = make_node(tmp_path / "a", simulate="H100:8")
    mig = make_node(tmp_path / "b", simulate="H100:8", mode="mig")
    try:
        for d in (shared, mig):
            gpus = d.ledger.view().gpus
            why = "XID 79: the GPU fell off the bus"  # a taint's value must be a label value: made one
            facts = [GpuFacts(view=g, health_reason="" if g.index else why) for g in gpus]
            slices = pool(facts, driver_version=semver("580.95.05")).slices("node-t", 3)
            for s in slices:
                assert _slice_validate(s) == [], s["metadata"]["name"]
                assert s["spec"]["pool"]["resourceSliceCount"] == len(slices)
        mig_slices = pool([GpuFacts(view=g) for g in mig.ledger.view().gpus]).slices("node-t", 1)
        assert len(mig_slices) > 2  # 8 GPUs' placements need more than 64 devices: split, counters apart
        assert sum(len(s["spec"].get("sharedCounters") or []) for s in mig_slices) == 8
    finally:
        shared.close()
        mig.close()


def test_the_pool_is_net_of_the_other_faces_and_taints_an_unhealthy_gpu(node):
    g0, g1 = node.ledger.view().gpus
    p = pool([GpuFacts(view=g0, foreign_mem_mib=1000, foreign_cores=30, health_reason="XID 79"),
              GpuFacts(view=g1, foreign_cores=100, foreign_exclusive=True)], default_mem_mib=4096, default_cores=10)
    assert [d["name"] for d in p.devices] == ["gpu-0"]
    assert p.left_out == {g1.uuid: "another face holds all its compute"}
    d = p.devices[0]
    assert d["capacity"]["memory"]["value"] == f"{g0.mem_total - 1000}Mi"
    assert d["capacity"]["memory"]["requestPolicy"]["default"] == "4096Mi"
    assert d["capacity"]["cores"]["value"] == "70"
    assert d["capacity"]["cores"]["requestPolicy"] == {"default": "10", "validRange": {"min": "0", "max": "70",
                                                                                        "step": "1"}}
    assert d["taints"] == [{"key": "gpu.hamid.io/unhealthy", "value": "XID-79", "effect": "NoSchedule"}]


def test_a_claims_allocation_is_read_strictly():
    cfg = {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": names.DRIVER, "parameters": {
        "apiVersion": "gpu.hamid.io/v1alpha1", "kind": "GpuConfig", "priority": 0, "corePolicy": "force"}}}
    got = parse_claim(_claim([_result(shareID="s1", consumedCapacity={"memory": "4Gi", "cores": "20"})], [cfg]),
                      node="node-t", uid="u1")
    d = got.devices[0]
    assert (d.memory_bytes, d.cores, d.share_id, d.config.priority, d.config.core_policy) == \
        (4 << 30, 20, "s1", 0, "force")
    other = parse_claim(_claim([_result(driver="gpu.nvidia.com")]), node="node-t", uid="u1")
    assert other.devices == ()  # another driver's results are not ours to prepare
    with pytest.raises(ClaimError, match="UID 'u1' at the API server, kubelet asked for 'u2'"):
        parse_claim(_claim([_result()]), node="node-t", uid="u2")
    with pytest.raises(ClaimError, match="adminAccess is not supported"):
        parse_claim(_claim([_result(adminAccess=True)]), node="node-t", uid="u1")
    with pytest.raises(ClaimError, match="pool 'node-x' is not this node's"):
        parse_claim(_claim([_result(pool="node-x")]), node="node-t", uid="u1")
    bad = {**cfg, "opaque": {"driver": names.DRIVER, "parameters": {"apiVersion": "gpu.hamid.io/v1alpha1",
                                                                     "kind": "GpuConfig", "limit": 3}}}
    with pytest.raises(ClaimError, match="unknown field 'limit'; accepted: apiVersion, kind, priority, corePolicy"):
        parse_claim(_claim([_result()], [bad]), node="node-t", uid="u1")
    with pytest.raises(ClaimError, match="more than 100"):
        parse_claim(_claim([_result(consumedCapacity={"cores": "150"})]), node="node-t", uid="u1")


def test_a_claim_on_a_gpu_that_does_not_serve_dra_is_refused(node):
    gpus = node.ledger.view().gpus
    alloc = parse_claim(_claim([_result(device="gpu-1", consumedCapacity={"memory": "1Gi"})]), node="node-t",
                        uid="u1")
    with pytest.raises(ClaimError, match="GPU 1 .* does not serve DRA"):
        claim_plan(alloc, gpus, frozenset({gpus[0].uuid}), "node-t")
    with pytest.raises(ClaimError, match="device 'gpu-9' is not in this node's pool"):
        claim_plan(replace(alloc, devices=(replace(alloc.devices[0], device="gpu-9"),)), gpus,
                   frozenset(g.uuid for g in gpus), "node-t")
    req, decision = claim_plan(alloc, gpus, frozenset({gpus[1].uuid}), "node-t")
    assert req.containers[0].gpu.mem_mib == 1024 and req.containers[0].gpu.devices == (gpus[1].uuid,)
    (dev,) = decision.containers[0].devices
    assert (dev.uuid, dev.mem_mib, dev.cores, dev.mps) == (gpus[1].uuid, 1024, 0, False)


def test_dra_devices_names_gpus_of_this_node(node):
    gpus = node.ledger.view().gpus
    assert dra_gpus("", gpus) == frozenset()
    assert dra_gpus("all", gpus) == {g.uuid for g in gpus}
    assert dra_gpus(f"1, {gpus[0].uuid}", gpus) == {g.uuid for g in gpus}
    with pytest.raises(DraDevicesError, match="'7' is not a GPU of this node; accepted: all, or indexes \\(0, 1\\)"):
        dra_gpus("0,7", gpus)


def test_the_api_server_refuses_a_malformed_slice_and_claim():
    base = {"spec": {"driver": names.DRIVER, "nodeName": "n", "pool": {"name": "n", "generation": 1,
                                                                       "resourceSliceCount": 1}}}
    dev = {"name": "gpu-0", "allowMultipleAllocations": True, "capacity": {"cores": {
        "value": "100", "requestPolicy": {"default": "7", "validRange": {"min": "2", "step": "2"}}}}}
    causes = _slice_validate({"spec": {**base["spec"], "devices": [dev], "sharedCounters": [
        {"name": "c", "counters": {"x": {"value": "1"}}}]}})
    assert ("FieldValueInvalid", "spec", "Invalid value: only one of `devices` or `sharedCounters` may be set") \
        in causes
    assert any(c[1] == "spec.devices[0].capacity[cores].requestPolicy.default" for c in causes)
    claim = {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x", "count": 0}}]}}}
    assert [c[1] for c in _claim_validate(claim)] == ["spec.devices.requests[0].exactly.count"]


def test_both_service_versions_answer_and_every_claim_gets_an_entry(node):
    """v1 and v1beta1 DRAPlugin on one socket; registration names both; a claim that cannot be
    read gets its own error, the call itself succeeds (kubelet drops a whole answer on a gRPC error)."""
    kdir = tempfile.mkdtemp(prefix="hk-")
    face = DraFace(node.service, kubelet_dir=kdir, cdi_dir=os.path.join(kdir, "cdi"), api=None, devices="all",
                   defaults=request_defaults(node))

    def calls():
        reg = os.path.join(kdir, "plugins_registry", "gpu.hamid.io-reg.sock")
        with grpc.insecure_channel(f"unix:{reg}") as ch:
            info = reg_grpc.RegistrationStub(ch).GetInfo(reg_pb.InfoRequest(), timeout=10)
        assert (info.type, info.name) == ("DRAPlugin", "gpu.hamid.io")
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
                                                 "v1alpha1.DRAResourceHealth"]
        assert oct(os.stat(info.endpoint).st_mode & 0o777) == "0o600"
        out = []
        with grpc.insecure_channel(f"unix:{info.endpoint}") as ch:
            for version in ("v1", "v1beta1"):
                service = f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
                call = ch.unary_unary(f"/{service}/NodePrepareResources",
                                      request_serializer=pb.NodePrepareResourcesRequest.SerializeToString,
                                      response_deserializer=pb.NodePrepareResourcesResponse.FromString)
                out.append(call(pb.NodePrepareResourcesRequest(claims=[
                    pb.Claim(namespace="ns", name="c", uid="u1"), pb.Claim(namespace="ns", name="d", uid="u2"),
                    pb.Claim(namespace="..", name="x/../../nodes", uid="u3")]), timeout=10))
        return out

    async def main():
        async with trio.open_nursery() as n:
            await n.start(face.run)
            got = await trio.to_thread.run_sync(calls)
            n.cancel_scope.cancel()
        return got

    for resp in trio.run(main):
        assert set(resp.claims) == {"u1", "u2", "u3"}
        assert "no API server to read the claim from" in resp.claims["u1"].error
        assert "not a namespace and object name" in resp.claims["u3"].error  # never part of a URL


def test_a_claims_share_is_labelled_by_its_namespace_and_name_in_metrics(node):
    from hamid.metrics.exporter import owner_labels
    from hamid.node.identity import Owner

    gpus = node.ledger.view().gpus
    alloc = parse_claim(_claim([_result(consumedCapacity={"memory": "1Gi", "cores": "10"})]), node="node-t",
                        uid="u1")
    req, decision = claim_plan(alloc, gpus, frozenset(g.uuid for g in gpus), "node-t")
    res = node.core.commit(Owner("claim", "u1", name="ns/c"), decision, request=req)
    assert owner_labels(res) == ("ns", "c")


def test_the_protos_carry_kubelets_wire_facts():
    """Field numbers and types of kubelet's dra/v1 and pluginregistration/v1, as kubernetes/kubelet's
    api.proto files give them: a wrong number here would make kubelet read another field."""
    from google.protobuf.descriptor import FieldDescriptor as F

    def shape(msg):
        return {f.name: (f.number, f.type, f.is_repeated) for f in msg.DESCRIPTOR.fields}

    S, B = F.TYPE_STRING, F.TYPE_BOOL
    assert shape(pb.Claim) == {"namespace": (1, S, False), "uid": (2, S, False), "name": (3, S, False)}
    assert shape(pb.Device) == {"request_names": (1, S, True), "pool_name": (2, S, False),
                                "device_name": (3, S, False), "cdi_device_ids": (4, S, True),
                                "share_id": (5, S, False)}
    assert shape(pb.NodePrepareResourceResponse) == {"devices": (1, F.TYPE_MESSAGE, True), "error": (2, S, False)}
    assert shape(pb.NodeUnprepareResourceResponse) == {"error": (1, S, False)}
    for m in (pb.NodePrepareResourcesRequest, pb.NodeUnprepareResourcesRequest, pb.NodePrepareResourcesResponse,
              pb.NodeUnprepareResourcesResponse):
        assert list(shape(m)) == ["claims"] and shape(m)["claims"][0] == 1
    assert pb.NodePrepareResourcesResponse.DESCRIPTOR.fields_by_name["claims"].message_type.GetOptions().map_entry
    assert shape(reg_pb.PluginInfo) == {"type": (1, S, False), "name": (2, S, False), "endpoint": (3, S, False),
                                        "supported_versions": (4, S, True)}
    assert shape(reg_pb.RegistrationStatus) == {"plugin_registered": (1, B, False), "error": (2, S, False)}
    # kubelet's generated client calls /k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources
    assert pb.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert reg_pb.DESCRIPTOR.services_by_name["Registration"].full_name == "pluginregistration.Registration"


def test_the_pool_is_what_the_other_faces_left_as_the_ledger_counts_it(node):
    """A pod's init container and app container never run together: the ledger counts the larger,
    and so does the pool; a claim's own share is left to the scheduler (not subtracted again)."""
    from hamid.node.identity import Owner
    from hamid.request.model import ContainerRequest, GpuRequest, Request

    gpus = node.ledger.view().gpus
    face = DraFace(node.service, kubelet_dir=tempfile.mkdtemp(prefix="hk-"), cdi_dir=tempfile.mkdtemp(), api=None,
                   devices="all", defaults=request_defaults(node))
    face.gpus = frozenset(g.uuid for g in gpus)
    g0 = gpus[0]
    pin = (g0.uuid,)
    pod = Request(owner="pod:ns/p", containers=(
        ContainerRequest("init", init=True, gpu=GpuRequest(mem_mib=10240, mem_percent=None, cores=20, devices=pin)),
        ContainerRequest("main", gpu=GpuRequest(mem_mib=10240, mem_percent=None, cores=20, devices=pin))))
    node.ledger.reserve(pod, owner=Owner("pod", "p1", name="ns/p"), prepare=lambda r: True)
    alloc = parse_claim(_claim([_result(consumedCapacity={"memory": "4Gi", "cores": "10"})]), node="node-t", uid="u1")
    req, decision = claim_plan(alloc, gpus, face.gpus, "node-t")
    node.core.commit(Owner("claim", "u1", name="ns/c"), decision, request=req)
    d = next(x for x in face.pool_now().devices if x["name"] == "gpu-0")
    assert d["capacity"]["memory"]["value"] == f"{g0.mem_total - 10240}Mi"
    assert d["capacity"]["cores"]["value"] == "80"


def test_a_device_allocated_without_consumed_capacity_books_the_whole_gpu(node):
    """A cluster whose consumable-capacity gate is off (1.34, 1.35 by default) allocates the device
    whole and records no consumedCapacity: the ledger books all of it, so no other face shares it."""
    gpus = node.ledger.view().gpus
    alloc = parse_claim(_claim([_result()]), node="node-t", uid="u1")
    _, decision = claim_plan(alloc, gpus, frozenset(g.uuid for g in gpus), "node-t")
    (dev,) = decision.containers[0].devices
    assert (dev.mem_mib, dev.cores) == (gpus[0].mem_total, 100)


def test_dra_devices_are_checked_when_the_daemon_starts(tmp_path, kubeconfig):
    from hamid.daemon.service import build_faces
    from hamid.errors import HamidError

    d = make_node(tmp_path / "a", simulate="H100:2", draDevices="all")
    try:
        with pytest.raises(HamidError, match="draDevices is set, but DRA needs Kubernetes"):
            trio.run(build_faces, d)
    finally:
        d.close()
    # the node's capacity says which GPUs serve DRA: a GPU it does not have stops the daemon there
    with pytest.raises(HamidError, match="'5' is not a GPU of this node"):
        make_node(tmp_path / "b", simulate="H100:2", draDevices="0,5", kubeconfig=kubeconfig, controlMode="none")


def test_kubelets_health_stream_says_each_devices_health_and_every_change(node):
    from hamid.dra.api import drahealth_pb2 as hpb

    kdir = tempfile.mkdtemp(prefix="hk-")
    face = DraFace(node.service, kubelet_dir=kdir, cdi_dir=os.path.join(kdir, "cdi"), api=None, devices="1",
                   defaults=request_defaults(node), health_interval=0.05)

    def watch():
        endpoint = os.path.join(kdir, "plugins", "gpu.hamid.io", "dra.sock")
        got = []
        with grpc.insecure_channel(f"unix:{endpoint}") as ch:
            for service in ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"):
                call = ch.unary_stream(f"/{service}/NodeWatchResources",
                                       request_serializer=hpb.NodeWatchResourcesRequest.SerializeToString,
                                       response_deserializer=hpb.NodeWatchResourcesResponse.FromString)
                stream = call(hpb.NodeWatchResourcesRequest(), timeout=20)
                first = next(stream)
                node.backend.set_healthy(1, False)
                changed = next(m for m in stream if m.devices[0].health == hpb.UNHEALTHY)
                node.backend.set_healthy(1, True)
                next(m for m in stream if m.devices[0].health == hpb.HEALTHY)  # and back
                stream.cancel()
                got.append((first, changed))
        return got

    async def main():
        async with trio.open_nursery() as n:
            await n.start(face.run)
            got = await trio.to_thread.run_sync(watch)
            n.cancel_scope.cancel()
        return got

    for first, changed in trio.run(main):
        (d,) = first.devices  # GPU 1 alone serves DRA here
        assert (d.device.pool_name, d.device.device_name, d.health) == ("node-t", "gpu-1", hpb.HEALTHY)
        assert d.health_check_timeout_seconds == 30 and d.last_updated_time > 0
        assert changed.devices[0].message == "the device backend reports the GPU unhealthy"


def test_docker_admission_takes_the_device_plugins_gpus_and_a_dra_gpu_only_when_named(tmp_path):
    """docs/dra.md: a GPU of draDevices is DRA's. A Docker container that names no GPU is placed on the
    others only; one that names a DRA GPU (HAMI_VISIBLE_DEVICES) is booked there in the one ledger
    (the slice shrinks); on a node whose GPUs all serve DRA, one that names none is refused, saying why."""
    from hamid.ledger.details import Details
    from hamid.node.service import LedgerConflict
    from hamid.placement.reasons import NOT_CONFIGURED, refusal_headline

    def admit(d, cid, *env):
        got = d.core.admit_container(cid, list(env), user=(0, 0), details=Details(), defaults=request_defaults(d))
        return {dev.index for c in got.reservation.decision.containers for dev in c.devices}

    d = make_node(tmp_path / "a", simulate="H100:2", draDevices="0")
    try:
        for i in range(3):  # spread over two idle GPUs would take GPU 0 first
            assert admit(d, f"{i}" * 64, "HAMI_VGPU_SPEC=mem=1g") == {1}
        assert admit(d, "a" * 64, "HAMI_VGPU_SPEC=mem=1g", "HAMI_VISIBLE_DEVICES=0") == {0}
        assert admit(d, "b" * 64, "HAMI_VGPU_SPEC=mem=1g", "HAMI_VISIBLE_DEVICES=all") == {1}
    finally:
        d.close()
    d = make_node(tmp_path / "b", simulate="H100:2", draDevices="all")
    try:
        with pytest.raises(LedgerConflict) as e:
            admit(d, "c" * 64, "HAMI_VGPU_SPEC=mem=1g")
        assert "GPU 0 serves DRA (draDevices)" in str(e.value), str(e.value)
        assert refusal_headline(e.value.reasons) == NOT_CONFIGURED
        assert admit(d, "d" * 64, "HAMI_VGPU_SPEC=mem=1g", "HAMI_VISIBLE_DEVICES=1") == {1}
    finally:
        d.close()


def test_hamis_register_annotation_leaves_the_dra_gpus_out(tmp_path):
    """HAMi's scheduler places device-plugin pods from hami.io/node-nvidia-register: a DRA GPU there
    would be handed to one."""
    from hamid.kubelet.register import register_devices

    d = make_node(tmp_path / "a", simulate="H100:3", draDevices="1")
    try:
        views = list(d.ledger.view().gpus)
        got = register_devices(views, {g.uuid: g for g in d.backend.gpus()})
        assert [x["id"] for x in got] == [views[0].uuid, views[2].uuid]
    finally:
        d.close()


def test_status_and_the_cluster_rows_say_which_gpus_serve_dra(tmp_path):
    from hamid.cli.render import status_table
    from hamid.cluster.capacity import doc_from_view, gpu_rows

    d = make_node(tmp_path / "a", simulate="H100:2", draDevices="1")
    try:
        doc = d.core.status("test")
        assert [g["dra"] for g in doc["gpus"]] == [False, True]
        rows = status_table(doc).splitlines()
        gpu_lines = [r for r in rows if "H100" in r]
        assert not gpu_lines[0].rstrip().endswith("dra") and gpu_lines[1].rstrip().endswith("dra"), rows
        assert [g["dra"] for g in gpu_rows(doc_from_view(d.ledger.view(), 1))] == [False, True]
    finally:
        d.close()


def _two(mem0="10Gi", cores0="20", mem1="30Gi", cores1="40", config=(), uid="u2"):
    return parse_claim(_claim([_result(request="small", device="gpu-0", consumedCapacity={"memory": mem0, "cores": cores0}),
                               _result(request="large", device="gpu-1", consumedCapacity={"memory": mem1, "cores": cores1})],
                              config=config, uid=uid), node="node-t", uid=uid)


def test_a_claim_of_two_devices_is_one_container_the_ledger_rechecks_device_by_device(node):
    """Both devices in one container, each with what it consumed; the typed request cannot say two
    amounts, so the ledger's re-check takes the decision's: GPU 1's 30 GiB is what is checked there,
    and a claim wanting more than GPU 1 has left is refused naming GPU 1, though GPU 0 has room."""
    from hamid.node.identity import Owner
    from hamid.node.realize import limits_of
    from hamid.ledger import LedgerConflict

    gpus = node.ledger.view().gpus
    req, decision = claim_plan(_two(), gpus, frozenset(g.uuid for g in gpus), "node-t")
    (c,) = decision.containers
    assert [(d.uuid, d.mem_mib, d.cores) for d in c.devices] == [(gpus[0].uuid, 10240, 20), (gpus[1].uuid, 30720, 40)]
    (cr,) = req.containers
    assert cr.name == c.name and cr.gpu.count == 2 and cr.gpu.mem_mib is None  # no one amount for both
    res = node.core.commit(Owner("claim", "u2", name="ns/c"), decision, request=req)
    lim = limits_of(res, c.name, "default")
    assert [(d.uuid, d.memory_bytes >> 20, d.sm_percent) for d in lim.devices] == \
        [(gpus[0].uuid, 10240, 20), (gpus[1].uuid, 30720, 40)]
    left1 = gpus[1].mem_total - 30720
    req3, dec3 = claim_plan(_two(mem0="1Gi", mem1=f"{left1 + 1}Mi", cores0="1", cores1="1", uid="u3"), gpus,
                            frozenset(g.uuid for g in gpus), "node-t")
    with pytest.raises(LedgerConflict) as e:
        node.core.commit(Owner("claim", "u3", name="ns/c3"), dec3, request=req3)
    assert "GPU 1" in str(e.value) and "GPU 0" not in str(e.value)
    req4, dec4 = claim_plan(_two(mem0="1Gi", mem1=f"{left1}Mi", cores0="1", cores1="1", uid="u4"), gpus,
                            frozenset(g.uuid for g in gpus), "node-t")
    node.core.commit(Owner("claim", "u4", name="ns/c4"), dec4, request=req4)  # exactly what is left: fits


def test_what_one_containers_edits_cannot_say_is_refused_naming_the_claim(node):
    gpus = node.ledger.view().gpus
    every = frozenset(g.uuid for g in gpus)
    twice = parse_claim(_claim([_result(request="a", consumedCapacity={"memory": "1Gi"}),
                                _result(request="b", consumedCapacity={"memory": "2Gi"})]), node="node-t", uid="u1")
    with pytest.raises(ClaimError, match="claim ns/c: 2 devices, gpu-0 and gpu-0 on the same GPU 0"):
        claim_plan(twice, gpus, every, "node-t")
    cfg = {"opaque": {"driver": names.DRIVER, "parameters": {"apiVersion": names.CONFIG_API_VERSION,
                                                             "kind": names.CONFIG_KIND, "priority": 0}},
           "requests": ["small"]}
    with pytest.raises(ClaimError, match=r"claim ns/c: its 2 devices have different GpuConfig \(small: priority 0"):
        claim_plan(_two(config=[cfg]), gpus, every, "node-t")
    cfg["requests"] = []  # the same config for both: one priority
    req, _ = claim_plan(_two(config=[cfg]), gpus, every, "node-t")
    assert req.containers[0].gpu.priority == 0


def test_prepare_answers_one_cdi_device_and_keeps_a_claim_prepared_one_container_per_device(node):
    """The claim's one CDI device goes on its first device (kubelet gives a container the CDI ids of
    every device of the claim it references); a repeat answers the same; a claim an earlier version
    prepared as one container per device is answered as it was (its pods run with those edits),
    matches the same allocation, and unprepares."""
    from hamid.node.identity import Owner
    from hamid.placement.result import ContainerAssignment, Decision

    cdi = tempfile.mkdtemp()
    face = DraFace(node.service, kubelet_dir=tempfile.mkdtemp(prefix="hk-"), cdi_dir=cdi, api=None,
                   devices="all", defaults=request_defaults(node))
    gpus = node.ledger.view().gpus
    face.gpus = frozenset(g.uuid for g in gpus)
    kind = names.CDI_KIND
    got = face.preparer.prepare(_two(), face.gpus)
    assert [(d.device, d.cdi_ids) for d in got] == [("gpu-0", (f"{kind}=u2-d0",)), ("gpu-1", ())]
    assert face.preparer.prepare(_two(), face.gpus) == got
    with pytest.raises(ClaimError, match="prepared here with another allocation"):
        face.preparer.prepare(_two(mem1="31Gi"), face.gpus)

    old = _two(uid="u9")
    req, dec = claim_plan(old, gpus, face.gpus, "node-t")
    per_device = Decision(dec.node, tuple(ContainerAssignment(f"d{i}", False, (d,))
                                          for i, d in enumerate(dec.containers[0].devices)))
    node.core.commit(Owner("claim", "u9", name="ns/c"), per_device, request=None)
    got = face.preparer.prepare(old, face.gpus)
    assert [d.cdi_ids for d in got] == [(f"{kind}=u9-d0",), (f"{kind}=u9-d1",)]
    spec = os.path.join(cdi, f"{names.DRIVER}-claim-u9.json")
    assert os.path.exists(spec)
    trio.run(face.unprepare, [pb.Claim(namespace="ns", name="c", uid="u9")])
    assert node.ledger.get("claim:u9") is None and not os.path.exists(spec)


def test_a_claim_of_two_mig_instances_is_one_container_on_two_gpus_and_refused_on_one(tmp_path):
    d = make_node(tmp_path / "state", simulate="H100:2", draDevices="all", mode="mig")
    try:
        gpus = d.ledger.view().gpus
        every = frozenset(g.uuid for g in gpus)

        def alloc(*devices):
            return parse_claim(_claim([_result(request=f"r{i}", device=n) for i, n in enumerate(devices)]),
                               node="node-t", uid="u1")
        req, dec = claim_plan(alloc("gpu-0-mig-1g-10gb-0", "gpu-1-mig-3g-40gb-4"), gpus, every, "node-t")
        (c,) = dec.containers
        assert [(x.uuid, x.mig_profile, x.mig_placement.start) for x in c.devices] == \
            [(gpus[0].uuid, "1g.10gb", 0), (gpus[1].uuid, "3g.40gb", 4)]
        assert req.containers[0].gpu.wants_mig and req.containers[0].gpu.mig_profile is None  # two profiles
        d.core.commit(Owner("claim", "u1", name="ns/c"), dec, request=req)
        with pytest.raises(ClaimError, match="claim ns/c: 2 devices, gpu-0-mig-1g-10gb-0 and gpu-0-mig-1g-10gb-1 "
                                             "on the same GPU 0; one claim takes each GPU once"):
            claim_plan(alloc("gpu-0-mig-1g-10gb-0", "gpu-0-mig-1g-10gb-1"), gpus, every, "node-t")
    finally:
        d.close()
