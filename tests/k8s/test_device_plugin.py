"""hamid as kubelet's device plugin: real gRPC on real unix sockets, a real
``hamid run`` process, the kubelet and API-server stand-ins of tests/k8s.

Every container gets exactly its own pod's share, tied to the pod by UID,
whatever device IDs kubelet chose and in whatever order it admits pods.
"""

from __future__ import annotations

import os

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
    assert dev.memory_bytes == mib(4096) and dev.sm_percent == 30 and dev.slots == ()  # no time slots: the shim
    # limits by measured busy time
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


def test_a_deleted_pods_share_is_freed_by_the_watch_event(tmp_path, api_server):
    """With the reconciler at its default interval (30 s), so only the pod watch's delete event can
    free the share within a third of that (with the event ignored, the reconciler would, 30 s later):
    well under a second when quiet, with room for a busy machine."""
    from hamid.config.schema import Config

    node = NodeEnv(tmp_path / "n", api_server, reconcile_interval=Config().reconcileInterval).start()
    try:
        _deleted_pod_is_freed_by_its_event(node)
    finally:
        node.stop()


def _deleted_pod_is_freed_by_its_event(node):
    pod = _gpu_pod(node, "short", 70000)
    assert node.kubelet.admit(pod).admitted
    node.kubelet.start_container(pod, "main")
    assert len(node.reservations()) == 1
    t0 = time.time()
    node.delete(pod)
    while node.reservations() and time.time() - t0 < 10:
        time.sleep(0.02)
    print(f"the deleted pod's share was freed after {time.time() - t0:.2f} s")
    assert node.reservations() == [] and time.time() - t0 < 10  # a third of the reconcile interval


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


def test_preferred_allocation_follows_the_waiting_pod_that_is_bound_here(node):
    """Kubelet's GetPreferredAllocation names no pod. Two reservations wait on this node; only the
    pod bound to it can be the one kubelet admits, so its GPU is preferred, not the GPU of a pod the
    leader placed here that kube-scheduler has not bound yet (older reservation, other GPU)."""
    from hamid.localapi.client import LocalClient
    from hamid.request import parse_pod

    big = _gpu_pod(node, "big", 70000, node=None)  # placed here, not bound yet
    mid = _gpu_pod(node, "mid", 30000)  # bound
    with LocalClient(node.state) as c:  # the leader's commits: a decision each, left `reserved`
        for p in (big, mid):
            m, request = p["metadata"], parse_pod(p).to_dict()
            probe = c.reserve(request, "pod", owner={"kind": "pod", "uid": "probe-" + m["uid"], "name": "x/probe"})
            c.release(probe["owner"])
            c.commit({"kind": "pod", "uid": m["uid"], "name": f"{m['namespace']}/{m['name']}"},
                     probe["decision"], "pod", request)
        assert {r["state"] for r in c.reservations()} == {"reserved"}
    placed = {r["owner"]: r["decision"]["containers"][0]["devices"][0]["uuid"] for r in node.reservations()}
    gpu_big, gpu_mid = placed[f"pod:{big['metadata']['uid']}"], placed[f"pod:{mid['metadata']['uid']}"]
    assert gpu_big != gpu_mid  # 70000 + 30000 MiB do not fit on one H100
    assert node.kubelet.admit(mid).admitted
    cfg = node.kubelet.start_container(mid, "main")
    assert decode_limits(node, cfg) == (30000, 0)
    assert cfg.env["NVIDIA_VISIBLE_DEVICES"] == gpu_mid


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


def test_a_mig_pod_gets_its_instance_through_cdi(tmp_path, api_server):
    env = NodeEnv(tmp_path / "n", api_server, strategy="cdi-cri", mode="mig", split=7).start()
    try:
        pod = env.pod("mig", [{"name": "main", "limits": {RESOURCE: 1, "nvidia.com/gpumem": 9000}}],
                      annotations={"nvidia.com/vgpu-mode": "mig"})
        assert env.kubelet.admit(pod).admitted
        cfg = env.kubelet.start_container(pod, "main")
        (res,) = env.reservations()
        (gpu, inst), = res["mig"].items()
        assert cfg.env["NVIDIA_VISIBLE_DEVICES"] == inst["uuid"] and inst["uuid"].startswith("MIG-")
        assert res["decision"]["containers"][0]["devices"][0]["mig_profile"] == "1g.10gb"
        from hamid.devices.simulated import SimulatedBackend, parse_simulate_spec

        b = SimulatedBackend(parse_simulate_spec("H100:2"), env.node, mig_enabled=True,
                             state_file=env.state / "simulated-mig.json")
        assert [i.uuid for g in b.gpus() for i in g.mig_instances] == [inst["uuid"]]
        env.delete(pod)
        deadline = time.time() + 5
        while (env.reservations() or [i for g in b.gpus() for i in g.mig_instances]) and time.time() < deadline:
            time.sleep(0.05)
        assert env.reservations() == [] and not [i for g in b.gpus() for i in g.mig_instances]
        assert not list(env.cdi.glob("*.json"))  # its CDI spec went with it
    finally:
        env.stop()


def test_a_multi_container_pod_with_an_init_container(node):
    pod = node.pod("multi", [{"name": "a", "limits": {RESOURCE: 1, "nvidia.com/gpumem": 2048}},
                             {"name": "b", "limits": {RESOURCE: 1, "nvidia.com/gpumem": 3072}},
                             {"name": "cpu-only", "limits": {}}],
                   init=[{"name": "prep", "limits": {RESOURCE: 1, "nvidia.com/gpumem": 6144}}])
    got = node.kubelet.admit(pod)
    assert got.admitted, got.message
    assert got.devices["prep"][RESOURCE] == got.devices["a"][RESOURCE]  # kubelet hands prep's device to a
    prep = node.kubelet.start_container(pod, "prep")
    a = node.kubelet.start_container(pod, "a")
    b = node.kubelet.start_container(pod, "b")
    # prep and a share kubelet's device, so their slot carries the larger share; b has its own
    assert decode_limits(node, prep)[0] == 6144 and decode_limits(node, a)[0] == 6144
    assert decode_limits(node, b)[0] == 3072
    assert prep.mount("/run/hamid").host_path == a.mount("/run/hamid").host_path != b.mount("/run/hamid").host_path
    (res,) = node.reservations()
    assert sorted(c["name"] for c in res["decision"]["containers"]) == ["a", "b", "cpu-only", "prep"]


def test_kubelet_restart_re_registers_and_running_pods_keep_their_limits(node):
    pod = _gpu_pod(node, "keep", 5000, cores=20)
    assert node.kubelet.admit(pod).admitted
    before = node.kubelet.start_container(pod, "main")
    node.kubelet.restart()  # kubelet's state is reset: the devices seen after it are a new registration's
    node.wait_for_devices(timeout=30)  # how soon is the watcher's business, not a bound here: a busy machine
    again = node.kubelet.start_container(pod, "main")  # the container restarts after kubelet did
    assert decode_limits(node, again) == decode_limits(node, before) == (5000, 20)
    late = _gpu_pod(node, "late", 1000)
    assert node.kubelet.admit(late).admitted
    assert decode_limits(node, node.kubelet.start_container(late, "main")) == (1000, 0)


def test_health_changes_reach_kubelet_and_back(node):
    from hamid.devices.simulated import SimulatedBackend, gpu_uuid, parse_simulate_spec

    b = SimulatedBackend(parse_simulate_spec("H100:2"), node.node, state_file=node.state / "simulated-mig.json")
    bad = gpu_uuid(node.node, 1)

    def unhealthy():
        return sorted({i.rsplit("-", 1)[0] for i, d in node.kubelet.devices(RESOURCE).items()
                       if d.health != "Healthy"})

    b.set_healthy(1, False)
    deadline = time.time() + 5
    while unhealthy() != [bad] and time.time() < deadline:
        time.sleep(0.05)
    assert unhealthy() == [bad] and len(node.kubelet.healthy(RESOURCE)) == 10
    b.set_healthy(1, True)
    deadline = time.time() + 5
    while unhealthy() and time.time() < deadline:
        time.sleep(0.05)
    assert unhealthy() == [] and len(node.kubelet.healthy(RESOURCE)) == 20


def test_a_daemon_restarted_while_pods_run_reconciles_to_exactly_the_running_ones(node, api_server):
    keep = [_gpu_pod(node, f"k{i}", 2000) for i in range(3)]
    for p in keep:
        assert node.kubelet.admit(p).admitted
        node.kubelet.start_container(p, "main")
    gone = _gpu_pod(node, "gone", 2000)
    assert node.kubelet.admit(gone).admitted
    node.kubelet.start_container(gone, "main")
    ended = _gpu_pod(node, "ended", 2000)
    assert node.kubelet.admit(ended).admitted
    node.kubelet.start_container(ended, "main")
    node.stop_hamid()
    # while the daemon is down: one pod is deleted, one ends
    node.delete(gone)
    api_server.set_status("Pod", "default", "ended", {"phase": "Succeeded"})
    node.start_hamid()
    deadline = time.time() + 10
    want = {f"pod:{p['metadata']['uid']}" for p in keep}
    while {r["owner"] for r in node.reservations()} != want and time.time() < deadline:
        time.sleep(0.1)
    assert {r["owner"] for r in node.reservations()} == want


def test_a_pod_and_a_docker_container_never_both_get_past_the_cards_memory(tmp_path, api_server):
    """One H100 (81559 MiB); in each round a pod asking 50000 MiB and a Docker container asking 50000 MiB
    of the same GPU are admitted at the same moment: one of them is refused, every time."""
    import threading

    from hamid.localapi.client import Conflict, LocalClient

    env = NodeEnv(tmp_path / "n", api_server, simulate="H100:1").start()
    try:
        for rnd in range(6):
            pod = _gpu_pod(env, f"race{rnd}", 50000)
            assert env.kubelet.admit(pod).admitted
            out = {}

            def start_pod():
                try:
                    env.kubelet.start_container(pod, "main")
                    out["pod"] = "ok"
                except StartContainerError as e:
                    out["pod"] = str(e)

            def start_docker():
                try:
                    with LocalClient(env.state) as c:
                        c.call("POST", "/v1/containers", {"id": f"dock{rnd}", "env": [
                            "HAMI_VISIBLE_DEVICES=0", "HAMI_VGPU_SPEC=mem=50000"]})
                    out["docker"] = "ok"
                except Conflict as e:
                    out["docker"] = str(e)

            ts = [threading.Thread(target=start_pod), threading.Thread(target=start_docker)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(30)
            assert sorted(v == "ok" for v in out.values()) == [False, True], out
            booked = sum(d["mem_mib"] for r in env.reservations() for c in r["decision"]["containers"]
                         for d in c["devices"])
            assert booked == 50000
            env.delete(pod)
            with LocalClient(env.state) as c:
                c.release(f"docker:dock{rnd}")
            deadline = time.time() + 5
            while env.reservations() and time.time() < deadline:
                time.sleep(0.02)
            assert env.reservations() == []
    finally:
        env.stop()


def test_the_pod_watch_lists_again_after_410_gone(node, api_server):
    pod = _gpu_pod(node, "after-gone", 3000)
    assert node.kubelet.admit(pod).admitted
    node.kubelet.start_container(pod, "main")
    log = node.log.read_text()  # before the watch ends: once the block ends it may resume, meet 410 and list at once
    with api_server.hold_watches():  # the daemon's watch ends; it cannot resume until the block ends
        other = _gpu_pod(node, "bump", 100)
        node.delete(pod)
        api_server.compact()  # its last resourceVersion is now too old: resuming gives 410 Gone
    deadline = time.time() + 10
    while any(r["name"] == "default/after-gone" for r in node.reservations()) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(r["name"] == "default/after-gone" for r in node.reservations())
    assert other["metadata"]["uid"]
    assert "listing again" in node.log.read_text() and "listing again" not in log


def test_metrics_carry_the_pods_namespace_name_and_container(node, api_server):
    from hamid.ledger import Ledger
    from hamid.metrics.exporter import LedgerCollector, SlotLabeler

    api_server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    pod = _gpu_pod(node, "metered", 2048, namespace="team-a")
    assert node.kubelet.admit(pod).admitted
    cfg = node.kubelet.start_container(pod, "main")
    led = Ledger(node.state / "ledger.db")
    try:
        fams = {fam.name: fam.samples for fam in LedgerCollector(led, lambda: "sim").collect()}
        (s,) = fams["hami_vgpu_memory_allocated_bytes"]
        # HAMi's labels (#2898 on): per pod and GPU; hamid_vgpu_allocation_info names the container
        assert (s.labels["namespace"], s.labels["pod"], "container_index" in s.labels) == ("team-a", "metered", False)
        assert s.value == 2048 << 20
        (info,) = fams["hamid_vgpu_allocation_info"]
        assert (info.labels["pod"], info.labels["container"], info.labels["device_uuid"]) == \
            ("metered", "main", s.labels["device_uuid"])
        slot = cfg.mount("/run/hamid").host_path.rsplit("/", 1)[1]
        assert SlotLabeler(led)(slot) == ("team-a", "metered", "main")  # the region metrics' labels
    finally:
        led.close()


def test_a_pods_region_directory_is_its_users_where_the_pod_says_who_that_is(node, api_server):
    """The one host directory a container may write: owned by the user its securityContext names (0700),
    on a tmpfs of its own; open to any user of the container only where the image decides the user."""
    import stat

    from hamid.node import layout, regionfs

    known = node.pod("known", [{"name": "main", "limits": {RESOURCE: 1, "nvidia.com/gpumem": 1000},
                                "securityContext": {"runAsUser": 1234, "runAsGroup": 4321}}])
    unknown = _gpu_pod(node, "unknown", 1000)
    for pod in (known, unknown):
        assert node.kubelet.admit(pod).admitted
        node.kubelet.start_container(pod, "main")
    dirs = {}
    for r in node.reservations():
        slot = r["details"]["container_slots"]["main"]
        dirs[r["name"].split("/")[1]] = layout.region_dir(node.state, slot)
    st = os.stat(dirs["known"])
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 4321, 0o700)
    assert stat.S_IMODE(os.stat(dirs["unknown"]).st_mode) == 0o777
    assert all(regionfs.is_mounted(d) for d in dirs.values())


def test_the_reconciler_reads_the_pod_watch_not_one_get_per_reservation(tmp_path, api_server):
    """Running pods are checked against the watch's cache of the node's pods: a reconciler pass over
    many reservations costs no GET per pod (it did, one per reservation per pass)."""
    node = NodeEnv(tmp_path / "n", api_server, split=30).start()  # reconciler every second
    try:
        pods = [_gpu_pod(node, f"p{i}", 1000) for i in range(12)]
        for pod in pods:
            assert node.kubelet.admit(pod).admitted
            node.kubelet.start_container(pod, "main")
        assert len(node.reservations()) == 12
        time.sleep(1.5)  # the watch has the pods; let a pass or two go by
        before = sum(n for (m, p), n in api_server.requests.items() if m == "GET" and "/pods/" in p)
        time.sleep(3.5)  # three passes or more
        after = sum(n for (m, p), n in api_server.requests.items() if m == "GET" and "/pods/" in p)
        assert after - before == 0, f"{after - before} pod GETs in 3.5 s of reconciling"
        assert len(node.reservations()) == 12  # and every running pod is kept
    finally:
        node.stop()


def test_prestart_takes_the_pod_from_the_watch_not_a_get(tmp_path, api_server):
    """PreStartContainer ties the devices to the pod the node's watch already holds: no GET of the pod
    (it cost 1-5 ms per container start), and the container gets its own pod's limits all the same."""
    node = NodeEnv(tmp_path / "n", api_server, split=10).start()
    try:
        pods = [_gpu_pod(node, f"w{i}", 1000 + 100 * i, cores=10 + i) for i in range(4)]
        time.sleep(1.0)  # the pod watch (list, then watch) has the pods created with spec.nodeName
        before = {p: n for (m, p), n in api_server.requests.items() if m == "GET" and "/pods/" in p}
        for i, pod in enumerate(pods):
            assert node.kubelet.admit(pod).admitted
            (dev,) = node.limits_of(node.kubelet.start_container(pod, "main")).devices
            assert dev.memory_bytes == mib(1000 + 100 * i) and dev.sm_percent == 10 + i
        after = {p: n for (m, p), n in api_server.requests.items() if m == "GET" and "/pods/" in p}
        gets = {p: n - before.get(p, 0) for p, n in after.items() if n - before.get(p, 0)}
        assert gets == {}, f"pod GETs during the container starts: {gets}"
    finally:
        node.stop()


def test_bind_phase_moves_to_success_once_the_pods_gpu_containers_are_allocated(node, api_server):
    """As HAMi's device plugin does: the leader writes ``hami.io/bind-phase: allocating`` when it
    places the pod; once the node has allocated every GPU container (kubelet allocates them all
    when it admits the pod; hamid ties them to the pod at the first start), ``success`` (tools built for
    HAMi count only ``success`` pods), and the consumed ``vgpu-devices-to-allocate`` entries erased."""
    ann = {"hami.io/bind-phase": "allocating", "hami.io/bind-time": "1",
           "hami.io/vgpu-devices-to-allocate": "GPU-x,NVIDIA,2048,0:;GPU-y,NVIDIA,3072,0:;;",
           "hami.io/vgpu-devices-allocated": "GPU-x,NVIDIA,2048,0:;GPU-y,NVIDIA,3072,0:;;"}
    pod = node.pod("phased", [{"name": "a", "limits": {RESOURCE: 1, "nvidia.com/gpumem": 2048}},
                              {"name": "b", "limits": {RESOURCE: 1, "nvidia.com/gpumem": 3072}},
                              {"name": "cpu-only", "limits": {}}], annotations=ann)

    def annotations() -> dict:
        return api_server.get("Pod", "default", "phased")["metadata"]["annotations"]

    assert annotations()["hami.io/bind-phase"] == "allocating"
    assert node.kubelet.admit(pod).admitted  # kubelet allocates every container of the pod at admission
    node.kubelet.start_container(pod, "a")  # the first start ties them all to the pod: allocated
    got = annotations()
    assert got["hami.io/bind-phase"] == "success"
    assert got["hami.io/vgpu-devices-to-allocate"] == ";;;"  # consumed, as HAMi leaves it
    assert got["hami.io/vgpu-devices-allocated"] == ann["hami.io/vgpu-devices-allocated"]  # the record stays
    # a pod no leader placed (no bind-phase) gets none written
    plain = _gpu_pod(node, "plain", 1024)
    assert node.kubelet.admit(plain).admitted
    node.kubelet.start_container(plain, "main")
    assert "hami.io/bind-phase" not in (api_server.get("Pod", "default", "plain")["metadata"].get("annotations") or {})


def test_a_pod_read_back_with_canonical_quantities_gets_its_limits(node, api_server):
    """The API server stores ``nvidia.com/gpumem: "30000"`` as ``"30k"`` (and copies it into the requests):
    kubelet and hamid both read it as 30000 MiB."""
    pod = _gpu_pod(node, "canon", 30000, cores=30)
    stored = api_server.get("Pod", "default", "canon")["spec"]["containers"][0]["resources"]
    assert stored["limits"]["nvidia.com/gpumem"] == "30k" == stored["requests"]["nvidia.com/gpumem"]
    got = node.kubelet.admit(pod)
    assert got.admitted, got.message
    lim = node.limits_of(node.kubelet.start_container(pod, "main"))
    (dev,) = lim.devices
    assert dev.memory_bytes == mib(30000) and dev.sm_percent == 30
