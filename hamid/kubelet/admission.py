"""What the device plugin does at ``Allocate`` and at ``PreStartContainer``.

``Allocate`` carries only the virtual device IDs kubelet chose, never the
pod (HAMi guesses the pod there, and two pods arriving together swap limits).
hamid does not guess: ``Allocate`` answers with edits that depend on the
devices alone, and the pod is tied to them at ``PreStartContainer``, which
kubelet calls before every start of the container (``pre_start_required``):

1. kubelet's pod-resources API names the pod (namespace and name) and the
   container holding exactly those device IDs; the API server gives that pod's
   UID, and the reservation is the ledger's row for ``pod:<UID>``;
2. a pod with no reservation (created with ``spec.nodeName``, or placed while
   hamid's webhook was unreachable) is admitted by the node itself from its
   spec, or the start fails with the reasons per GPU (and an Event on the pod);
3. the container's limits file is written from the reservation (and, with the
   ``cdi-cri`` strategy, its CDI spec from ``realize``): only then can the
   container start.

Two strategies (``deviceListStrategy``):

- ``envvar`` (default, any container runtime): ``Allocate`` gives the device
  nodes of the GPUs kubelet's IDs belong to, ``NVIDIA_VISIBLE_DEVICES``, the
  shim, ``/etc/ld.so.preload``, the slot's region directory and the slot's
  limits file (empty until ``PreStartContainer``: an empty limits file makes
  the shim refuse CUDA, so nothing runs unlimited); for one GPU that serves
  MPS, also its control daemon's pipe directory. Since the GPU is kubelet's
  choice, the reservation follows it: a pod reserved on other GPUs is moved to
  kubelet's under the ledger's re-check, or its start fails. MIG needs ``cdi-cri``.
- ``cdi-cri``: ``Allocate`` gives only the CDI device ``hamid.io/vgpu=<slot>``,
  whose spec ``PreStartContainer`` writes with exactly ``realize``'s edits for
  the reservation (its GPUs, MIG instance, HAMi-core's variables), so nothing
  depends on kubelet's choice of IDs. Needs a runtime with CDI (containerd
  >= 1.7 with CDI on, containerd 2, CRI-O) and Kubernetes >= 1.31 (or the
  ``DevicePluginCDIDevices`` gate).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..errors import HamidError
from ..logs import get_logger
from ..node import layout, mps
from ..node.service import NodeDoor
from ..node.identity import Owner
from ..node.realize import RealizeError, gpu_device_nodes, realize, shim_mounts
from ..request import parse_pod
from ..request.model import Defaults, Request
from . import cdi
from .api import deviceplugin_pb2 as pb
from .devices import gpu_of, slot_of
from .pods import PodDirectory, PodLookupError

log = get_logger("kubelet")

STRATEGIES = ("envvar", "cdi-cri")


class AdmissionError(HamidError):
    """A container cannot be given its devices; kubelet shows the message."""


def _gpus(ids: tuple[str, ...]) -> tuple[str, ...]:
    """The GPUs of a set of device IDs, in first-seen order."""
    out: list[str] = []
    for i in ids:
        try:
            g = gpu_of(i)
        except ValueError as e:
            raise AdmissionError(str(e)) from None
        if g not in out:
            out.append(g)
    return tuple(out)


class PodAdmission:
    def __init__(self, node: NodeDoor, pods: PodDirectory, *, strategy: str, cdi_dir: str,
                 defaults: Defaults, cached_pod: Callable[[str, str], dict | None] | None = None) -> None:
        """``cached_pod(namespace, name)``: the pod from a cache of this node's pods kept by a watch
        (the face's shared informer), None on a miss: the API server is asked only then. The GPUs the
        DRA face serves (draDevices) are never picked: the placement engine leaves them out."""
        if strategy not in STRATEGIES:
            raise HamidError(f"deviceListStrategy: bad value {strategy!r}; accepted: {', '.join(STRATEGIES)}")
        self.node = node
        self.pods = pods
        self.cached_pod = cached_pod
        self.strategy = strategy
        self.cdi_dir = cdi_dir
        node.own_file_dir(cdi_dir)  # release may delete the CDI specs written there, and nothing else
        self.defaults = defaults

    # --- Allocate: what depends on the devices alone ----------------------------------

    def allocate(self, ids: tuple[str, ...]) -> pb.ContainerAllocateResponse:
        slot = slot_of(ids)
        if self.strategy == "cdi-cri":
            return pb.ContainerAllocateResponse(cdi_devices=[pb.CDIDevice(name=cdi.device_name(slot))])
        facts = self.node.facts
        if facts.backend.get("mig_enabled"):
            raise AdmissionError("this node is in MIG mode: MIG instances on Kubernetes need "
                                 "deviceListStrategy: cdi-cri (the instance exists only once the pod is known)")
        gpus = _gpus(ids)
        # what a shim share of these GPUs mounts and gets, as realize gives it (the Docker path's builder)
        try:
            mounts = shim_mounts(facts, slot)
            nodes = gpu_device_nodes(facts, gpus)
        except RealizeError as e:
            raise AdmissionError(str(e)) from None
        self._slot_files(slot)
        resp = pb.ContainerAllocateResponse(envs={
            "NVIDIA_VISIBLE_DEVICES": ",".join(gpus),
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": layout.REGION_FILE_IN_CONTAINER,
        })
        for m in mounts:
            resp.mounts.append(pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.readonly))
        self._mps_edits(gpus, resp)
        for n in nodes:
            resp.devices.append(pb.DeviceSpec(container_path=n.path, host_path=n.host_path,
                                              permissions=n.permissions))
        return resp

    def _mps_edits(self, gpus: Sequence[str], resp: pb.ContainerAllocateResponse) -> None:
        """One GPU that may serve MPS: its control daemon's pipe directory, in case the pod
        turns out to be an MPS share (the shim joins it only when the limits file says so;
        ``CUDA_MPS_PIPE_DIRECTORY`` is set here only where the GPU serves nothing else, so a
        hami-core tenant of a GPU serving both never joins an MPS server)."""
        if len(gpus) != 1 or not self.node.facts.mps_control:
            return
        g = next((v for v in self.node.view().gpus if v.uuid == gpus[0]), None)
        if g is None or "mps" not in g.serves:
            return
        root = self.node.facts.mps_dir
        mps.ensure_dirs(self.node.state_dir, g.uuid, root)
        resp.mounts.append(pb.Mount(container_path=mps.PIPE_IN_CONTAINER,
                                    host_path=mps.pipe_dir(self.node.state_dir, g.uuid, root), read_only=False))
        if g.serves == ("mps",):
            resp.envs["CUDA_MPS_PIPE_DIRECTORY"] = mps.PIPE_IN_CONTAINER

    def _slot_files(self, slot: str) -> None:
        """The slot's region directory and a placeholder limits file: empty, so the
        shim refuses CUDA until ``PreStartContainer`` writes the real one."""
        st = self.node.state_dir
        for d in (layout.CONTAINERS_DIR, layout.LIMITS_DIR):
            os.makedirs(st / d, mode=0o700, exist_ok=True)
        rdir = layout.region_dir(st, slot)
        os.makedirs(rdir, mode=0o700, exist_ok=True)
        os.chmod(rdir, 0o777)
        path = layout.limits_file(st, slot)
        if not os.path.lexists(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            os.close(fd)

    # --- PreStartContainer: the pod, its reservation, its files -------------------------

    def prestart(self, ids: tuple[str, ...]) -> str:
        """Tie ``ids`` to a pod and container and prepare them; returns the owner key."""
        slot = slot_of(ids)
        try:
            ns, name, held = self.pods.holder(ids)
            pod = self.cached_pod(ns, name) if self.cached_pod is not None else None
            if pod is None:
                pod = self.pods.get_pod(ns, name)
        except PodLookupError as e:
            raise AdmissionError(f"cannot tie devices to a pod: {e}") from None
        if pod is None:
            raise AdmissionError(f"pod {ns}/{name} holds devices here but the API server has no such pod")
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if spec.get("nodeName") != self.pods.node:
            raise AdmissionError(f"pod {ns}/{name} is bound to {spec.get('nodeName')!r}, not to this node "
                                 f"{self.pods.node!r}")
        owner = Owner("pod", meta["uid"], name=f"{ns}/{name}")
        slots = {c: slot_of(i) for c, i in held.items()}
        containers = [c for c, s in slots.items() if s == slot]
        before = self.node.get(owner.key)
        known = dict(before.details.container_slots) if before is not None else {}
        if not containers:  # a plain init container (kubelet does not list those): which one, from the spec
            init = self._init_container_for(pod, ids, res_slots=known)
            held = {**held, init: ids}
            slots[init] = slot
            containers = [init]
        else:  # plain init containers whose devices kubelet handed on to these: they share the slot
            for init in self._unlisted_inits(pod, held, len(ids), known, slot):
                held = {**held, init: ids}
                slots[init] = slot
                containers.append(init)
        try:
            todo = self._reserve(owner, pod, held, slots)
            # the files are written by this call's preparation (a reservation not prepared before:
            # node-local admission, or the leader's placement at its first start), for no known user;
            # a reservation still reserved gets kubelet's slots, its files and `allocated` in one transaction
            fresh = before is None or before.state == "reserved"
            res = self.node.prepare(owner.key, user=None, slots=todo)
            for c in containers:
                user = pod_user(pod, c)
                if not _is_mig(res, c) and not (fresh and user is None):
                    # (re)written from the reservation as it stands now (a restart: it may have moved);
                    # the region directory is the container's user's where the pod says who that is
                    self.node.write_container_files(owner.key, c, user)
            if self.strategy == "cdi-cri":
                path = cdi.write_spec(self.cdi_dir, slot, realize(res, self.node.facts, containers[0]))
                self.node.attach_file(owner.key, path)
        except HamidError as e:
            self.pods.event(pod, "HamidAdmissionFailed", str(e))
            raise AdmissionError(str(e)) from None
        log.info("container tied to its pod", owner=owner.key, pod=owner.name, containers=containers, slot=slot)
        done = res.details.container_slots
        if all(c.name in done for c in res.decision.containers if c.devices):  # HAMi's bind phase: allocated
            self.pods.mark_allocated(pod)
        return owner.key

    def _unlisted_inits(self, pod: dict[str, Any], held: dict, n: int, known: dict[str, str],
                        slot: str) -> list[str]:
        """Plain init containers (not listed by kubelet) that asked for ``n`` of our
        devices and are not keyed to another slot: kubelet hands their devices on to
        the next containers first, so they share this slot (a larger share over more
        containers only ever stays within what the pod books)."""
        out = []
        for c in (pod.get("spec") or {}).get("initContainers") or ():
            name = c.get("name")
            if name in held or c.get("restartPolicy") == "Always" or known.get(name, slot) != slot:
                continue
            limits = ((c.get("resources") or {}).get("limits") or {})
            if str(limits.get(self.pods.resource, "0")) == str(n):
                out.append(name)
        return out

    def _init_container_for(self, pod: dict[str, Any], ids: tuple[str, ...], res_slots: dict[str, str]) -> str:
        """The init container of ``pod`` that these devices were given to: the first
        one asking for as many of our devices whose slot is not known yet, or the one
        already keyed to this slot (a restart)."""
        slot = slot_of(ids)
        for c, s in res_slots.items():
            if s == slot:
                return c
        resource = self.pods.resource
        for c in (pod.get("spec") or {}).get("initContainers") or ():
            limits = ((c.get("resources") or {}).get("limits") or {})
            try:
                n = int(str(limits.get(resource, "0")))
            except ValueError:
                continue
            if n == len(ids) and c.get("name") not in res_slots:
                return c["name"]
        raise AdmissionError(f"devices {sorted(ids)} belong to pod {(pod.get('metadata') or {}).get('name')} "
                             "but to none of its containers that kubelet lists, and no init container of it "
                             f"asks for {len(ids)} of {resource}")

    def _reserve(self, owner: Owner, pod: dict[str, Any], held: dict[str, tuple[str, ...]],
                 slots: dict[str, str]) -> dict[str, str] | None:
        """Make sure the ledger holds ``owner`` (and, with ``envvar``, on the GPUs kubelet's devices
        belong to) with its containers keyed to kubelet's slots; the slots still to record (by the
        preparation that follows, in its transaction), or None."""
        gpus = {c: _gpus(i) for c, i in held.items()}
        res = self.node.get(owner.key)
        if res is None:  # node-local admission: the pod came with spec.nodeName, or without a reservation
            request = self._request(pod)
            if self.strategy == "envvar":
                request = _restricted(request, gpus)
            self.node.admit(owner, request, slots=slots)
            return None
        if res.state == "releasing":
            raise HamidError(f"{owner} is being released")
        if self.strategy == "envvar":
            placed = {c.name: tuple(d.uuid for d in c.devices) for c in res.decision.containers}
            if any(set(placed.get(c, ())) != set(g) for c, g in gpus.items()):
                self._follow_kubelet(res, gpus, slots)
                return None
        return slots  # recorded by prepare (only where they changed, for a reservation past reserved)

    def _follow_kubelet(self, res, gpus: dict[str, tuple[str, ...]], slots: dict[str, str]) -> None:
        """Move a reservation onto the GPUs kubelet chose, re-checked by the ledger."""
        request = _restricted(res.request, gpus) if res.request is not None else None
        if request is None:
            raise HamidError(f"{res.owner} was placed on other GPUs than kubelet chose and records no request "
                             "to place it again")
        self.node.move(res.owner, request, slots)
        log.info("reservation follows kubelet's devices", owner=res.owner,
                 gpus={c: list(g) for c, g in gpus.items()})

    def _request(self, pod: dict[str, Any]) -> Request:
        try:
            return parse_pod(pod, self.defaults)
        except HamidError as e:
            raise HamidError(f"the pod's GPU request cannot be read: {e}") from None


def _is_mig(res, container: str) -> bool:
    return any(d.mig_profile for c in res.decision.containers if c.name == container for d in c.devices)


def _restricted(request: Request, gpus: dict[str, tuple[str, ...]]) -> Request:
    """``request`` with each container limited to exactly the GPUs kubelet gave it."""
    conts = []
    for c in request.containers:
        g = gpus.get(c.name)
        if c.gpu is not None and g:
            conts.append(replace(c, gpu=replace(c.gpu, devices=g, count=len(g))))
        else:
            conts.append(c)
    return replace(request, containers=tuple(conts))


def pod_user(pod: dict[str, Any], container: str) -> tuple[int, int] | None:
    """(uid, gid) a container of ``pod`` runs as, where its spec says (the container's securityContext,
    else the pod's: runAsUser, runAsGroup, else the uid as the gid); None when the image decides,
    which the node cannot know (the region directory is then open to any user of the container)."""
    spec = pod.get("spec") or {}
    psc = spec.get("securityContext") or {}
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        if c.get("name") != container:
            continue
        sc = c.get("securityContext") or {}
        uid = sc.get("runAsUser", psc.get("runAsUser"))
        gid = sc.get("runAsGroup", psc.get("runAsGroup"))
        if isinstance(uid, int) and not isinstance(uid, bool) and 0 <= uid < 2**32:
            return uid, gid if isinstance(gid, int) and not isinstance(gid, bool) and 0 <= gid < 2**32 else uid
    return None
