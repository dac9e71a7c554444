"""DRA (issue 41) end to end on one node: a real ``hamid run`` with ``draDevices``, the API
server stand-in serving resource.k8s.io/v1, the scheduler stand-in allocating claims from the
slices hamid publishes (first fit, consumable capacity, counters), and the DRA kubelet stand-in
calling hamid's real gRPC services over the plugin watcher's sockets.

Owns the proof that a claim's memory and cores become a reservation in the node's one ledger
and a limits file that says what the claim asked; that the scheduler leaves the next claim
pending when the GPU is full; that a Docker container booked on the same GPU after the scheduler
read the slice makes prepare fail with a per-claim error (the ledger refuses) and the slice shrink;
that deleting the pod unprepares and releases; and that a daemon restart between prepare and
unprepare loses nothing.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from drakubelet import DraKubeletStandIn, PrepareFailed
from hamid.kubelet.devices import gpu_of
from hamid.localapi.client import LocalClient
from hamid.node import mps
from nodeenv import NodeEnv
from scheduler import SchedulerStandIn

pytestmark = pytest.mark.slow

DRIVER = "gpu.hamid.io"
GiB = 1 << 30
MiB = 1 << 20


def wait_for(what, fn, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


class DraCluster:
    """One node with DRA GPUs, kubelet's DRA side and the scheduler."""

    def __init__(self, root, api, *, simulate="H100:3", dra="0,1", mode="hami-core", extra_config="",
                 reconcile_interval=1.0, wipe_delay=30.0):
        self.api = api
        self.env = NodeEnv(root, api, simulate=simulate, split=4, dra=dra, mode=mode, extra_config=extra_config,
                           reconcile_interval=reconcile_interval)
        self.kubelet = DraKubeletStandIn(self.env.kubelet_dir, node_name=self.env.node, api_url=api.url,
                                         cdi_dirs=(self.env.cdi,), wipe_delay=wipe_delay)
        self.sched = SchedulerStandIn(api, period=0.2)

    def __enter__(self):
        self.env.start()
        self.kubelet.start()
        self.kubelet.wait_registered(DRIVER, timeout=30)
        self.sched.start()
        return self

    def __exit__(self, *exc):
        self.sched.stop()
        self.kubelet.stop()
        self.env.stop()

    def slices(self):
        return [s for s in self.api.list("ResourceSlice") if s["spec"]["driver"] == DRIVER]

    def device(self, name):
        for s in self.slices():
            for d in s["spec"].get("devices") or []:
                if d["name"] == name:
                    return d
        return None

    def device_class(self, name="gpu.hamid.io", extended=None, expression=f'device.driver == "{DRIVER}"'):
        spec = {"selectors": [{"cel": {"expression": expression}}]}
        if extended:
            spec["extendedResourceName"] = extended
        return self.api.create({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                "metadata": {"name": name}, "spec": spec})

    def template(self, name, requests: dict, selector: str | None = None, config: dict | None = None):
        exactly = {"deviceClassName": "gpu.hamid.io", "capacity": {"requests": requests}}
        if selector:
            exactly["selectors"] = [{"cel": {"expression": selector}}]
        spec = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
        if config:
            spec["devices"]["config"] = [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": config}}]
        return self.api.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                                "metadata": {"name": name, "namespace": "default"}, "spec": {"spec": spec}})

    def pod(self, name, template):
        return self.api.create({"apiVersion": "v1", "kind": "Pod",
                                "metadata": {"name": name, "namespace": "default"},
                                "spec": {"containers": [{"name": "main", "image": "cuda",
                                                         "resources": {"claims": [{"name": "gpu"}]}}],
                                         "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}]}})

    def claim_of(self, pod_name):
        pod = self.api.get("Pod", "default", pod_name)
        st = {s["name"]: s["resourceClaimName"] for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        return self.api.get("ResourceClaim", "default", st["gpu"])

    def limits(self, pod_name, container="main"):
        cfg = self.kubelet.container_config("default", pod_name, container)
        return self.env.limits_of(cfg), cfg

    def delete(self, pod_name):
        self.kubelet.unprepare_pod("default", pod_name)
        self.api.delete("Pod", "default", pod_name, grace_period=0)

    def claim_reservations(self):
        return [r for r in self.env.reservations() if r["owner"].startswith("claim:")]


@pytest.fixture
def cluster(api_server, tmp_path):
    with DraCluster(tmp_path / "n", api_server) as c:
        yield c


def test_pool_published_for_the_dra_gpus_only(cluster):
    """One pool named after the node, the DRA GPUs as shareable devices with memory and cores; the
    device plugin's GPU is not in it, and kubelet sees only that GPU's devices from the plugin."""
    s = wait_for("the pool", cluster.slices)
    assert len(s) == 1
    spec = s[0]["spec"]
    assert spec["nodeName"] == cluster.env.node and spec["pool"]["name"] == cluster.env.node
    assert spec["pool"]["resourceSliceCount"] == 1 and spec["pool"]["generation"] >= 1
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    d = spec["devices"][0]
    assert d["allowMultipleAllocations"] is True
    assert d["attributes"]["productName"]["string"].startswith("NVIDIA H100")
    assert d["attributes"]["architecture"] == {"string": "Hopper"}
    assert d["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert d["attributes"]["sharing"] == {"string": "shim"}
    assert d["attributes"]["uuid"]["string"].startswith("GPU-")
    assert d["capacity"]["memory"]["requestPolicy"]["validRange"] == {"min": "1Mi", "step": "1Mi"}
    assert d["capacity"]["cores"] == {"value": "100", "requestPolicy": {
        "default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}}
    assert d["capacity"]["shares"] == {"value": "4", "requestPolicy": {  # deviceSplitCount 4
        "default": "1", "validRange": {"min": "1", "max": "1"}}}
    plugin_gpus = {gpu_of(i) for i in cluster.env.kubelet.devices("nvidia.com/gpu")}
    assert len(cluster.env.kubelet.devices("nvidia.com/gpu")) == 4 and len(plugin_gpus) == 1
    assert d["attributes"]["uuid"]["string"] not in plugin_gpus


def test_claims_share_a_gpu_up_to_its_capacity_and_the_limits_file_says_what_they_asked(cluster):
    cluster.device_class()
    cluster.template("half", {"memory": "38Gi", "cores": "50"}, selector='device.attributes["gpu.hamid.io"].index == 0',
                     config={"apiVersion": "gpu.hamid.io/v1alpha1", "kind": "GpuConfig", "priority": 1})
    for n in ("a", "b", "c"):
        cluster.pod(n, "half")
    assert cluster.sched.wait_bound("default", "a", timeout=30) == cluster.env.node
    assert cluster.sched.wait_bound("default", "b", timeout=30) == cluster.env.node
    why = wait_for("c pending", lambda: "claims" in (cluster.sched.last_failure("default", "c") or "") and
                   cluster.sched.last_failure("default", "c"))
    assert why == "0/1 nodes are available: 1 cannot allocate all claims."
    conds = cluster.api.get("Pod", "default", "c")["status"]["conditions"]
    cond = next(c for c in conds if c["type"] == "PodScheduled")
    assert cond["reason"] == "Unschedulable"

    cluster.kubelet.prepare_pod("default", "a")
    cluster.kubelet.prepare_pod("default", "b")
    lim, cfg = cluster.limits("a")
    uuid0 = cluster.device("gpu-0")["attributes"]["uuid"]["string"]
    assert [(d.uuid, d.memory_bytes, d.sm_percent) for d in lim.devices] == [(uuid0, 38 * GiB, 50)]
    assert lim.priority == 1
    assert cfg.env["NVIDIA_VISIBLE_DEVICES"] == uuid0
    assert cfg.mount("/usr/local/vgpu/libvgpu.so").read_only
    claim = cluster.claim_of("a")
    res = {r["owner"]: r for r in cluster.claim_reservations()}
    assert set(res) == {f"claim:{cluster.claim_of(n)['metadata']['uid']}" for n in ("a", "b")}
    assert cfg.cdi_devices == [f"{DRIVER}/claim={claim['metadata']['uid']}-d0"]

    # a prepare kubelet repeats (it retries until it has an answer) changes nothing
    calls = len(cluster.kubelet.calls)
    cluster.kubelet.prepared.clear()
    cluster.kubelet.prepare_pod("default", "a")
    assert len(cluster.kubelet.calls) == calls + 1
    assert len(cluster.claim_reservations()) == 2

    # the pod goes: unprepared, released; its claim is deleted and the pending pod fits
    cluster.delete("a")
    assert len(cluster.claim_reservations()) == 1
    assert cluster.sched.wait_bound("default", "c", timeout=30) == cluster.env.node
    cluster.kubelet.prepare_pod("default", "c")
    assert len(cluster.claim_reservations()) == 2


def test_a_docker_container_booked_while_the_scheduler_allocates_makes_prepare_fail_per_claim(cluster):
    """The race of two faces on one GPU: the scheduler allocates a claim from the slice it read;
    before kubelet prepares it, a Docker container takes most of the GPU. The ledger refuses the
    claim (a per-claim error kubelet shows as an Event), nothing is booked twice, and the slice is
    published again with the capacity the container left."""
    cluster.device_class()
    wait_for("the pool", cluster.slices)
    gen0 = cluster.slices()[0]["spec"]["pool"]["generation"]
    cluster.template("big", {"memory": "60Gi"}, selector='device.attributes["gpu.hamid.io"].index == 0')
    cluster.pod("p", "big")
    cluster.sched.wait_bound("default", "p", timeout=30)  # allocated from the slice as it was
    with LocalClient(cluster.env.state) as c:
        c.call("POST", "/v1/containers", {"id": "d" * 64, "env": ["HAMI_VGPU_SPEC=mem=40g", "HAMI_VISIBLE_DEVICES=0"]})
    with pytest.raises(PrepareFailed, match="does not fit on this node now"):
        cluster.kubelet.prepare_pod("default", "p")
    ev = [e for e in cluster.api.list("Event", "default") if e.get("reason") == "FailedPrepareDynamicResources"]
    assert ev and "NodePrepareResources failed for ResourceClaim" in ev[-1]["message"]
    assert cluster.claim_reservations() == []
    booked = [r for r in cluster.env.reservations() if r["owner"].startswith("docker:")]
    assert len(booked) == 1

    def shrunk():
        d = cluster.device("gpu-0")
        s = cluster.slices()[0]["spec"]["pool"]["generation"]
        return d is not None and d["capacity"]["memory"]["value"] == f"{81559 - 40 * 1024}Mi" and s > gen0
    wait_for("the slice republished net of the container", shrunk)


def test_a_daemon_restart_between_prepare_and_unprepare_loses_nothing(cluster):
    cluster.device_class()
    cluster.template("q", {"memory": "8Gi", "cores": "25"})
    cluster.pod("r", "q")
    cluster.sched.wait_bound("default", "r", timeout=30)
    cluster.kubelet.prepare_pod("default", "r")
    before = cluster.claim_reservations()
    lim_before, _ = cluster.limits("r")
    gen = cluster.slices()[0]["spec"]["pool"]["generation"]
    old_socket = cluster.kubelet.drivers[DRIVER].socket
    cluster.env.stop_hamid()
    wait_for("deregistered", lambda: DRIVER not in cluster.kubelet.drivers)  # its socket went with it
    cluster.env.start_hamid()
    assert cluster.kubelet.wait_registered(DRIVER, timeout=30).socket == old_socket
    assert cluster.slices()[0]["spec"]["pool"]["generation"] >= gen  # never back
    assert cluster.kubelet.wiped == []  # back within kubelet's wiping delay: the slices stayed
    assert [r["owner"] for r in cluster.claim_reservations()] == [r["owner"] for r in before]
    assert cluster.limits("r")[0] == lim_before
    cluster.delete("r")
    assert cluster.claim_reservations() == []
    assert not list(cluster.env.cdi.glob(f"{DRIVER}-claim-*.json"))


def test_a_whole_gpu_through_the_extended_resource_class(api_server, tmp_path):
    with DraCluster(tmp_path / "n", api_server, simulate="H100:2", dra="all") as c:
        c.device_class(extended="nvidia.com/gpu")
        c.api.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w", "namespace": "default"},
                      "spec": {"containers": [{"name": "main", "image": "cuda",
                                               "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
        c.sched.wait_bound("default", "w", timeout=30)
        pod = c.api.get("Pod", "default", "w")
        ext = pod["status"]["extendedResourceClaimStatus"]
        assert ext["requestMappings"] == [{"containerName": "main", "resourceName": "nvidia.com/gpu",
                                           "requestName": "container-0-request-0"}]
        c.kubelet.prepare_pod("default", "w")
        lim, _ = c.limits("w")
        assert [(d.memory_bytes, d.sm_percent) for d in lim.devices] == [(81559 * MiB, 0)]


def test_a_mig_profile_by_counters(api_server, tmp_path):
    """A MIG-mode GPU is partitionable: the scheduler allocates profile placements by the GPU's
    counters (two 4g placements overlap and exceed its 7 compute slices: the second stays pending),
    and prepare makes the MIG instance the claim names."""
    with DraCluster(tmp_path / "n", api_server, simulate="H100:1", dra="all", mode="mig") as c:
        c.device_class(name="mig.gpu.hamid.io", expression=f'device.driver == "{DRIVER}" && '
                                                           'device.attributes["gpu.hamid.io"].sharing == "mig"')
        wait_for("the pool", lambda: len(c.slices()) == 2)
        counters = next(s for s in c.slices() if s["spec"].get("sharedCounters"))
        assert counters["spec"]["pool"]["resourceSliceCount"] == 2
        spec = {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "mig.gpu.hamid.io",
            "selectors": [{"cel": {"expression": 'device.attributes["gpu.hamid.io"].profile == "4g.40gb"'}}]}}]}}
        c.api.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                      "metadata": {"name": "m", "namespace": "default"}, "spec": {"spec": spec}})
        c.pod("m1", "m")
        c.sched.wait_bound("default", "m1", timeout=30)
        c.pod("m2", "m")
        wait_for("m2 pending", lambda: "cannot allocate all claims" in (c.sched.last_failure("default", "m2") or ""))
        c.kubelet.prepare_pod("default", "m1")
        cfg = c.kubelet.container_config("default", "m1", "main")
        assert cfg.env["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
        (res,) = c.claim_reservations()
        (dev,) = res["decision"]["containers"][0]["devices"]
        (result,) = c.claim_of("m1")["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "gpu-0-mig-4g-40gb-0" and dev["mig_profile"] == "4g.40gb"
        # a 1g.10gb claim: first fit by the counters is slice 4 (hamid's own choice would be slice 6):
        # the instance is made where the scheduler allocated, so the counters stay true
        spec1 = {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "mig.gpu.hamid.io",
            "selectors": [{"cel": {"expression": 'device.attributes["gpu.hamid.io"].profile == "1g.10gb"'}}]}}]}}
        c.api.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                      "metadata": {"name": "one", "namespace": "default"}, "spec": {"spec": spec1}})
        c.pod("s1", "one")
        c.sched.wait_bound("default", "s1", timeout=30)
        c.kubelet.prepare_pod("default", "s1")
        (result,) = c.claim_of("s1")["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "gpu-0-mig-1g-10gb-4"
        uid = c.claim_of("s1")["metadata"]["uid"]
        (res,) = [r for r in c.claim_reservations() if r["owner"] == f"claim:{uid}"]
        assert res["decision"]["containers"][0]["devices"][0]["mig_placement"] == {"start": 4, "size": 1}


def test_an_mps_gpu_serves_claims_as_mps_clients(api_server):
    """A GPU that serves MPS is published with sharing "mps"; a claim on it gets an MPS client's
    limits file (its thread percentage and pinned memory) and the GPU's pipe directory."""
    standin = str(Path(__file__).resolve().parents[1] / "standins" / "nvidia-cuda-mps-control")
    root = Path(tempfile.mkdtemp(prefix="dm", dir="/tmp"))  # short: the control socket's path is a unix socket's
    try:
        with DraCluster(root, api_server, simulate="H100:1", dra="all", mode="mps",
                        extra_config=f"mpsControl: {standin}\nmpsCheckInterval: 0.2\n") as c:
            wait_for("the pool", c.slices)
            assert c.device("gpu-0")["attributes"]["sharing"] == {"string": "mps"}
            c.device_class()
            c.template("m", {"memory": "4Gi", "cores": "30"})
            c.pod("p", "m")
            c.sched.wait_bound("default", "p", timeout=30)
            c.kubelet.prepare_pod("default", "p")
            lim, cfg = c.limits("p")
            (dev,) = lim.devices
            assert lim.mps and dev.sm_percent == 30 and dev.memory_bytes == 4 * GiB
            pipe = cfg.mount("/run/hamid-mps")
            assert not pipe.read_only and pipe.host_path == mps.pipe_dir(c.env.state, dev.uuid)
            assert cfg.env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/hamid-mps"
            assert mps.MpsControl(standin, str(c.env.state)).running(dev.uuid)
            c.delete("p")
            assert c.claim_reservations() == []
    finally:
        ctl = mps.MpsControl(standin, str(root / "state"))
        for uuid in ctl.gpus():
            ctl.stop(uuid)
        shutil.rmtree(root, ignore_errors=True)


def test_a_claim_deleted_while_kubelet_never_unprepares_is_released_by_the_reconciler(cluster):
    """Kubelet lost (its unprepare never comes), the pod and its claim deleted: the reconciler asks
    the API server, finds no claim of that UID and releases the share."""
    cluster.device_class()
    cluster.template("q", {"memory": "8Gi"})
    cluster.pod("r", "q")
    cluster.sched.wait_bound("default", "r", timeout=30)
    cluster.kubelet.prepare_pod("default", "r")
    assert len(cluster.claim_reservations()) == 1
    cluster.api.delete("Pod", "default", "r", grace_period=0)  # the claim controller deletes its claim
    wait_for("the claim released", lambda: cluster.claim_reservations() == [])


def test_an_unhealthy_gpu_is_tainted_in_the_pool_and_claims_avoid_it(cluster):
    from hamid.devices.simulated import SimulatedBackend, parse_simulate_spec

    b = SimulatedBackend(parse_simulate_spec("H100:3"), cluster.env.node,
                         state_file=cluster.env.state / "simulated-mig.json")
    wait_for("the pool", cluster.slices)
    gen = cluster.slices()[0]["spec"]["pool"]["generation"]
    b.set_healthy(1, False)
    wait_for("the taint", lambda: (cluster.device("gpu-1") or {}).get("taints"))
    assert cluster.device("gpu-1")["taints"] == [{"key": "gpu.hamid.io/unhealthy", "effect": "NoSchedule",
                                                  "value": "the-device-backend-reports-the-GPU-unhealthy"}]
    assert cluster.slices()[0]["spec"]["pool"]["generation"] > gen
    cluster.device_class()
    cluster.template("g1", {"memory": "1Gi"}, selector='device.attributes["gpu.hamid.io"].index == 1')
    cluster.pod("t", "g1")
    wait_for("t pending", lambda: "cannot allocate all claims" in (cluster.sched.last_failure("default", "t") or ""))
    b.set_healthy(1, True)
    assert cluster.sched.wait_bound("default", "t", timeout=30) == cluster.env.node
    assert "taints" not in cluster.device("gpu-1")


def test_a_device_plugin_pod_admitted_on_the_node_never_lands_on_a_dra_gpu(api_server, tmp_path):
    """cdi-cri: the ledger, not kubelet's device IDs, picks the GPU of a pod that came bound; the DRA
    GPU is never among its candidates."""
    env = NodeEnv(tmp_path / "n", api_server, simulate="H100:2", split=4, dra="0", strategy="cdi-cri").start()
    try:
        for i in range(3):
            pod = env.pod(f"p{i}", [{"name": "main", "limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}}])
            assert env.kubelet.admit(pod).admitted
            env.kubelet.start_container(pod, "main")
        gpus = {d["index"] for r in env.reservations() for c in r["decision"]["containers"] for d in c["devices"]}
        assert gpus == {1}
    finally:
        env.stop()


def test_n_tenants_per_gpu_then_the_next_claim_waits(cluster):
    """deviceSplitCount holds for claims as for device-plugin pods: the scheduler stops at N per GPU
    (the pool's shares), here 4, one of them a Docker container's."""
    cluster.device_class()
    with LocalClient(cluster.env.state) as c:
        c.call("POST", "/v1/containers", {"id": "e" * 64, "env": ["HAMI_VGPU_SPEC=mem=1g", "HAMI_VISIBLE_DEVICES=0"]})
    wait_for("the slice net of the container", lambda: (cluster.device("gpu-0") or {}).get("capacity", {}).get(
        "shares", {}).get("value") == "3")
    cluster.template("small", {"memory": "1Gi"}, selector='device.attributes["gpu.hamid.io"].index == 0')
    for i in range(4):
        cluster.pod(f"s{i}", "small")
    for i in range(3):
        cluster.sched.wait_bound("default", f"s{i}", timeout=30)
    wait_for("the fourth waits", lambda: "cannot allocate all claims" in (cluster.sched.last_failure("default", "s3")
                                                                            or ""))
    for i in range(3):
        cluster.kubelet.prepare_pod("default", f"s{i}")
    assert len(cluster.claim_reservations()) == 3


def test_a_node_that_stops_serving_dra_has_its_slices_wiped_by_kubelet(api_server, tmp_path):
    """Kubelet deletes a driver's slices of its node once the driver's socket has been gone for its
    wiping delay: a daemon restarted without draDevices leaves nothing for the scheduler to allocate."""
    with DraCluster(tmp_path / "n", api_server, wipe_delay=0.5) as c:
        wait_for("the pool", c.slices)
        c.env.stop_hamid()
        c.env.config.write_text(c.env.config.read_text().replace("draDevices: '0,1'\n", ""))
        c.env.dra_gpus = 0
        c.env.start_hamid()
        wait_for("wiped", lambda: c.kubelet.wiped == [DRIVER] and not c.slices())
        assert len(c.env.kubelet.devices("nvidia.com/gpu")) == 12  # every GPU is the device plugin's again


def _one_claim_edits(c: DraCluster, pod_name: str):
    """The container's CDI edits, checked to be ONE set: one CDI device of the claim, one limits file,
    one region directory (two at one path would leave the shim reading one and mapping the other GPU)."""
    claim = c.claim_of(pod_name)
    uid = claim["metadata"]["uid"]
    cfg = c.kubelet.container_config("default", pod_name, "main")
    assert cfg.cdi_devices == [f"{DRIVER}/claim={uid}-d0"]
    paths = [m.container_path for m in cfg.mounts]
    assert paths.count("/usr/local/vgpu/hamid.limits") == 1, paths
    assert paths.count("/run/hamid") == 1, paths
    answered = c.kubelet.prepared[uid].driver_devices
    # kubelet is told every allocated device; the first carries the claim's one CDI device
    assert [list(d.cdi_device_ids) for d in answered] == [[f"{DRIVER}/claim={uid}-d0"]] + [[]] * (len(answered) - 1)
    (res,) = [r for r in c.claim_reservations() if r["owner"] == f"claim:{uid}"]
    assert len(res["decision"]["containers"]) == 1
    return c.env.limits_of(cfg), cfg, claim


def test_a_claim_of_two_devices_is_one_set_of_edits_listing_both_gpus(cluster):
    """Two requests of one claim on two GPUs, each with its own memory and cores: the container
    gets one limits file listing both GPUs with what each consumed, and NVIDIA_VISIBLE_DEVICES and
    CUDA_DEVICE_MEMORY_LIMIT_<i> agree on the order; a repeated prepare answers the same, and the
    pod's end releases the claim and its spec."""
    cluster.device_class()
    reqs = []
    for name, idx, mem, cores in (("small", 0, "10Gi", "20"), ("large", 1, "30Gi", "40")):
        reqs.append({"name": name, "exactly": {
            "deviceClassName": "gpu.hamid.io", "capacity": {"requests": {"memory": mem, "cores": cores}},
            "selectors": [{"cel": {"expression": f'device.attributes["gpu.hamid.io"].index == {idx}'}}]}})
    cluster.api.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                        "metadata": {"name": "two", "namespace": "default"},
                        "spec": {"spec": {"devices": {"requests": reqs, "config": [{"opaque": {
                            "driver": DRIVER, "parameters": {"apiVersion": "gpu.hamid.io/v1alpha1",
                                                             "kind": "GpuConfig", "priority": 0}}}]}}}})
    cluster.pod("p", "two")
    cluster.sched.wait_bound("default", "p", timeout=30)
    cluster.kubelet.prepare_pod("default", "p")
    lim, cfg, claim = _one_claim_edits(cluster, "p")
    u0, u1 = (cluster.device(f"gpu-{i}")["attributes"]["uuid"]["string"] for i in (0, 1))
    assert [(d.uuid, d.memory_bytes, d.sm_percent) for d in lim.devices] == [(u0, 10 * GiB, 20), (u1, 30 * GiB, 40)]
    assert lim.priority == 0
    assert cfg.env["NVIDIA_VISIBLE_DEVICES"] == f"{u0},{u1}"
    assert (cfg.env["CUDA_DEVICE_MEMORY_LIMIT_0"], cfg.env["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("10240m", "30720m")

    cluster.kubelet.prepared.clear()  # kubelet asks again (a retry, its restart): the same answer
    cluster.kubelet.prepare_pod("default", "p")
    assert _one_claim_edits(cluster, "p")[0] == lim
    cluster.delete("p")
    assert cluster.claim_reservations() == []
    assert not list(cluster.env.cdi.glob(f"{DRIVER}-claim-*.json"))


def test_two_whole_gpus_through_the_extended_resource_class(api_server, tmp_path):
    """``nvidia.com/gpu: 2`` served by DRA: a claim of two devices, one limits file listing both
    GPUs, each with all its memory."""
    with DraCluster(tmp_path / "n", api_server, simulate="H100:2", dra="all") as c:
        c.device_class(extended="nvidia.com/gpu")
        c.api.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w", "namespace": "default"},
                      "spec": {"containers": [{"name": "main", "image": "cuda",
                                               "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}})
        c.sched.wait_bound("default", "w", timeout=30)
        c.kubelet.prepare_pod("default", "w")
        cfg = c.kubelet.container_config("default", "w", "main")
        paths = [m.container_path for m in cfg.mounts]
        assert paths.count("/usr/local/vgpu/hamid.limits") == 1, paths
        lim = c.env.limits_of(cfg)
        uuids = [c.device(f"gpu-{i}")["attributes"]["uuid"]["string"] for i in (0, 1)]
        assert [(d.uuid, d.memory_bytes, d.sm_percent) for d in lim.devices] == \
            [(uuids[0], 81559 * MiB, 0), (uuids[1], 81559 * MiB, 0)]
        assert cfg.env["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)
        assert (cfg.env["CUDA_DEVICE_MEMORY_LIMIT_0"], cfg.env["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("81559m", "81559m")
