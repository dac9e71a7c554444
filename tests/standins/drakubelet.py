"""A STAND-IN for kubelet's DRA manager and plugin watcher (tests only).

No kubelet can run on these machines, so the tests talk to this instead. It
speaks the real protocols (gRPC over unix sockets; the generated code in
``hamid.dra.api``, whose wire facts ``tests/k8s/test_protos.py`` pins) and
does what kubelet does, in kubelet's order:

* Plugin watcher: ``<root>/plugins_registry`` is scanned (kubelet uses
  fsnotify; here a look every 50 ms): for each new socket (names starting
  with ``.`` are ignored, as kubelet does), ``GetInfo``; a
  plugin of type ``DRAPlugin`` whose ``supported_versions`` has
  ``v1.DRAPlugin`` or ``v1beta1.DRAPlugin`` is registered under its name
  with its endpoint (the newest kubelet knows is used), then
  ``NotifyRegistrationStatus(plugin_registered=true)``; anything else is told
  ``plugin_registered=false`` with the reason. A socket that disappears
  deregisters its driver; if it has not registered again ``wipe_delay``
  seconds later (kubelet: 30 s), the node's ResourceSlices of that driver are
  deleted, as kubelet's DRA manager wipes a driver that went away.
* :meth:`prepare_pod` (before a pod's containers start): each of the pod's
  claims (``resourceClaimStatuses``, ``resourceClaimName``,
  ``extendedResourceClaimStatus``) is read from the API server; it must be
  allocated and reserved for the pod; claims are grouped by driver and sent
  in one ``NodePrepareResources`` per driver (45 s deadline). A gRPC error,
  a missing entry or a claim's ``error`` fails the pod's start: an Event
  ``FailedPrepareDynamicResources`` (Warning) on the pod, and
  :class:`PrepareFailed` with kubelet's wording. A claim prepared before is
  not sent again (kubelet's claim info cache).
* :meth:`container_config`: what the runtime puts in a container: the CDI
  devices of the claims the container names in ``resources.claims`` (all of
  a claim's devices, or the named request's), and those of the extended
  resource claim mapped to it, resolved from the CDI spec files in
  ``cdi_dirs`` (the device plugin kubelet stand-in's resolver).
* :meth:`unprepare_pod` (after the pod's last container ended and before it
  is deleted): ``NodeUnprepareResources`` for the claims no other prepared
  pod uses.

What it does NOT do: a checkpoint across its own restarts, DRA health
(``DRAResourceHealth``), rolling-update sockets, the ``dra_*`` metrics, and
resource claim status (``status.devices``) writes.
"""

from __future__ import annotations

import datetime as _dt
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx

from hamid.dra.api import dra_pb2 as pb
from hamid.dra.api import pluginregistration_pb2 as reg_pb
from hamid.dra.api import pluginregistration_pb2_grpc as reg_grpc
from kubelet import ContainerConfig, _apply_cdi, _CdiRegistry

REGISTRY_DIR = "plugins_registry"
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # newest first, as registration names them
# the gRPC service kubelet's generated client of each calls (its proto package names the path)
GRPC_SERVICES = {"v1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
                 "v1beta1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"}
PLUGIN_TIMEOUT_S = 45.0


class PrepareFailed(Exception):
    """The pod cannot start: kubelet's message."""


@dataclass
class Driver:
    name: str
    endpoint: str
    service: str
    socket: str


@dataclass
class Prepared:
    claim: dict
    driver_devices: list = field(default_factory=list)  # pb.Device answers
    pods: set = field(default_factory=set)


def _stub_call(endpoint: str, service: str, method: str, request, response_type, timeout: float):
    with grpc.insecure_channel(f"unix:{endpoint}") as ch:
        call = ch.unary_unary(f"/{GRPC_SERVICES[service]}/{method}", request_serializer=type(request).SerializeToString,
                              response_deserializer=response_type.FromString)
        return call(request, timeout=timeout)


class DraKubeletStandIn:
    def __init__(self, root: Path, *, node_name: str, api_url: str, token: str = "standin",
                 cdi_dirs: tuple[Path | str, ...] = (), wipe_delay: float = 30.0) -> None:
        self.root = Path(root)
        self.node = node_name
        self.cdi_dirs = tuple(Path(d) for d in cdi_dirs)
        self.http = httpx.Client(base_url=api_url.rstrip("/"), timeout=10, headers={"Authorization": f"Bearer {token}"})
        self.drivers: dict[str, Driver] = {}
        self.refused: dict[str, str] = {}  # socket -> why
        self.calls: list[tuple[str, str, list[str]]] = []  # (driver, method, claim uids)
        self.prepared: dict[str, Prepared] = {}  # claim uid -> what the driver answered
        self._seen: dict[str, float] = {}
        self.wipe_delay = wipe_delay
        self._gone: dict[str, float] = {}  # driver -> when it deregistered
        self.wiped: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # --- the plugin watcher ----------------------------------------------------------------

    def start(self) -> "DraKubeletStandIn":
        (self.root / REGISTRY_DIR).mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._watch, name="dra-kubelet-standin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.http.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _watch(self) -> None:
        d = self.root / REGISTRY_DIR
        while not self._stop.is_set():
            try:
                now = {}
                for e in os.scandir(d):
                    if e.name.startswith("."):  # kubelet's plugin watcher ignores hidden files: a socket being made
                        continue
                    if stat.S_ISSOCK(e.stat(follow_symlinks=False).st_mode):
                        now[e.path] = e.stat().st_ctime
                for path, ctime in now.items():
                    if self._seen.get(path) != ctime:
                        self._seen[path] = ctime
                        self._register(path)
                for path in set(self._seen) - set(now):
                    del self._seen[path]
                    with self._lock:
                        for name, drv in list(self.drivers.items()):
                            if drv.socket == path:
                                del self.drivers[name]
                                self._gone[name] = time.monotonic()
                self._wipe_gone()
            except OSError:
                pass
            self._stop.wait(0.05)

    def _wipe_gone(self) -> None:
        for name, since in list(self._gone.items()):
            with self._lock:
                back = name in self.drivers
            if back:
                del self._gone[name]
            elif time.monotonic() - since >= self.wipe_delay:
                del self._gone[name]
                r = self.http.get("/apis/resource.k8s.io/v1/resourceslices",
                                  params={"fieldSelector": f"spec.nodeName={self.node},spec.driver={name}"})
                for s in r.json().get("items") or [] if r.status_code == 200 else []:
                    self.http.delete(f"/apis/resource.k8s.io/v1/resourceslices/{s['metadata']['name']}")
                self.wiped.append(name)

    def _register(self, path: str) -> None:
        try:
            with grpc.insecure_channel(f"unix:{path}") as ch:
                stub = reg_grpc.RegistrationStub(ch)
                info = stub.GetInfo(reg_pb.InfoRequest(), timeout=10)
                why = ""
                if info.type != "DRAPlugin":
                    why = f"plugin type {info.type!r} is not handled here (only DRAPlugin)"
                service = next((s for s in SERVICES if s in info.supported_versions), None)
                if not why and service is None:
                    why = (f"none of the supported versions {list(info.supported_versions)} is one kubelet knows "
                           f"({', '.join(SERVICES)})")
                if not why and not os.path.isabs(info.endpoint):
                    why = f"endpoint {info.endpoint!r} is not an absolute path"
                stub.NotifyRegistrationStatus(reg_pb.RegistrationStatus(plugin_registered=not why, error=why),
                                              timeout=10)
        except grpc.RpcError as e:
            self.refused[path] = f"GetInfo failed: {e.code().name} {e.details()}"
            return
        if why:
            self.refused[path] = why
            return
        with self._lock:
            self.drivers[info.name] = Driver(info.name, info.endpoint, service, path)

    def wait_registered(self, driver: str, timeout: float = 10.0) -> Driver:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if driver in self.drivers:
                    return self.drivers[driver]
            time.sleep(0.02)
        raise TimeoutError(f"driver {driver} did not register within {timeout} s (refused: {self.refused})")

    # --- claims of a pod ---------------------------------------------------------------------

    def _pod(self, ns: str, name: str) -> dict:
        r = self.http.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        r.raise_for_status()
        return r.json()

    def _claim_names(self, pod: dict) -> list[str]:
        status = pod.get("status") or {}
        by_status = {s["name"]: s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []}
        out = []
        for rc in (pod.get("spec") or {}).get("resourceClaims") or []:
            name = rc.get("resourceClaimName") or by_status.get(rc["name"])
            if name:
                out.append(name)
        ext = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
        if ext:
            out.append(ext)
        return out

    def _event(self, pod: dict, reason: str, message: str) -> None:
        m = pod["metadata"]
        self.http.post(f"/api/v1/namespaces/{m['namespace']}/events", json={
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{m['name']}.{time.time_ns():x}", "namespace": m["namespace"]},
            "involvedObject": {"kind": "Pod", "namespace": m["namespace"], "name": m["name"], "uid": m["uid"]},
            "reason": reason, "message": message, "type": "Warning", "source": {"component": "kubelet",
                                                                                 "host": self.node},
            "firstTimestamp": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")})

    def prepare_pod(self, ns: str, name: str) -> None:
        pod = self._pod(ns, name)
        uid = pod["metadata"]["uid"]
        by_driver: dict[str, list[dict]] = {}
        try:
            for cname in self._claim_names(pod):
                r = self.http.get(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{cname}")
                if r.status_code != 200:
                    raise PrepareFailed(f"failed to fetch ResourceClaim {cname}: {r.status_code}")
                claim = r.json()
                cu = claim["metadata"]["uid"]
                status = claim.get("status") or {}
                if not status.get("allocation"):
                    raise PrepareFailed(f"ResourceClaim {cname} is not allocated")
                if not any(x.get("uid") == uid for x in status.get("reservedFor") or []):
                    raise PrepareFailed(f"pod {ns}/{name} is not allowed to use ResourceClaim {cname}: it is not "
                                        "reserved for it")
                with self._lock:
                    done = self.prepared.get(cu)
                    if done is not None:
                        done.pods.add(uid)
                        continue
                for res in status["allocation"]["devices"].get("results") or []:
                    by_driver.setdefault(res["driver"], [])
                    if claim not in by_driver[res["driver"]]:
                        by_driver[res["driver"]].append(claim)
            for driver, claims in by_driver.items():
                with self._lock:
                    drv = self.drivers.get(driver)
                if drv is None:
                    raise PrepareFailed(f"prepare dynamic resources: DRA driver {driver} is not registered")
                req = pb.NodePrepareResourcesRequest(claims=[
                    pb.Claim(namespace=c["metadata"]["namespace"], uid=c["metadata"]["uid"],
                             name=c["metadata"]["name"]) for c in claims])
                self.calls.append((driver, "NodePrepareResources", [c.uid for c in req.claims]))
                try:
                    resp = _stub_call(drv.endpoint, drv.service, "NodePrepareResources", req,
                                      pb.NodePrepareResourcesResponse, PLUGIN_TIMEOUT_S)
                except grpc.RpcError as e:
                    raise PrepareFailed(f"NodePrepareResources failed: {e.code().name}: {e.details()}") from None
                for c in claims:
                    cu = c["metadata"]["uid"]
                    got = resp.claims.get(cu)
                    if got is None:
                        raise PrepareFailed(f"NodePrepareResources skipped 1 ResourceClaim: {c['metadata']['name']}")
                    if got.error:
                        raise PrepareFailed(f"NodePrepareResources failed for ResourceClaim "
                                            f"{c['metadata']['name']}: {got.error}")
                    with self._lock:
                        self.prepared[cu] = Prepared(c, list(got.devices), {uid})
        except PrepareFailed as e:
            self._event(pod, "FailedPrepareDynamicResources", f"Failed to prepare dynamic resources: {e}")
            raise

    def cdi_ids(self, ns: str, name: str, container: str) -> list[str]:
        """The CDI devices the runtime is given for ``container``."""
        pod = self._pod(ns, name)
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        by_status = {s["name"]: s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []}
        pod_claims = {rc["name"]: rc.get("resourceClaimName") or by_status.get(rc["name"])
                      for rc in spec.get("resourceClaims") or []}
        c = next(c for c in spec.get("containers") or [] if c["name"] == container)
        wanted: list[tuple[str, str | None]] = [(pod_claims.get(x["name"]), x.get("request"))
                                                for x in (c.get("resources") or {}).get("claims") or []]
        ext = status.get("extendedResourceClaimStatus") or {}
        for m in ext.get("requestMappings") or []:
            if m.get("containerName") == container:
                wanted.append((ext["resourceClaimName"], m["requestName"]))
        out: list[str] = []
        with self._lock:
            by_name = {p.claim["metadata"]["name"]: p for p in self.prepared.values()
                       if p.claim["metadata"]["namespace"] == ns}
        for cname, request in wanted:
            p = by_name.get(cname)
            if p is None:
                raise PrepareFailed(f"claim {cname} of container {container} is not prepared")
            for d in p.driver_devices:
                names = list(d.request_names)
                if request is None or not names or any(n == request or n.split("/")[0] == request for n in names):
                    out += [i for i in d.cdi_device_ids if i not in out]
        return out

    def container_config(self, ns: str, name: str, container: str) -> ContainerConfig:
        config = ContainerConfig()
        ids = self.cdi_ids(ns, name, container)
        for edits in _CdiRegistry(self.cdi_dirs).edits_for(ids):
            _apply_cdi(config, edits)
        config.cdi_devices = ids
        return config

    def unprepare_pod(self, ns: str, name: str) -> None:
        pod = self._pod(ns, name)
        uid = pod["metadata"]["uid"]
        by_driver: dict[str, list[Prepared]] = {}
        with self._lock:
            for p in list(self.prepared.values()):
                if uid in p.pods:
                    p.pods.discard(uid)
                    if not p.pods:
                        for res in p.claim["status"]["allocation"]["devices"].get("results") or []:
                            by_driver.setdefault(res["driver"], [])
                            if p not in by_driver[res["driver"]]:
                                by_driver[res["driver"]].append(p)
        for driver, ps in by_driver.items():
            with self._lock:
                drv = self.drivers.get(driver)
            if drv is None:
                raise PrepareFailed(f"unprepare dynamic resources: DRA driver {driver} is not registered")
            req = pb.NodeUnprepareResourcesRequest(claims=[
                pb.Claim(namespace=p.claim["metadata"]["namespace"], uid=p.claim["metadata"]["uid"],
                         name=p.claim["metadata"]["name"]) for p in ps])
            self.calls.append((driver, "NodeUnprepareResources", [c.uid for c in req.claims]))
            resp = _stub_call(drv.endpoint, drv.service, "NodeUnprepareResources", req,
                              pb.NodeUnprepareResourcesResponse, PLUGIN_TIMEOUT_S)
            for p in ps:
                cu = p.claim["metadata"]["uid"]
                got = resp.claims.get(cu)
                if got is None or got.error:
                    raise PrepareFailed(f"NodeUnprepareResources failed for ResourceClaim "
                                        f"{p.claim['metadata']['name']}: {got.error if got else 'no answer'}")
                with self._lock:
                    self.prepared.pop(cu, None)
