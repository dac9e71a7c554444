"""hamid as kubelet's device plugin: real gRPC on real unix sockets, a real
``hamid run`` process, the kubelet and API-server stand-ins of tests/k8s.

Every container gets exactly its own pod's share, tied to the pod by UID,
whatever device IDs kubelet chose and in whatever order it admits pods.
"""

from __future__ import annotations

import random
import time

import pytest

from kubelet import StartContainerError
from nodeenv import RESOURCE, NodeEnv, mib

pytestmark = pytest.mark.slow


@pytest.fixture
def node(tmp_path, api_server):
    env = NodeEnv(tmp_path / "n", api_server).start()
    yield env
    env.stop()


def _gpu_pod(env, name, mem_mib, cores=0, gpus=1, **kw):
    limits = {RESOURCE: gpus, "nvidia.com/gpumem": mem_mib}
    if cores:
        limits["nvidia.com/gpucores"] = cores
    return env.pod(name, [{"name": "main", "limits": limits}], **kw)


def test_registers_lists_devices_and_a_vgpu_pod_gets_its_limits(node):
    devs = node.kubelet.devices(RESOURCE)
    assert len(devs) == 20 and all(d.health == "Healthy" for d in devs.values())
    assert {d.numa_nodes for d in devs.values()} == {(0,), (1,)}  # each GPU's NUMA node as topology
    pod = _gpu_pod(node, "web", 4096, cores=30)
    got = node.kubelet.admit(pod)
    assert got.admitted, got.message
    cfg = node.kubelet.start_container(pod, "main")
    lim = node.limits_of(cfg)
    (dev,) = lim.devices
    assert dev.memory_bytes == mib(4096) and dev.sm_percent == 30 and dev.slots
    gpu = cfg.env["NVIDIA_VISIBLE_DEVICES"]
    assert dev.uuid == gpu and [d.path for d in cfg.device_nodes] == []  # simulated GPUs have no nodes
    assert cfg.mount("/usr/local/vgpu/libvgpu.so").read_only and cfg.mount("/etc/ld.so.preload").read_only
    assert cfg.mount("/usr/local/vgpu/hamid.limits").read_only
    assert not cfg.mount("/run/hamid").read_only
    (res,) = node.reservations()
    assert res["owner"] == f"pod:{pod['metadata']['uid']}" and res["name"] == "default/web"
    assert res["decision"]["containers"][0]["devices"][0]["uuid"] == gpu  # the GPU kubelet's devices are on


def test_a_container_that_cannot_be_tied_to_a_pod_is_refused_and_never_runs_unlimited(node):
    ids = node.kubelet.free(RESOURCE)[:1]
    from hamid.kubelet.api import deviceplugin_pb2 as pb
    from hamid.kubelet.api import deviceplugin_pb2_grpc as pb_grpc
    import grpc

    sock = node.kubelet_dir / "device-plugins" / "hamid-nvidia.sock"
    with grpc.insecure_channel(f"unix:{sock}") as ch:
        stub = pb_grpc.DevicePluginStub(ch)
        resp = stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]))
        limits_path = next(m.host_path for m in resp.container_responses[0].mounts
                           if m.container_path == "/usr/local/vgpu/hamid.limits")
        assert open(limits_path, "rb").read() == b""  # the shim refuses CUDA on an empty limits file
        with pytest.raises(grpc.RpcError) as e:
            stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=ids))
    assert "cannot tie devices to a pod" in e.value.details() and "no pod on this node" in e.value.details()


def test_a_pod_that_does_not_fit_fails_to_start_with_the_reason_and_an_event(node, api_server):
    pod = _gpu_pod(node, "huge", 90000)  # more than an 80 GB H100 has
    assert node.kubelet.admit(pod).admitted
    with pytest.raises(StartContainerError) as e:
        node.kubelet.start_container(pod, "main")
    assert "does not fit" in str(e.value) and "90000" in str(e.value)
    events = [ev for ev in api_server.list("Event", "default") if ev["involvedObject"]["name"] == "huge"]
    assert events and events[0]["reason"] == "HamidAdmissionFailed"
    assert node.reservations() == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_swaps_fifty_pods_admitted_in_an_adversarial_order(tmp_path, api_server, seed):
    """50 pods, one GPU each, every one with its own memory and compute; kubelet picks device IDs at
    random and admits and starts them in a shuffled order with deletions in between: every container
    gets its own pod's limits, every time."""
    env = NodeEnv(tmp_path / "n", api_server, split=50, pick="random", seed=seed).start()
    try:
        rnd = random.Random(seed)
        want = {}
        pods = []
        for i in range(50):
            mem = 512 + 16 * i  # all different; 50 fit on two 80 GB GPUs
            cores = 1 + (i % 3)
            p = _gpu_pod(env, f"p{i}", mem, cores=cores)
            want[p["metadata"]["uid"]] = (mem, cores)
            pods.append(p)
        order = pods[:]
        rnd.shuffle(order)
        if seed == 2:
            order.reverse()
        admitted = []
        for n, p in enumerate(order):
            assert env.kubelet.admit(p).admitted
            admitted.append(p)
            if n % 7 == 6:  # interleave starts and deletions with admissions
                rnd.shuffle(admitted)
                victim = admitted.pop()
                cfg = env.kubelet.start_container(victim, "main")
                assert decode_limits(env, cfg) == want[victim["metadata"]["uid"]]
                env.delete(victim)
                del want[victim["metadata"]["uid"]]
        rnd.shuffle(admitted)
        for p in admitted:
            cfg = env.kubelet.start_container(p, "main")
            assert decode_limits(env, cfg) == want[p["metadata"]["uid"]], p["metadata"]["name"]
    finally:
        env.stop()


def decode_limits(env, cfg) -> tuple[int, int]:
    (d,) = env.limits_of(cfg).devices
    return d.memory_bytes >> 20, d.sm_percent


def test_a_deleted_pods_share_is_free_within_a_second_of_the_watch_event(node, api_server):
    pod = _gpu_pod(node, "short", 70000)
    assert node.kubelet.admit(pod).admitted
    node.kubelet.start_container(pod, "main")
    assert len(node.reservations()) == 1
    t0 = time.time()
    node.delete(pod)
    while node.reservations() and time.time() - t0 < 5:
        time.sleep(0.02)
    assert node.reservations() == [] and time.time() - t0 < 1.0


def _reserve_first(env, pods):
    """Reservations committed before kubelet sees the pods, as the leader commits them (here through the
    local API): kubelet's random device IDs then point at other GPUs than the ledger chose."""
    from hamid.localapi.client import LocalClient
    from hamid.request import parse_pod

    with LocalClient(env.state) as c:
        for p in pods:
            m = p["metadata"]
            c.reserve(parse_pod(p).to_dict(), "pod",
                      owner={"kind": "pod", "uid": m["uid"], "name": f"{m['namespace']}/{m['name']}"})


@pytest.mark.parametrize("strategy", ["envvar", "cdi-cri"])
def test_no_swaps_with_reservations_made_before_kubelet(tmp_path, api_server, strategy):
    env = NodeEnv(tmp_path / "n", api_server, split=50, pick="random", seed=7, strategy=strategy).start()
    try:
        rnd = random.Random(7)
        pods = [_gpu_pod(env, f"q{i}", 1024 + 32 * i, cores=1 + i % 2) for i in range(40)]
        want = {p["metadata"]["uid"]: (1024 + 32 * i, 1 + i % 2) for i, p in enumerate(pods)}
        _reserve_first(env, pods)
        placed = {r["owner"]: r["decision"]["containers"][0]["devices"][0]["uuid"] for r in env.reservations()}
        order = pods[:]
        rnd.shuffle(order)
        for p in order:
            assert env.kubelet.admit(p).admitted
        rnd.shuffle(order)
        for p in order:
            cfg = env.kubelet.start_container(p, "main")
            assert decode_limits(env, cfg) == want[p["metadata"]["uid"]]
            key = f"pod:{p['metadata']['uid']}"
            gpu = cfg.env["NVIDIA_VISIBLE_DEVICES"]
            if strategy == "cdi-cri":  # the ledger's GPU, whatever IDs kubelet picked
                assert gpu == placed[key] and cfg.cdi_devices
                assert cfg.env["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{want[p['metadata']['uid']][0]}m"
        now = {r["owner"]: r for r in env.reservations()}
        assert len(now) == 40 and all(r["details"]["container_slots"] for r in now.values())
        for gpu in {d["uuid"] for r in now.values() for d in r["decision"]["containers"][0]["devices"]}:
            booked = sum(d["mem_mib"] for r in now.values() for d in r["decision"]["containers"][0]["devices"]
                         if d["uuid"] == gpu)
            assert booked <= 81559
    finally:
        env.stop()
