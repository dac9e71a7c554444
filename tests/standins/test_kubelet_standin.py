"""The kubelet stand-in (tests/standins/kubelet.py) against a tiny device plugin
written here (not hamid's): registration, ListAndWatch, admission order,
preferred allocation, CDI, checkpoint and restart, pod-resources."""

from __future__ import annotations

import json
import queue
import shutil
import tempfile
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import yaml
from kubelet import KubeletStandIn, StartContainerError

from hamid.kubelet.api import (API_VERSION, HEALTHY, UNHEALTHY, deviceplugin_pb2 as dp, deviceplugin_pb2_grpc,
                               podresources_pb2 as pr, podresources_pb2_grpc)

RES = "example.com/gpu"


class TinyPlugin(deviceplugin_pb2_grpc.DevicePluginServicer):
    """A few lines of device plugin: records every call, answers Allocate
    with the IDs in an env, streams what the test sends."""

    def __init__(self, plugin_dir: Path, name: str, ids, *, pre_start=False, preferred=None, numa=None):
        self.dir, self.name = plugin_dir, name
        self.options = dp.DevicePluginOptions(pre_start_required=pre_start,
                                              get_preferred_allocation_available=preferred is not None)
        self.preferred = preferred  # (available, must_include, size) -> IDs
        self.events: list[tuple] = []
        self.lists: queue.Queue = queue.Queue()
        self.allocate_error = self.pre_start_error = None
        self.allocate_fail_from = 1  # the first Allocate call (1-based) that fails with allocate_error
        self.cdi: list[str] = []
        self.numa = numa or {}
        self.send(ids)
        self.server = None

    def devices(self, ids, unhealthy=()):
        return [dp.Device(ID=i, health=UNHEALTHY if i in unhealthy else HEALTHY,
                          topology=dp.TopologyInfo(nodes=[dp.NUMANode(ID=self.numa[i])]) if i in self.numa else None)
                for i in ids]

    def send(self, ids, unhealthy=()):
        self.lists.put(self.devices(ids, unhealthy))

    def GetDevicePluginOptions(self, request, context):
        self.events.append(("GetDevicePluginOptions",))
        return self.options

    def ListAndWatch(self, request, context):
        self.events.append(("ListAndWatch",))
        while context.is_active():
            try:
                devs = self.lists.get(timeout=0.05)
            except queue.Empty:
                continue
            if devs is None:
                return
            yield dp.ListAndWatchResponse(devices=devs)

    def GetPreferredAllocation(self, request, context):
        (c,) = request.container_requests
        self.events.append(("GetPreferredAllocation", tuple(c.available_deviceIDs),
                            tuple(c.must_include_deviceIDs), c.allocation_size))
        return dp.PreferredAllocationResponse(container_responses=[dp.ContainerPreferredAllocationResponse(
            deviceIDs=self.preferred(list(c.available_deviceIDs), list(c.must_include_deviceIDs),
                                     c.allocation_size))])

    def Allocate(self, request, context):
        (c,) = request.container_requests
        ids = tuple(c.devices_ids)
        self.events.append(("Allocate", ids))
        if self.allocate_error and len(self.calls("Allocate")) >= self.allocate_fail_from:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, self.allocate_error)
        return dp.AllocateResponse(container_responses=[dp.ContainerAllocateResponse(
            envs={"TINY_IDS": ",".join(ids)},
            mounts=[dp.Mount(container_path="/etc/tiny", host_path=f"/var/tiny/{ids[0]}", read_only=True)],
            devices=[dp.DeviceSpec(container_path=f"/dev/tiny-{i}", host_path=f"/dev/tiny-{i}", permissions="rw")
                     for i in ids],
            cdi_devices=[dp.CDIDevice(name=n) for n in self.cdi])])

    def PreStartContainer(self, request, context):
        self.events.append(("PreStartContainer", tuple(request.devices_ids)))
        if self.pre_start_error:
            context.abort(grpc.StatusCode.UNAVAILABLE, self.pre_start_error)
        return dp.PreStartContainerResponse()

    def serve(self):
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        deviceplugin_pb2_grpc.add_DevicePluginServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix:{self.dir / self.name}")
        self.server.start()
        return self

    def register(self, *, version=API_VERSION, resource=RES, options=None):
        with grpc.insecure_channel(f"unix:{self.dir / 'kubelet.sock'}") as ch:
            deviceplugin_pb2_grpc.RegistrationStub(ch).Register(dp.RegisterRequest(
                version=version, endpoint=self.name, resource_name=resource,
                options=options if options is not None else self.options), timeout=15)
        self.events.append(("Register returned",))

    def stop(self):
        self.lists.put(None)
        if self.server is not None:
            self.server.stop(grace=None).wait()

    def calls(self, *names):
        return [e for e in self.events if e[0] in names]


@pytest.fixture
def root():
    # Short: a unix socket path holds at most 107 bytes.
    d = Path(tempfile.mkdtemp(prefix="kls-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def kubelet(root):
    k = KubeletStandIn(root, node_name="node-a")
    k.start()
    yield k
    k.stop()


@pytest.fixture
def plugins():
    made = []
    yield made
    for p in made:
        p.stop()


def plugin(kubelet, plugins, ids=("d0", "d1", "d2", "d3"), name="tiny.sock", register=True, **kw):
    p = TinyPlugin(kubelet.plugin_dir, name, list(ids), **kw).serve()
    plugins.append(p)
    if register:
        p.register()
        kubelet.wait_for_devices(RES, len(ids), timeout=5)
    return p


def pod(name, containers, init=(), uid=None, namespace="default"):
    def c(spec):
        cname, n, *rest = spec
        out = {"name": cname, "resources": {"limits": {RES: n, "cpu": "1"}}}
        if rest:
            out["restartPolicy"] = rest[0]
        return out

    return {"metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"},
            "spec": {"initContainers": [c(x) for x in init], "containers": [c(x) for x in containers]}}


def wait(cond, what, timeout=5.0):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# ---------------------------------------------------------------------------


def test_register_dials_and_asks_options_inside_the_call_then_listandwatch(kubelet, plugins):
    # The request says no PreStart; GetDevicePluginOptions says yes: kubelet uses the latter.
    p = plugin(kubelet, plugins, pre_start=True, register=False)
    p.register(options=dp.DevicePluginOptions(pre_start_required=False))
    names = [e[0] for e in p.events]
    assert names.index("GetDevicePluginOptions") < names.index("Register returned")
    wait(lambda: ("ListAndWatch",) in p.events, "ListAndWatch")
    assert names.count("GetDevicePluginOptions") == 1
    assert kubelet.wait_for_devices(RES, 4) == ["d0", "d1", "d2", "d3"]
    manifest = pod("p", [("c", 1)])
    assert kubelet.admit(manifest).admitted
    kubelet.start_container(manifest, "c")
    assert p.calls("PreStartContainer") == [("PreStartContainer", ("d0",))]


def test_register_refuses_a_wrong_version_a_bad_resource_and_an_absent_plugin(kubelet, plugins):
    p = plugin(kubelet, plugins, register=False)
    with pytest.raises(grpc.RpcError, match="'v1alpha'.*not supported.*'v1beta1'"):
        p.register(version="v1alpha")
    with pytest.raises(grpc.RpcError, match="'cpu'.*not an extended resource"):
        p.register(resource="cpu")
    assert p.calls("GetDevicePluginOptions") == []
    assert kubelet.dial_timeout == 10.0  # kubelet's blocking dial; shortened here to keep the test fast
    kubelet.dial_timeout = 0.5
    ghost = TinyPlugin(kubelet.plugin_dir, "ghost.sock", ["x"])  # never served
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError, match="failed to dial device plugin: .*ghost.sock: no answer in 0.5 s"):
        ghost.register()
    assert time.monotonic() - t0 >= 0.5
    assert kubelet.devices(RES) == {}


def test_listandwatch_replaces_the_set_and_a_dead_stream_makes_all_unhealthy(kubelet, plugins):
    p = plugin(kubelet, plugins)
    p.send(["d0", "d1", "d4"], unhealthy=["d1"])
    kubelet.wait_for_devices(RES, 2)
    assert sorted(kubelet.devices(RES)) == ["d0", "d1", "d4"]  # d2, d3 gone: a full replacement
    assert kubelet.healthy(RES) == ["d0", "d4"]
    p.lists.put(None)  # the plugin ends its stream
    kubelet.wait_for_devices(RES, 0)
    assert {d.health for d in kubelet.devices(RES).values()} == {UNHEALTHY}
    assert sorted(kubelet.devices(RES)) == ["d0", "d1", "d4"]


def test_the_newest_registration_wins(kubelet, plugins):
    old = plugin(kubelet, plugins)
    new = plugin(kubelet, plugins, ids=["n0", "n1"], name="tiny2.sock")
    assert kubelet.healthy(RES) == ["n0", "n1"]
    old.send(["d0", "d1", "d2"])  # a replaced plugin's messages change nothing
    old.lists.put(None)  # nor does the end of its stream
    time.sleep(0.3)
    assert kubelet.healthy(RES) == ["n0", "n1"]
    assert kubelet.admit(pod("p", [("c", 1)])).admitted
    assert new.calls("Allocate") == [("Allocate", ("n0",))] and old.calls("Allocate") == []


def test_init_container_devices_are_reused_and_allocate_prestart_run_in_kubelets_order(kubelet, plugins):
    p = plugin(kubelet, plugins, pre_start=True)
    manifest = pod("p", [("app1", 1), ("app2", 2)], init=[("init", 1)])
    got = kubelet.admit(manifest)
    assert got.admitted, got.message
    assert got.devices == {"init": {RES: ["d0"]}, "app1": {RES: ["d0"]}, "app2": {RES: ["d1", "d2"]}}
    for c in ("init", "app1", "app2"):
        kubelet.start_container(manifest, c)
    kubelet.start_container(manifest, "app1")  # a restart: PreStart again, no new Allocate
    assert p.calls("Allocate", "PreStartContainer") == [
        ("Allocate", ("d0",)), ("Allocate", ("d0",)), ("Allocate", ("d1", "d2")),
        ("PreStartContainer", ("d0",)), ("PreStartContainer", ("d0",)), ("PreStartContainer", ("d1", "d2")),
        ("PreStartContainer", ("d0",))]
    entries = kubelet.read_checkpoint()["entries"]
    assert [(e["container"], e["deviceIDs"]) for e in entries] == [
        ("app1", ["d0"]), ("app2", ["d1", "d2"]), ("init", ["d0"])]
    assert kubelet.free(RES) == ["d3"]


def test_a_sidecar_keeps_its_devices(kubelet, plugins):
    plugin(kubelet, plugins)
    got = kubelet.admit(pod("s", [("app", 1)], init=[("sidecar", 1, "Always"), ("plain", 1)]))
    # plain init reuses nothing (the sidecar's device stays the sidecar's); app reuses plain's.
    assert got.devices == {"sidecar": {RES: ["d0"]}, "plain": {RES: ["d1"]}, "app": {RES: ["d1"]}}


def test_pick_strategies_and_not_enough_devices(root, plugins):
    for pick, want in (("first", ["d0", "d1"]), ("reverse", ["d3", "d2"])):
        k = KubeletStandIn(root / pick, node_name="n", pick=pick)
        k.start()
        try:
            plugin(k, plugins, name=f"{pick}.sock")
            assert k.admit(pod("p", [("c", 2)])).devices == {"c": {RES: want}}
            failed = k.admit(pod("q", [("c", 3)]))
            assert not failed.admitted and failed.reason == "UnexpectedAdmissionError"
            assert failed.message == ("Allocate failed due to requested number of devices unavailable for "
                                      "example.com/gpu. Requested: 3, Available: 2, which is unexpected")
        finally:
            k.stop()
    seen = []
    for seed in (1, 1, 2):
        k = KubeletStandIn(root / f"r{len(seen)}", node_name="n", pick="random", seed=seed)
        k.start()
        try:
            plugin(k, plugins, ids=[f"d{i}" for i in range(16)], name=f"r{len(seen)}.sock")
            seen.append(k.admit(pod("p", [("c", 4)])).devices["c"][RES])
        finally:
            k.stop()
    assert seen[0] == seen[1] != seen[2]
    with pytest.raises(ValueError, match="pick 'best' is not one of first, random, reverse"):
        KubeletStandIn(root, node_name="n", pick="best")


def test_get_preferred_allocation_is_asked_and_honoured(kubelet, plugins):
    answers = {}

    def prefer(available, must, size):
        return answers.get("next") or (must + [i for i in reversed(available) if i not in must])[:size]

    p = plugin(kubelet, plugins, ids=[f"d{i}" for i in range(6)], preferred=prefer)
    manifest = pod("p", [("app", 2)], init=[("init", 1)])
    assert kubelet.admit(manifest).devices == {"init": {RES: ["d5"]}, "app": {RES: ["d5", "d4"]}}
    asks = p.calls("GetPreferredAllocation")
    assert asks[0] == ("GetPreferredAllocation", tuple(f"d{i}" for i in range(6)), (), 1)
    # The app container: the init's device is a must-include, and is among the available.
    assert asks[1] == ("GetPreferredAllocation", tuple(f"d{i}" for i in range(6)), ("d5",), 2)
    assert p.calls("Allocate") == [("Allocate", ("d5",)), ("Allocate", ("d5", "d4"))]
    # An answer naming held or unknown devices: its valid part is honoured, the rest picked.
    answers["next"] = ["d4", "zz", "d2"]
    assert kubelet.admit(pod("q", [("c", 2)])).devices == {"c": {RES: ["d2", "d0"]}}


def test_allocate_and_prestart_errors_carry_the_plugins_message(kubelet, plugins):
    p = plugin(kubelet, plugins, pre_start=True)
    p.allocate_error = "no reservation for these devices"
    p.allocate_fail_from = 2  # container a gets its device, b's Allocate fails
    got = kubelet.admit(pod("p", [("a", 1), ("b", 1)]))
    assert not got.admitted and got.reason == "UnexpectedAdmissionError"
    assert p.calls("Allocate") == [("Allocate", ("d0",)), ("Allocate", ("d1",))]
    # The failed pod frees what container a had.
    assert got.message == ("Allocate failed due to rpc error: code = FailedPrecondition desc = no reservation "
                           "for these devices, which is unexpected")
    assert kubelet.free(RES) == ["d0", "d1", "d2", "d3"] and kubelet.allocations("uid-p") == {}
    p.allocate_error = None
    manifest = pod("q", [("a", 1)])
    assert kubelet.admit(manifest).admitted
    p.pre_start_error = "limits file not ready"
    with pytest.raises(StartContainerError, match="PreStartContainer rpc failed.*limits file not ready"):
        kubelet.start_container(manifest, "a")


def test_a_start_with_nothing_cached_allocates_afresh_unless_prestart_needs_the_cache(kubelet, plugins):
    p = plugin(kubelet, plugins)
    never = pod("never", [("c", 1)])  # kubelet restarted before it admitted/checkpointed this pod
    assert kubelet.start_container(never, "c").env == {"TINY_IDS": "d0"}
    assert p.calls("Allocate") == [("Allocate", ("d0",))] and kubelet.allocations(never) == {"c": {RES: ["d0"]}}
    p.options.pre_start_required = True
    kubelet.restart()
    p.stop()
    plugins.remove(p)
    p2 = plugin(kubelet, plugins, pre_start=True)
    with pytest.raises(StartContainerError, match="no devices found allocated in local cache for pod uid-x, "
                                                  "container c, resource example.com/gpu"):
        kubelet.start_container(pod("x", [("c", 1)]), "c")
    assert p2.calls("Allocate", "PreStartContainer") == []
    kubelet.remove_pod(never)
    with pytest.raises(ValueError, match="was removed"):
        kubelet.start_container(never, "c")


def test_held_devices_gone_unhealthy_fail_a_second_admission(kubelet, plugins):
    p = plugin(kubelet, plugins)
    manifest = pod("p", [("c", 1)])
    assert kubelet.admit(manifest).devices == {"c": {RES: ["d0"]}}
    p.send(["d0", "d1", "d2", "d3"], unhealthy=["d0"])
    kubelet.wait_for_devices(RES, 3)
    again = kubelet.admit(manifest)
    assert not again.admitted and "previously allocated devices are no longer healthy" in again.message
    assert len(p.calls("Allocate")) == 1


def test_container_config_from_allocate_and_cdi_specs(root, plugins):
    etc, run = root / "etc-cdi", root / "run-cdi"
    etc.mkdir()
    run.mkdir()
    spec = {"cdiVersion": "0.6.0", "kind": "example.com/gpu",
            "containerEdits": {"env": ["GLOBAL=1", "WHO=global"],
                               "deviceNodes": [{"path": "/dev/tinyctl", "major": 195, "minor": 255}]},
            "devices": [{"name": "g0", "containerEdits": {
                "env": ["WHO=g0", "TINY_IDS=from-cdi"],
                "deviceNodes": [{"path": "/dev/tiny0", "hostPath": "/dev/tiny-d0", "type": "c", "major": 195,
                                 "minor": 0, "permissions": "rw"}],
                "mounts": [{"hostPath": "/var/lib/limits/p", "containerPath": "/etc/limits",
                            "options": ["ro", "nosuid", "nodev", "bind"]}],
                "hooks": [{"hookName": "createContainer", "path": "/bin/true"}]}}]}
    (etc / "tiny.yaml").write_text(yaml.safe_dump(spec))
    # A higher-priority directory redefines g1 only.
    (etc / "other.json").write_text(json.dumps({**spec, "kind": "example.com/other", "devices": [
        {"name": "g1", "containerEdits": {"env": ["WHO=etc"]}}]}))
    (run / "other.json").write_text(json.dumps({"cdiVersion": "0.6.0", "kind": "example.com/other", "devices": [
        {"name": "g1", "containerEdits": {"env": ["WHO=run"]}}]}))
    k = KubeletStandIn(root / "k", node_name="n", cdi_dirs=(etc, run))
    k.start()
    try:
        p = plugin(k, plugins)
        p.cdi = ["example.com/gpu=g0"]
        manifest = pod("p", [("c", 1)])
        assert k.admit(manifest).admitted
        cfg = k.start_container(manifest, "c")
        assert cfg.env == {"TINY_IDS": "from-cdi", "GLOBAL": "1", "WHO": "g0"}  # device edits after global
        assert [d.path for d in cfg.device_nodes] == ["/dev/tiny-d0", "/dev/tinyctl", "/dev/tiny0"]
        assert cfg.device_nodes[0].permissions == "rw" and cfg.device_nodes[2].major == 195
        assert cfg.mount("/etc/tiny").host_path == "/var/tiny/d0" and cfg.mount("/etc/tiny").read_only
        assert cfg.mount("/etc/limits").read_only and cfg.mount("/etc/limits").host_path == "/var/lib/limits/p"
        assert cfg.hooks == [{"hookName": "createContainer", "path": "/bin/true"}]
        assert cfg.cdi_devices == ["example.com/gpu=g0"]

        p.cdi = ["example.com/other=g1"]
        m2 = pod("q", [("c", 1)])
        assert k.admit(m2).admitted
        assert k.start_container(m2, "c").env["WHO"] == "run"

        p.cdi = ["example.com/gpu=g9"]
        m3 = pod("r", [("c", 1)])
        assert k.admit(m3).admitted
        with pytest.raises(StartContainerError, match="unresolvable CDI devices example.com/gpu=g9"):
            k.start_container(m3, "c")
        (etc / "broken.yaml").write_text(yaml.safe_dump({"cdiVersion": "0.6.0", "kind": "example.com/gpu",
                                                         "devices": [{"name": "g9", "bogus": 1}]}))
        with pytest.raises(StartContainerError, match=r"unresolvable.*broken.yaml.*unknown fields \['bogus'\]"):
            k.start_container(m3, "c")
    finally:
        k.stop()


def test_checkpoint_survives_restart_and_the_plugin_registers_again(kubelet, plugins):
    p = plugin(kubelet, plugins)
    old = pod("old", [("c", 2)])
    assert kubelet.admit(old).devices == {"c": {RES: ["d0", "d1"]}}
    assert oct(kubelet.checkpoint.stat().st_mode & 0o777) == "0o600"
    kubelet.restart()
    assert not (kubelet.plugin_dir / "tiny.sock").exists()  # the plugin's socket is deleted
    assert kubelet.socket.exists() and kubelet.checkpoint.exists()
    assert kubelet.healthy(RES) == [] and kubelet.allocations(old) == {"c": {RES: ["d0", "d1"]}}
    failed = kubelet.admit(pod("early", [("c", 1)]))
    assert not failed.admitted and "no healthy devices present; cannot allocate unhealthy devices" in failed.message
    # The checkpointed answer serves the old pod's start: no Allocate, no plugin needed.
    assert kubelet.start_container(old, "c").env == {"TINY_IDS": "d0,d1"}
    p.stop()
    plugins.remove(p)
    again = plugin(kubelet, plugins)  # re-serves its socket and registers on the new kubelet.sock
    assert again.calls("GetDevicePluginOptions") and kubelet.free(RES) == ["d2", "d3"]
    assert kubelet.admit(pod("new", [("c", 2)])).devices == {"c": {RES: ["d2", "d3"]}}
    assert again.calls("Allocate") == [("Allocate", ("d2", "d3"))]


def test_a_resource_registered_before_a_restart_has_no_devices_until_its_plugin_returns(kubelet, plugins):
    plugin(kubelet, plugins)
    kubelet.restart()  # no pod ever held a device: the registration itself is checkpointed
    assert kubelet.read_checkpoint()["registeredDevices"] == {RES: ["d0", "d1", "d2", "d3"]}
    failed = kubelet.admit(pod("p", [("c", 0)]))  # even a count of 0, as kubelet checks health first
    assert not failed.admitted and failed.message == ("Allocate failed due to no healthy devices present; cannot "
                                                      "allocate unhealthy devices example.com/gpu, which is unexpected")


def test_pod_resources_list_get_and_allocatable(root, plugins):
    k = KubeletStandIn(root, node_name="node-a", pod_resources_qps=0.001, pod_resources_burst=5)
    k.start()
    try:
        plugin(k, plugins, numa={"d0": 0, "d1": 0, "d2": 1, "d3": 1})
        a = pod("a", [("app", 2)], init=[("sidecar", 1, "Always"), ("setup", 1)], namespace="ml")
        b = pod("b", [("one", 1)])
        assert k.admit(a).admitted and k.admit(b).admitted
        with grpc.insecure_channel(f"unix:{k.pod_resources_socket}") as ch:
            stub = podresources_pb2_grpc.PodResourcesListerStub(ch)
            listed = {(x.namespace, x.name): x for x in stub.List(pr.ListPodResourcesRequest()).pod_resources}
            assert sorted(listed) == [("default", "b"), ("ml", "a")]
            pa = listed[("ml", "a")]
            # The sidecar is listed, the plain init container is not (as kubelet lists them).
            assert [c.name for c in pa.containers] == ["sidecar", "app"]
            by = {c.name: [(d.resource_name, list(d.device_ids), [n.ID for n in d.topology.nodes])
                           for d in c.devices] for c in pa.containers}
            assert by == {"sidecar": [(RES, ["d0"], [0])], "app": [(RES, ["d1"], [0]), (RES, ["d2"], [1])]}
            got = stub.Get(pr.GetPodResourcesRequest(pod_name="b", pod_namespace="default")).pod_resources
            assert got.name == "b" and [list(d.device_ids) for d in got.containers[0].devices] == [["d3"]]
            with pytest.raises(grpc.RpcError, match="pod b in namespace ml not found"):
                stub.Get(pr.GetPodResourcesRequest(pod_name="b", pod_namespace="ml"))
            alloc = stub.GetAllocatableResources(pr.AllocatableResourcesRequest()).devices
            assert [(d.resource_name, list(d.device_ids), d.topology.nodes[0].ID) for d in alloc] == [
                (RES, ["d0"], 0), (RES, ["d1"], 0), (RES, ["d2"], 1), (RES, ["d3"], 1)]
            k.remove_pod(b)
            assert [x.name for x in stub.List(pr.ListPodResourcesRequest()).pod_resources] == ["a"]
            assert k.free(RES) == ["d3"]
            with pytest.raises(grpc.RpcError) as e:  # the 6th call in a burst of 5
                stub.List(pr.ListPodResourcesRequest())
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and e.value.details() == \
                "rejected by rate limit"
    finally:
        k.stop()


def test_pod_resources_list_builds_only_what_changed_and_stays_exact(root, plugins, monkeypatch):
    """List answers from each pod's message built once (kubelet's List is Go, sub-millisecond; the
    stand-in rebuilding every pod per call put its own cost into what the benches time): a pod
    admitted since the last List is the only one built again, and what List says is always what
    a fresh build says, after an admission, a removal and a device's NUMA node changing."""
    k = KubeletStandIn(root, node_name="node-a", pod_resources_qps=1000, pod_resources_burst=1000)
    k.start()
    try:
        p = plugin(k, plugins, ids=[f"d{i}" for i in range(8)], numa={f"d{i}": 0 for i in range(8)})
        pods = [pod(f"p{i}", [("c", 1)]) for i in range(6)]
        for x in pods[:5]:
            assert k.admit(x).admitted
        built = []
        real = k._pod_message
        monkeypatch.setattr(k, "_pod_message", lambda q: built.append(q.name) or real(q))

        def listed():
            with grpc.insecure_channel(f"unix:{k.pod_resources_socket}") as ch:
                got = podresources_pb2_grpc.PodResourcesListerStub(ch).List(pr.ListPodResourcesRequest())
            fresh = pr.ListPodResourcesResponse(pod_resources=[real(q) for q in k._pods.values()])
            assert got == fresh
            return [(x.name, [(list(d.device_ids), [n.ID for n in d.topology.nodes])
                              for c in x.containers for d in c.devices]) for x in got.pod_resources]

        listed()
        assert sorted(built) == ["p0", "p1", "p2", "p3", "p4"]
        built.clear()
        listed()
        assert built == []  # nothing changed: nothing built
        assert k.admit(pods[5]).admitted
        assert [n for n, _ in listed()] == ["p0", "p1", "p2", "p3", "p4", "p5"]
        assert built == ["p5"]
        built.clear()
        k.remove_pod(pods[2])
        assert [n for n, _ in listed()] == ["p0", "p1", "p3", "p4", "p5"] and built == []
        # a device moved to NUMA node 1: every message that names it is built again
        p.numa = {f"d{i}": 1 for i in range(8)}
        p.send([f"d{i}" for i in range(8)])
        wait(lambda: all(d.numa_nodes == (1,) for d in k.devices(RES).values()), "NUMA node 1")
        assert {tuple(n for _, ns in devs for n in ns) for _, devs in listed()} == {(1,)}
        # a health change alone rebuilds nothing
        built.clear()
        p.send([f"d{i}" for i in range(8)], unhealthy=["d7"])
        wait(lambda: k.devices(RES)["d7"].health == UNHEALTHY, "d7 unhealthy")
        listed()
        assert built == []
    finally:
        k.stop()


def test_bad_pods_are_refused_with_the_bad_value_named(kubelet):
    with pytest.raises(ValueError, match=r"limits\[example.com/gpu\]: '1.5' is not an integer quantity"):
        kubelet.admit(pod("p", [("c", "1.5")]))
    bound = pod("p", [("c", 1)])
    bound["spec"]["nodeName"] = "node-b"
    with pytest.raises(ValueError, match="bound to node 'node-b', not this kubelet's 'node-a'"):
        kubelet.admit(bound)
    with pytest.raises(ValueError, match="has no container 'nope'; containers: \\['c'\\]"):
        kubelet.start_container(pod("p", [("c", 1)]), "nope")
