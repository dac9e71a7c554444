"""A STAND-IN for kubelet's device manager and pod-resources server (tests only).

No kubelet can run on these machines, so the tests talk to this instead. It
speaks the real protocols (gRPC over unix sockets, the generated code in
``hamid.kubelet.api``) and does what kubelet does, in kubelet's order:

* Registration on ``<root>/device-plugins/kubelet.sock``: the version must be
  ``v1beta1`` and the resource an extended resource name; inside the call it
  dials the plugin's socket in the same directory (blocking, 10 s) and calls
  ``GetDevicePluginOptions`` (those options are used, not the request's);
  then ``ListAndWatch`` runs on its own thread, each message replacing the
  resource's whole device set. The newest registration for a resource wins;
  when the current stream ends, every device of the resource is unhealthy.
* Admission (:meth:`KubeletStandIn.admit`): init containers first, then the
  app containers; per container and per resource a registered plugin serves:
  kubelet's checks (a changed count; no healthy device at all; held devices
  gone unhealthy), devices an earlier (non-restartable) init container had
  are reused first, then free healthy devices are chosen
  (``GetPreferredAllocation`` when the plugin advertises it, its answer
  honoured for the IDs that are valid, the rest by the ``pick`` strategy),
  then ``Allocate`` with one ``ContainerAllocateRequest``, then the checkpoint
  is written. An error fails the pod's admission (``UnexpectedAdmissionError``,
  "Allocate failed due to ..., which is unexpected") and frees what the pod
  held, as kubelet frees a terminated pod's devices. ``pick="first"`` takes
  the lowest IDs; kubelet itself takes them in Go's map order, which is
  unordered: ``"random"`` (seeded) models that, ``"reverse"`` is adversarial.
* Container start (:meth:`KubeletStandIn.start_container`), per resource:
  ``PreStartContainer`` when the plugin asked for it (30 s; an error, as in
  kubelet, when nothing is cached for the container), then a fresh ``Allocate``
  if the container has no allocation (kubelet's restart race), then what containerd or CRI-O would
  put in the container: the ``Allocate`` answers' envs, mounts and device nodes,
  and the CDI devices named in ``cdi_devices`` or in ``cdi.k8s.io/*``
  annotations, resolved from the CDI spec files in ``cdi_dirs`` (later
  directories win, as ``/var/run/cdi`` wins over ``/etc/cdi``); a name no spec
  defines fails the start with "unresolvable CDI devices".
* Pod-resources v1 on ``<root>/pod-resources/kubelet.sock``: ``List``, ``Get``
  and ``GetAllocatableResources`` from the live allocations (removed pods are
  gone; restartable init containers are listed, plain init containers are not,
  as kubelet lists them), rate-limited as kubelet does (100 qps, burst 10,
  ``RESOURCE_EXHAUSTED "rejected by rate limit"``).
* :meth:`KubeletStandIn.restart`: stop serving, delete the sockets in
  ``device-plugins/`` (the checkpoint stays), serve a new ``kubelet.sock``,
  reload allocations from the checkpoint; checkpointed resources have no
  devices until their plugin registers again.

What it does NOT do: no Topology Manager (no NUMA alignment; devices without
a preferred allocation are picked by ``pick``), no node status (capacity,
allocatable), so no ``OutOf<resource>`` admission check for resources no
plugin serves (those, like node-level extended resources, are left alone, as
the device manager leaves them), no pod lifecycle beyond admit/start/remove
(no restarts counted, no pod phases), no 5-minute grace before a dead
plugin's resource is dropped, no plugin-watcher (``plugins_registry``)
registration, no CPU or memory managers (``cpu_ids``/``memory`` stay empty),
no DRA (kubelet's DRA side and plugin watcher: :mod:`drakubelet`). The checkpoint is JSON of its own design, and it also keeps the pods'
names and container lists, which kubelet takes from its pod manager.

Additions beyond the brief's API (documented here for the tests that use them):
``free(resource)``, ``allocations(pod)``, ``calls`` (every RPC the stand-in
made to a plugin, in order), ``rpc_timeout`` (a deadline for ``Allocate`` and
``GetPreferredAllocation``, which kubelet calls without one; default None),
``pod_resources_qps``/``pod_resources_burst``, ``dial_timeout`` (10 s, as
kubelet; an instance may shorten it), ``read_checkpoint()``, and the ``hooks`` and
``cdi_devices`` fields of :class:`ContainerConfig`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import re
import stat
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from hamid.kubelet.api import (API_VERSION, DEVICE_PLUGINS_DIR, HEALTHY, KUBELET_SOCKET, POD_RESOURCES_DIR,
                               UNHEALTHY, deviceplugin_pb2, deviceplugin_pb2_grpc, podresources_pb2,
                               podresources_pb2_grpc)
from hamid.logs import get_logger

log = get_logger("kubelet-standin")

CHECKPOINT = "kubelet_internal_checkpoint"
DIAL_TIMEOUT_S = 10.0  # kubelet dials a registering plugin with a 10 s blocking dial
PRE_START_TIMEOUT_S = 30.0  # KubeletPreStartContainerRPCTimeoutInSecs
PICKS = ("first", "random", "reverse")
UNIX_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
_NO_NUMA = -1


class StartContainerError(RuntimeError):
    """A container start kubelet would fail (PreStartContainer, Allocate, CDI)."""


@dataclass(frozen=True)
class Device:
    """One device as the plugin's last ListAndWatch message described it."""

    id: str
    health: str
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool
    options: tuple[str, ...] = ()  # CDI mounts' options; empty for Allocate's mounts
    type: str | None = None


@dataclass(frozen=True)
class DeviceNodeSpec:
    path: str  # inside the container
    host_path: str
    permissions: str = "rwm"
    type: str | None = None  # None: the runtime stats host_path (Allocate's DeviceSpec)
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    uid: int | None = None
    gid: int | None = None


@dataclass
class ContainerConfig:
    """What the container runtime would put in the container."""

    env: dict[str, str] = field(default_factory=dict)
    mounts: list[MountSpec] = field(default_factory=list)
    device_nodes: list[DeviceNodeSpec] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    hooks: list[dict[str, Any]] = field(default_factory=list)  # CDI hooks, as the spec states them
    cdi_devices: list[str] = field(default_factory=list)  # the qualified names resolved

    def mount(self, container_path: str) -> MountSpec:
        for m in self.mounts:
            if m.container_path == container_path:
                return m
        raise KeyError(f"no mount at {container_path!r}; mounts: {[m.container_path for m in self.mounts]}")


@dataclass
class AdmitResult:
    """The outcome of a pod's admission. ``devices[container][resource]`` are
    the IDs each container got (reused init devices included)."""

    admitted: bool
    reason: str = ""  # "" when admitted; UnexpectedAdmissionError otherwise
    message: str = ""
    devices: dict[str, dict[str, list[str]]] = field(default_factory=dict)


class AdmissionError(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


# ---------------------------------------------------------------------------
# Pod manifests


@dataclass(frozen=True)
class _Container:
    name: str
    limits: dict[str, int]  # extended resources only
    init: bool
    restartable: bool  # an init container with restartPolicy: Always (a sidecar)


@dataclass(frozen=True)
class _Pod:
    uid: str
    name: str
    namespace: str
    containers: tuple[_Container, ...]  # init containers first, in order

    def container(self, name: str) -> _Container:
        for c in self.containers:
            if c.name == name:
                return c
        raise ValueError(f"pod {self.namespace}/{self.name} has no container {name!r}; "
                         f"containers: {[c.name for c in self.containers]}")

    def to_json(self) -> dict[str, Any]:
        return {"uid": self.uid, "name": self.name, "namespace": self.namespace,
                "containers": [{"name": c.name, "limits": c.limits, "init": c.init,
                                "restartable": c.restartable} for c in self.containers]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "_Pod":
        return cls(uid=d["uid"], name=d["name"], namespace=d["namespace"],
                   containers=tuple(_Container(name=c["name"], limits=dict(c["limits"]), init=c["init"],
                                               restartable=c["restartable"]) for c in d["containers"]))


def _is_extended(resource: str) -> bool:
    if "/" not in resource:
        return False
    domain = resource.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io") or resource.startswith("requests."))


def _count(value: Any, where: str) -> int:
    """An extended resource's count: a whole quantity, in any form the API server stores (it writes
    ``1000`` as ``1k``), as kubelet's ``Quantity.Value()``."""
    from hamid.request.quantity import quantity

    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{where}: {value!r} is not an integer quantity (accepted: 3, '3', '30k', '1e3')")
    try:
        q = quantity(value)
    except ValueError:
        raise ValueError(f"{where}: {value!r} is not an integer quantity (accepted: 3, '3', '30k', '1e3')") from None
    if q.denominator != 1:
        raise ValueError(f"{where}: {value!r} is not an integer quantity (accepted: 3, '3', '30k', '1e3')")
    value = int(q)
    if value < 0:
        raise ValueError(f"{where}: {value} is negative")
    return value


def _parse_pod(pod: dict[str, Any], node_name: str) -> _Pod:
    if not isinstance(pod, dict):
        raise ValueError(f"a pod is a Pod manifest dict, not {type(pod).__name__}")
    meta = pod.get("metadata") or {}
    uid, name = meta.get("uid"), meta.get("name")
    if not uid or not name:
        raise ValueError(f"a pod needs metadata.name and metadata.uid; got name={name!r} uid={uid!r}")
    namespace = meta.get("namespace") or "default"
    spec = pod.get("spec") or {}
    bound = spec.get("nodeName")
    if bound and bound != node_name:
        raise ValueError(f"pod {namespace}/{name} is bound to node {bound!r}, not this kubelet's {node_name!r}")
    containers = []
    seen = set()
    for key, init in (("initContainers", True), ("containers", False)):
        for c in spec.get(key) or ():
            cname = c.get("name")
            if not cname or cname in seen:
                raise ValueError(f"pod {namespace}/{name}: container name {cname!r} missing or repeated")
            seen.add(cname)
            res = c.get("resources") or {}
            limits, requests = res.get("limits") or {}, res.get("requests") or {}
            ext = {}
            for r, v in limits.items():
                if _is_extended(r):
                    ext[r] = _count(v, f"pod {namespace}/{name} container {cname} limits[{r}]")
            for r, v in requests.items():
                if not _is_extended(r):
                    continue
                where = f"pod {namespace}/{name} container {cname} requests[{r}]"
                if r not in ext:
                    raise ValueError(f"{where}: an extended resource needs a limit equal to its request")
                if _count(v, where) != ext[r]:
                    raise ValueError(f"{where}: {v!r} differs from the limit {ext[r]}; they must be equal")
            restartable = init and c.get("restartPolicy") == "Always"
            containers.append(_Container(cname, ext, init, restartable))
    if not any(not c.init for c in containers):
        raise ValueError(f"pod {namespace}/{name} has no containers")
    return _Pod(uid=uid, name=name, namespace=namespace, containers=tuple(containers))


# ---------------------------------------------------------------------------
# CDI (what containerd / CRI-O do with CDI device names)

_CDI_TOP = {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}
_CDI_DEVICE = {"name", "annotations", "containerEdits"}
_CDI_EDITS = {"env", "deviceNodes", "mounts", "hooks", "additionalGids", "intelRdt", "netDevices"}
_CDI_NODE = {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"}
_CDI_MOUNT = {"hostPath", "containerPath", "type", "options"}
_CDI_HOOK = {"hookName", "path", "args", "env", "timeout"}
_CDI_KIND = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*[A-Za-z0-9]?/[A-Za-z0-9][A-Za-z0-9_.-]*")
_CDI_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")


def _check_keys(d: Any, allowed: set[str], where: str) -> dict:
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(d).__name__}")
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown fields {unknown}")
    return d


def _check_edits(edits: Any, where: str) -> dict:
    edits = _check_keys(edits or {}, _CDI_EDITS, where)
    for i, n in enumerate(edits.get("deviceNodes") or ()):
        _check_keys(n, _CDI_NODE, f"{where}.deviceNodes[{i}]")
        if not n.get("path"):
            raise ValueError(f"{where}.deviceNodes[{i}]: path missing")
    for i, m in enumerate(edits.get("mounts") or ()):
        _check_keys(m, _CDI_MOUNT, f"{where}.mounts[{i}]")
        if not m.get("hostPath") or not m.get("containerPath"):
            raise ValueError(f"{where}.mounts[{i}]: hostPath and containerPath are required")
    for i, h in enumerate(edits.get("hooks") or ()):
        _check_keys(h, _CDI_HOOK, f"{where}.hooks[{i}]")
    for i, e in enumerate(edits.get("env") or ()):
        if not isinstance(e, str) or "=" not in e:
            raise ValueError(f"{where}.env[{i}]: {e!r} is not NAME=value")
    return edits


class _CdiRegistry:
    """The CDI spec files of ``dirs``, read afresh (containerd refreshes its cache)."""

    def __init__(self, dirs: tuple[Path, ...]):
        self.devices: dict[str, tuple[int, dict, dict]] = {}  # qualified -> (priority, spec, device)
        self.conflicts: set[str] = set()
        self.errors: list[str] = []
        for priority, d in enumerate(dirs):
            if not d.is_dir():
                continue
            for path in sorted(d.iterdir()):
                if path.suffix not in (".json", ".yaml") or not path.is_file():
                    continue
                try:
                    spec = self._load(path)
                except (ValueError, OSError, yaml.YAMLError) as e:
                    self.errors.append(f"{path}: {e}")
                    continue
                for dev in spec["devices"]:
                    q = f"{spec['kind']}={dev['name']}"
                    old = self.devices.get(q)
                    if old is not None and old[0] == priority:
                        self.conflicts.add(q)
                    if old is None or old[0] <= priority:
                        self.devices[q] = (priority, spec, dev)

    @staticmethod
    def _load(path: Path) -> dict:
        text = path.read_text()
        spec = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        spec = _check_keys(spec, _CDI_TOP, "spec")
        if not spec.get("cdiVersion"):
            raise ValueError("cdiVersion missing")
        if not isinstance(spec.get("kind"), str) or not _CDI_KIND.fullmatch(spec["kind"]):
            raise ValueError(f"kind {spec.get('kind')!r} is not vendor/class")
        if not spec.get("devices"):
            raise ValueError("no devices")
        for i, dev in enumerate(spec["devices"]):
            _check_keys(dev, _CDI_DEVICE, f"devices[{i}]")
            if not isinstance(dev.get("name"), str) or not _CDI_NAME.fullmatch(dev["name"]):
                raise ValueError(f"devices[{i}]: bad name {dev.get('name')!r}")
            dev["containerEdits"] = _check_edits(dev.get("containerEdits"), f"devices[{i}].containerEdits")
        spec["containerEdits"] = _check_edits(spec.get("containerEdits"), "containerEdits")
        spec["_path"] = str(path)
        return spec

    def edits_for(self, names: list[str]) -> list[dict]:
        """The edits to apply, in CDI's order: a spec's global edits the first
        time one of its devices is named, then the device's own edits."""
        unresolved = [n for n in names if n not in self.devices or n in self.conflicts]
        if unresolved:
            why = [f"{n}: defined twice at the same priority" for n in unresolved if n in self.conflicts]
            why += [f"spec error {e}" for e in self.errors]
            raise StartContainerError(f"unresolvable CDI devices {', '.join(names)}"
                                      + (f" ({'; '.join(why)})" if why else ""))
        out, seen_specs = [], set()
        for n in names:
            _, spec, dev = self.devices[n]
            if spec["_path"] not in seen_specs:
                seen_specs.add(spec["_path"])
                out.append(spec["containerEdits"])
            out.append(dev["containerEdits"])
        return out


def _apply_cdi(config: ContainerConfig, edits: dict) -> None:
    for e in edits.get("env") or ():
        k, v = e.split("=", 1)
        config.env[k] = v
    for n in edits.get("deviceNodes") or ():
        config.device_nodes = [d for d in config.device_nodes if d.path != n["path"]]
        config.device_nodes.append(DeviceNodeSpec(
            path=n["path"], host_path=n.get("hostPath") or n["path"], permissions=n.get("permissions") or "rwm",
            type=n.get("type"), major=n.get("major"), minor=n.get("minor"), file_mode=n.get("fileMode"),
            uid=n.get("uid"), gid=n.get("gid")))
    for m in edits.get("mounts") or ():
        opts = tuple(m.get("options") or ())
        config.mounts = [x for x in config.mounts if x.container_path != m["containerPath"]]
        config.mounts.append(MountSpec(container_path=m["containerPath"], host_path=m["hostPath"],
                                       read_only="ro" in opts, options=opts, type=m.get("type")))
    config.hooks.extend(dict(h) for h in edits.get("hooks") or ())


# ---------------------------------------------------------------------------
# Plugin endpoints


class _Endpoint:
    """One registered plugin: its channel, options and ListAndWatch thread."""

    def __init__(self, owner: "KubeletStandIn", resource: str, path: Path, options):
        self.owner, self.resource, self.path = owner, resource, path
        self.channel = grpc.insecure_channel(f"unix://{path}")
        self.stub = deviceplugin_pb2_grpc.DevicePluginStub(self.channel)
        self.options = options
        self.call = None
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def dial(self) -> None:
        timeout = self.owner.dial_timeout
        grpc.channel_ready_future(self.channel).result(timeout=timeout)
        self.options = self.stub.GetDevicePluginOptions(deviceplugin_pb2.Empty(), timeout=timeout)
        self.owner._record("GetDevicePluginOptions", self.resource)

    def run(self) -> None:
        self.thread = threading.Thread(target=self._watch, name=f"listandwatch-{self.resource}", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        try:
            self.call = self.stub.ListAndWatch(deviceplugin_pb2.Empty())
            self.owner._record("ListAndWatch", self.resource)
            for resp in self.call:
                self.owner._update_devices(self, resp.devices)
        except grpc.RpcError as e:
            if not self.stopped.is_set():
                log.info("listandwatch ended", resource=self.resource, code=str(e.code()), details=e.details())
        finally:
            self.owner._endpoint_stopped(self)

    def stop(self) -> None:
        self.stopped.set()
        if self.call is not None:
            self.call.cancel()
        self.channel.close()


def _unix_target(path: Path) -> str:
    if len(str(path)) > UNIX_PATH_MAX:
        raise ValueError(f"socket path {path} is {len(str(path))} bytes; a unix socket path holds at most "
                         f"{UNIX_PATH_MAX}: use a shorter root")
    return f"unix:{path}"


def _rpc_message(e: grpc.RpcError) -> str:
    """A gRPC error as Go's grpc prints it (kubelet's messages carry this)."""
    name = e.code().name
    go = {"OK": "OK", "CANCELLED": "Canceled"}.get(name) or "".join(w.capitalize() for w in name.split("_"))
    return f"rpc error: code = {go} desc = {e.details()}"


# ---------------------------------------------------------------------------
# The gRPC servicers


class _Registration(deviceplugin_pb2_grpc.RegistrationServicer):
    def __init__(self, owner: "KubeletStandIn"):
        self.owner = owner

    def Register(self, request, context):
        try:
            self.owner._register(request)
        except _RegisterError as e:
            context.abort(grpc.StatusCode.UNKNOWN, str(e))
        return deviceplugin_pb2.Empty()


class _RegisterError(Exception):
    pass


class _PodResources(podresources_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, owner: "KubeletStandIn", qps: float, burst: int):
        self.owner = owner
        self.qps, self.burst = qps, burst
        self.tokens = float(burst)
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def _limit(self, context) -> None:
        with self.lock:
            now = time.monotonic()
            self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.qps)
            self.last = now
            if self.tokens < 1.0:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
            self.tokens -= 1.0

    def List(self, request, context):
        self._limit(context)
        return podresources_pb2.ListPodResourcesResponse(pod_resources=self.owner._pod_resources_all())

    def Get(self, request, context):
        self._limit(context)
        got = self.owner._pod_resources_one(request.pod_namespace, request.pod_name)
        if got is None:
            context.abort(grpc.StatusCode.UNKNOWN,
                          f"pod {request.pod_name} in namespace {request.pod_namespace} not found")
        return podresources_pb2.GetPodResourcesResponse(pod_resources=got)

    def GetAllocatableResources(self, request, context):
        self._limit(context)
        return podresources_pb2.AllocatableResourcesResponse(devices=self.owner._allocatable())


# ---------------------------------------------------------------------------
# The stand-in


@dataclass
class _Allocation:
    device_ids: list[str]
    response: Any  # deviceplugin_pb2.ContainerAllocateResponse


class KubeletStandIn:
    """See the module docstring. Thread-safe; call from threads (for trio:
    ``trio.to_thread.run_sync``)."""

    dial_timeout = DIAL_TIMEOUT_S  # a test may shorten it on an instance

    def __init__(self, root: Path, *, node_name: str, cdi_dirs: tuple[Path | str, ...] = (),
                 pick: str = "first", seed: int = 0, rpc_timeout: float | None = None,
                 pod_resources_qps: float = 100.0, pod_resources_burst: int = 10):
        if pick not in PICKS:
            raise ValueError(f"pick {pick!r} is not one of {', '.join(PICKS)}")
        self.root = Path(root).resolve()
        self.node_name = node_name
        self.cdi_dirs = tuple(Path(d) for d in cdi_dirs)
        self.pick = pick
        self.rng = random.Random(seed)
        self.rpc_timeout = rpc_timeout
        self.pr_qps, self.pr_burst = pod_resources_qps, pod_resources_burst
        self.plugin_dir = self.root / DEVICE_PLUGINS_DIR
        self.pod_resources_dir = self.root / POD_RESOURCES_DIR
        self.socket = self.plugin_dir / KUBELET_SOCKET
        self.pod_resources_socket = self.pod_resources_dir / KUBELET_SOCKET
        self.checkpoint = self.plugin_dir / CHECKPOINT
        for p in (self.socket, self.pod_resources_socket):
            _unix_target(p)
        self.calls: list[tuple[str, str, tuple[str, ...]]] = []  # (rpc, resource, device IDs)
        self._lock = threading.RLock()  # state
        self._changed = threading.Condition(self._lock)
        self._admit_lock = threading.Lock()  # kubelet admits one pod at a time
        self._servers: list[grpc.Server] = []
        self._reset_state()

    def _reset_state(self) -> None:
        self._endpoints: dict[str, _Endpoint | None] = {}  # None: checkpointed, no plugin since restart
        self._devices: dict[str, dict[str, Device]] = {}
        self._pods: dict[str, _Pod] = {}
        self._alloc: dict[tuple[str, str, str], _Allocation] = {}  # (uid, container, resource)
        self._removed: set[str] = set()  # UIDs of pods removed (terminated): never active again
        # each pod's pod-resources message, built once and kept until the pod, its allocations or the
        # devices change: List answers from these (kubelet's List is Go and sub-millisecond; rebuilding
        # every pod's message per call made the stand-in's own cost part of what the benches time)
        self._pr_msgs: dict[str, Any] = {}

    # ---- lifecycle

    def start(self) -> None:
        for d in (self.root, self.plugin_dir, self.pod_resources_dir):
            d.mkdir(mode=0o750, parents=True, exist_ok=True)
        self._load_checkpoint()
        self._serve()

    def _serve(self) -> None:
        for path in (self.socket, self.pod_resources_socket):
            path.unlink(missing_ok=True)
        reg = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet-reg"))
        deviceplugin_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), reg)
        reg.add_insecure_port(_unix_target(self.socket))
        pr = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet-podres"))
        podresources_pb2_grpc.add_PodResourcesListerServicer_to_server(
            _PodResources(self, self.pr_qps, self.pr_burst), pr)
        pr.add_insecure_port(_unix_target(self.pod_resources_socket))
        reg.start()
        pr.start()
        for path in (self.socket, self.pod_resources_socket):
            os.chmod(path, 0o600)
        self._servers = [reg, pr]
        log.info("kubelet stand-in serving", socket=str(self.socket), node=self.node_name)

    def stop(self) -> None:
        for s in self._servers:
            s.stop(grace=None).wait()
        self._servers = []
        with self._lock:
            endpoints = [e for e in self._endpoints.values() if e is not None]
            for r in list(self._endpoints):
                self._endpoints[r] = None
        for e in endpoints:
            e.stop()
        for e in endpoints:
            if e.thread is not None:
                e.thread.join(timeout=5)

    def restart(self) -> None:
        """As kubelet restarts: stop, delete the sockets in device-plugins/
        (not the checkpoint), serve a new kubelet.sock, reload the checkpoint."""
        self.stop()
        for p in self.plugin_dir.iterdir():
            if stat.S_ISSOCK(p.lstat().st_mode):
                p.unlink()
        with self._lock:
            self._reset_state()
        self._load_checkpoint()
        self._serve()

    def __enter__(self) -> "KubeletStandIn":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- registration and devices

    def _register(self, req) -> None:
        if req.version != API_VERSION:
            raise _RegisterError(f"requested API version {req.version!r} is not supported by kubelet. "
                                 f"Supported versions are [{API_VERSION!r}]")
        if not _is_extended(req.resource_name):
            raise _RegisterError(f"invalid name of device plugin resource {req.resource_name!r}: "
                                 "not an extended resource (domain/name outside kubernetes.io)")
        if not req.endpoint or "/" in req.endpoint:
            raise _RegisterError(f"endpoint {req.endpoint!r} is not a socket file name in {self.plugin_dir}")
        path = self.plugin_dir / req.endpoint
        try:
            _unix_target(path)
        except ValueError as e:
            raise _RegisterError(str(e)) from None
        ep = _Endpoint(self, req.resource_name, path, req.options)
        try:
            ep.dial()
        except grpc.FutureTimeoutError:
            ep.stop()
            raise _RegisterError(f"failed to dial device plugin: {path}: no answer in {self.dial_timeout:g} s")
        except grpc.RpcError as e:
            ep.stop()
            raise _RegisterError(f"failed to get device plugin options: {_rpc_message(e)}")
        with self._lock:
            old = self._endpoints.get(req.resource_name)
            self._endpoints[req.resource_name] = ep
            self._devices.setdefault(req.resource_name, {})
            self._pr_msgs.clear()
        if old is not None:
            old.stop()
        log.info("plugin registered", resource=req.resource_name, endpoint=req.endpoint,
                 pre_start_required=ep.options.pre_start_required,
                 preferred_allocation=ep.options.get_preferred_allocation_available)
        ep.run()

    def _update_devices(self, ep: _Endpoint, devices) -> None:
        with self._lock:
            if self._endpoints.get(ep.resource) is not ep:
                return
            before = {i: d.numa_nodes for i, d in self._devices.get(ep.resource, {}).items()}
            self._devices[ep.resource] = {
                d.ID: Device(d.ID, d.health, tuple(n.ID for n in d.topology.nodes)) for d in devices}
            if {i: d.numa_nodes for i, d in self._devices[ep.resource].items()} != before:
                self._pr_msgs.clear()  # a device's NUMA nodes are in the messages (its health is not)
            self._write_checkpoint()  # kubelet checkpoints the registered devices on every update
            self._changed.notify_all()

    def _endpoint_stopped(self, ep: _Endpoint) -> None:
        with self._lock:
            if self._endpoints.get(ep.resource) is not ep:
                return
            self._devices[ep.resource] = {
                i: Device(i, UNHEALTHY, d.numa_nodes) for i, d in self._devices.get(ep.resource, {}).items()}
            self._changed.notify_all()

    def devices(self, resource: str) -> dict[str, Device]:
        """Every device the resource's plugin last listed (healthy or not)."""
        with self._lock:
            return dict(self._devices.get(resource, {}))

    def healthy(self, resource: str) -> list[str]:
        with self._lock:
            return sorted(i for i, d in self._devices.get(resource, {}).items() if d.health == HEALTHY)

    def free(self, resource: str) -> list[str]:
        """Healthy devices no live container holds."""
        with self._lock:
            used = self._in_use(resource)
            return [i for i in self.healthy(resource) if i not in used]

    def wait_for_devices(self, resource: str, n: int, timeout: float = 10.0) -> list[str]:
        """Wait until exactly ``n`` devices of ``resource`` are healthy; their IDs."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.healthy(resource)) != n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{resource}: {len(self.healthy(resource))} healthy devices after "
                                       f"{timeout} s, waiting for {n}; devices: {self.devices(resource)}")
                self._changed.wait(left)
            return self.healthy(resource)

    def _record(self, rpc: str, resource: str, ids=()) -> None:
        with self._lock:
            self.calls.append((rpc, resource, tuple(ids)))

    # ---- admission

    def _in_use(self, resource: str) -> set[str]:
        return {i for (uid, _, r), a in self._alloc.items() if r == resource for i in a.device_ids}

    def admit(self, pod: dict[str, Any]) -> AdmitResult:
        """Admit a pod as kubelet's device manager does; see the module docstring."""
        p = _parse_pod(pod, self.node_name)
        with self._admit_lock:
            with self._lock:
                if p.uid in self._removed:
                    raise ValueError(f"pod {p.namespace}/{p.name} ({p.uid}) was removed; kubelet admits it no more")
                known = self._pods.get(p.uid)
                if known is not None and known != p:
                    raise ValueError(f"pod uid {p.uid} was admitted with another spec")
                self._pods[p.uid] = p
                self._pr_msgs.pop(p.uid, None)
            reuse: dict[str, list[str]] = {}
            try:
                for c in p.containers:
                    got = self._allocate_container(p, c, reuse)
                    for r, ids in got.items():
                        if c.init and not c.restartable:
                            reuse[r] = sorted(set(reuse.get(r, ())) | set(ids))
                        else:
                            reuse[r] = [i for i in reuse.get(r, ()) if i not in ids]
            except AdmissionError as e:
                self._drop_pod(p.uid)
                message = f"Allocate failed due to {e.message}, which is unexpected"
                log.info("pod admission failed", pod=f"{p.namespace}/{p.name}", message=message)
                return AdmitResult(False, "UnexpectedAdmissionError", message)
        return AdmitResult(True, devices=self.allocations(pod))

    def allocations(self, pod: dict[str, Any] | str) -> dict[str, dict[str, list[str]]]:
        """``{container: {resource: device IDs}}`` of a pod (a manifest or its UID)."""
        uid = pod if isinstance(pod, str) else (pod.get("metadata") or {}).get("uid")
        with self._lock:
            out: dict[str, dict[str, list[str]]] = {}
            for (u, c, r), a in self._alloc.items():
                if u == uid:
                    out.setdefault(c, {})[r] = list(a.device_ids)
            return out

    def _allocate_container(self, p: _Pod, c: _Container, reuse: dict[str, list[str]]) -> dict[str, list[str]]:
        """One container's devices, per resource, in kubelet's order of checks;
        raises :class:`AdmissionError` with kubelet's error text."""
        got = {}
        for resource in sorted(c.limits):
            needed = c.limits[resource]
            with self._lock:
                if resource not in self._endpoints:
                    continue  # not a device-plugin resource: not the device manager's
                key = (p.uid, c.name, resource)
                have = self._alloc.get(key)
                if have is not None and len(have.device_ids) != needed:
                    raise AdmissionError(f"pod {p.uid!r} container {c.name!r} changed request for resource "
                                         f"{resource!r} from {len(have.device_ids)} to {needed}")
                healthy = set(self.healthy(resource))
                # Checked before the count (even for a count of 0), as kubelet does.
                if not healthy:
                    raise AdmissionError(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
                if have is not None and not set(have.device_ids) <= healthy:
                    raise AdmissionError("previously allocated devices are no longer healthy; cannot allocate "
                                         f"unhealthy devices {resource}")
                if have is not None:
                    got[resource] = have.device_ids
                    continue
                if needed == 0:
                    continue
                ep = self._endpoints[resource]
                chosen = list(reuse.get(resource, ()))[:needed]
                available = sorted(healthy - self._in_use(resource) - set(chosen))
            if len(chosen) < needed:
                short = needed - len(chosen)
                if len(available) < short:
                    raise AdmissionError(f"requested number of devices unavailable for {resource}. "
                                         f"Requested: {short}, Available: {len(available)}")
                if ep is None:  # unreachable while it has no devices; kept as kubelet's guard
                    raise AdmissionError(f"endpoint for {resource} has been stopped")
                if ep.options.get_preferred_allocation_available:
                    chosen += self._preferred(ep, resource, available, chosen, needed)
                if len(chosen) < needed:
                    chosen += self._pick([i for i in available if i not in chosen], needed - len(chosen))
            if ep is None:
                raise AdmissionError(f"endpoint for {resource} has been stopped")
            resp = self._allocate(ep, resource, chosen)
            with self._lock:
                self._alloc[key] = _Allocation(chosen, resp)
                self._pr_msgs.pop(p.uid, None)
                self._write_checkpoint()
            got[resource] = chosen
        return got

    def _pick(self, ids: list[str], k: int) -> list[str]:
        if self.pick == "first":
            return ids[:k]
        if self.pick == "reverse":
            return list(reversed(ids))[:k]
        return self.rng.sample(ids, k)

    def _preferred(self, ep: _Endpoint, resource: str, available: list[str], must: list[str],
                   needed: int) -> list[str]:
        req = deviceplugin_pb2.PreferredAllocationRequest(container_requests=[
            deviceplugin_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=sorted(set(available) | set(must)), must_include_deviceIDs=must,
                allocation_size=needed)])
        self._record("GetPreferredAllocation", resource, must)
        try:
            resp = ep.stub.GetPreferredAllocation(req, timeout=self.rpc_timeout)
        except grpc.RpcError as e:
            raise AdmissionError(f"device plugin GetPreferredAllocation rpc failed with err: "
                                 f"{_rpc_message(e)}") from None
        # Advisory: the answer's IDs that are free are taken (up to the size),
        # anything else in it is ignored and the rest is picked as without it.
        named = list(resp.container_responses[0].deviceIDs) if resp.container_responses else []
        out: list[str] = []
        for i in named:
            if i in available and i not in out and len(out) < needed - len(must):
                out.append(i)
        bad = [i for i in named if i not in available and i not in must]
        if bad:
            log.info("preferred allocation named unavailable devices; ignored", resource=resource, ids=bad)
        return out

    def _allocate(self, ep: _Endpoint, resource: str, ids: list[str]):
        self._record("Allocate", resource, ids)
        req = deviceplugin_pb2.AllocateRequest(
            container_requests=[deviceplugin_pb2.ContainerAllocateRequest(devices_ids=ids)])
        try:
            resp = ep.stub.Allocate(req, timeout=self.rpc_timeout)
        except grpc.RpcError as e:
            raise AdmissionError(_rpc_message(e)) from None
        if not resp.container_responses:
            raise AdmissionError(f"no containers return in allocation response {resp}")
        return resp.container_responses[0]

    # ---- container start

    def start_container(self, pod: dict[str, Any], container_name: str) -> ContainerConfig:
        """As kubelet starts (or restarts) a container: per device-plugin
        resource, ``PreStartContainer`` if the plugin asked for it (an error if
        nothing is cached for it then), a fresh ``Allocate`` if nothing is
        cached (kubelet's restart race), then the container's config as the
        runtime builds it. Raises :class:`StartContainerError`."""
        p = _parse_pod(pod, self.node_name)
        c = p.container(container_name)
        with self._lock:
            if p.uid in self._removed:
                raise ValueError(f"pod {p.namespace}/{p.name} ({p.uid}) was removed; kubelet starts no container of it")
            self._pods.setdefault(p.uid, p)
            resources = [r for r in sorted(c.limits) if r in self._endpoints and c.limits[r]]
        reallocate = False
        for resource in resources:
            with self._lock:
                ep = self._endpoints[resource]
                a = self._alloc.get((p.uid, c.name, resource))
            if ep is not None and ep.options.pre_start_required:
                if a is None:
                    raise StartContainerError(f"no devices found allocated in local cache for pod {p.uid}, "
                                              f"container {c.name}, resource {resource}")
                self._record("PreStartContainer", resource, a.device_ids)
                try:
                    ep.stub.PreStartContainer(
                        deviceplugin_pb2.PreStartContainerRequest(devices_ids=a.device_ids),
                        timeout=PRE_START_TIMEOUT_S)
                except grpc.RpcError as e:
                    raise StartContainerError(f"device plugin PreStartContainer rpc failed with err: "
                                              f"{_rpc_message(e)}") from None
            reallocate = reallocate or a is None
        if reallocate:
            with self._admit_lock:
                try:
                    self._allocate_container(p, c, {})
                except AdmissionError as e:
                    raise StartContainerError(e.message) from None
        with self._lock:
            allocs = [self._alloc[(p.uid, c.name, r)] for r in resources if (p.uid, c.name, r) in self._alloc]
        return self._runtime_config(allocs)

    def _runtime_config(self, allocs) -> ContainerConfig:
        config = ContainerConfig()
        cdi: list[str] = []
        for a in allocs:
            r = a.response
            for k, v in r.envs.items():
                config.env.setdefault(k, v)  # kubelet keeps the first of conflicting settings
            for m in r.mounts:
                if all(x.container_path != m.container_path for x in config.mounts):
                    config.mounts.append(MountSpec(m.container_path, m.host_path, m.read_only))
            for d in r.devices:
                if all(x.path != d.container_path for x in config.device_nodes):
                    config.device_nodes.append(DeviceNodeSpec(d.container_path, d.host_path,
                                                              d.permissions or "rwm"))
            for k, v in r.annotations.items():
                config.annotations.setdefault(k, v)
            cdi += [d.name for d in r.cdi_devices if d.name not in cdi]
        for k, v in config.annotations.items():
            if k.startswith(CDI_ANNOTATION_PREFIX):
                cdi += [n.strip() for n in v.split(",") if n.strip() and n.strip() not in cdi]
        if cdi:
            registry = _CdiRegistry(self.cdi_dirs)
            for edits in registry.edits_for(cdi):
                _apply_cdi(config, edits)
            config.cdi_devices = cdi
        return config

    # ---- removal

    def remove_pod(self, pod: dict[str, Any] | str) -> None:
        """The pod terminated and was removed: free its devices."""
        uid = pod if isinstance(pod, str) else (pod.get("metadata") or {}).get("uid")
        if not uid:
            raise ValueError("remove_pod needs a pod manifest with metadata.uid, or the UID")
        with self._lock:
            self._removed.add(uid)
        self._drop_pod(uid)

    def _drop_pod(self, uid: str) -> None:
        with self._lock:
            self._pods.pop(uid, None)
            self._pr_msgs.pop(uid, None)
            for key in [k for k in self._alloc if k[0] == uid]:
                del self._alloc[key]
            self._write_checkpoint()
            self._changed.notify_all()

    # ---- checkpoint

    def _write_checkpoint(self) -> None:
        data = {
            "pods": [p.to_json() for _, p in sorted(self._pods.items())],
            "entries": [{"podUID": u, "container": c, "resource": r, "deviceIDs": a.device_ids,
                         "allocResp": base64.b64encode(a.response.SerializeToString()).decode()}
                        for (u, c, r), a in sorted(self._alloc.items())],
            "registeredDevices": {r: sorted(d) for r, d in sorted(self._devices.items())},
        }
        body = json.dumps(data, sort_keys=True)
        doc = {"data": data, "checksum": hashlib.sha256(body.encode()).hexdigest()}
        tmp = self.checkpoint.with_name(CHECKPOINT + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
        os.replace(tmp, self.checkpoint)

    def _load_checkpoint(self) -> None:
        if not self.checkpoint.exists():
            return
        doc = json.loads(self.checkpoint.read_text())
        data = doc["data"]
        if hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest() != doc["checksum"]:
            raise ValueError(f"checkpoint {self.checkpoint} is corrupt: checksum mismatch")
        with self._lock:
            self._pr_msgs.clear()
            for p in data["pods"]:
                pod = _Pod.from_json(p)
                self._pods[pod.uid] = pod
            for e in data["entries"]:
                resp = deviceplugin_pb2.ContainerAllocateResponse.FromString(base64.b64decode(e["allocResp"]))
                self._alloc[(e["podUID"], e["container"], e["resource"])] = _Allocation(list(e["deviceIDs"]), resp)
            for r in data["registeredDevices"]:
                # Checkpointed resources: no plugin yet, no devices until it registers.
                self._endpoints.setdefault(r, None)
                self._devices.setdefault(r, {})

    def read_checkpoint(self) -> dict[str, Any]:
        """The checkpoint file's data, as written."""
        return json.loads(self.checkpoint.read_text())["data"]

    # ---- pod-resources

    def _container_devices(self, uid: str, container: str) -> list:
        out = []
        for (u, c, r), a in sorted(self._alloc.items()):
            if u != uid or c != container:
                continue
            by_numa: dict[int, list[str]] = {}
            known = self._devices.get(r, {})
            for i in a.device_ids:
                nodes = known[i].numa_nodes if i in known and known[i].numa_nodes else (_NO_NUMA,)
                for n in nodes:
                    by_numa.setdefault(n, []).append(i)
            for n, ids in sorted(by_numa.items()):
                topo = None if n == _NO_NUMA else podresources_pb2.TopologyInfo(
                    nodes=[podresources_pb2.NUMANode(ID=n)])
                out.append(podresources_pb2.ContainerDevices(resource_name=r, device_ids=ids, topology=topo))
        return out

    def _pod_message(self, p: _Pod):
        containers = [podresources_pb2.ContainerResources(name=c.name, devices=self._container_devices(p.uid, c.name))
                      for c in p.containers if not c.init or c.restartable]
        return podresources_pb2.PodResources(name=p.name, namespace=p.namespace, containers=containers)

    def _cached_message(self, p: _Pod):
        got = self._pr_msgs.get(p.uid)
        if got is None:
            got = self._pr_msgs[p.uid] = self._pod_message(p)
        return got

    def _pod_resources_all(self) -> list:
        with self._lock:
            return [self._cached_message(p) for p in self._pods.values()]

    def _pod_resources_one(self, namespace: str, name: str):
        with self._lock:
            for p in self._pods.values():
                if p.namespace == namespace and p.name == name:
                    return self._cached_message(p)
        return None

    def _allocatable(self) -> list:
        with self._lock:
            out = []
            for r, devs in sorted(self._devices.items()):
                for i, d in sorted(devs.items()):
                    topo = (podresources_pb2.TopologyInfo(nodes=[podresources_pb2.NUMANode(ID=n) for n in d.numa_nodes])
                            if d.numa_nodes else None)
                    out.append(podresources_pb2.ContainerDevices(resource_name=r, device_ids=[i], topology=topo))
            return out
