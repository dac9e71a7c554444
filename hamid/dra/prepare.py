"""A claim's allocation into the node's ledger, and back out: the blocking half of prepare.

Runs in the node service's threads (:meth:`NodeService.run_blocking`). A
claim is the owner ``claim:<UID>``; its allocated devices are ONE "container"
of its reservation (``d0``), since every container that references the claim
gets all of them: exactly the scheduler's choice per device (the GPU, the
memory and cores the claim consumes of it; a MIG profile at the placement the
scheduler allocated by the counters, so the published counters stay true),
committed as a proposed placement: the ledger re-checks each device's amounts
against everything booked on the node (device-plugin pods, Docker containers,
other claims) and refuses what does not fit. The reservation's edits
(``realize``: device nodes, shim, ``/etc/ld.so.preload``, one limits file
listing every GPU, one region directory, MPS pipe, MIG instances) become one
CDI device of the claim, in one spec file per claim, named by the claim's UID
so a runtime's cache never serves a stale one; the ledger records the file,
and release removes it. What one container cannot say is refused per claim:
one GPU twice, MIG instances beside shares, several MPS GPUs, devices whose
GpuConfig differs.

Idempotent: a claim prepared before is answered from its reservation (the
spec rewritten: ``/var/run/cdi`` is a tmpfs); the ledger is the checkpoint,
so this holds across daemon restarts, and a claim an earlier version prepared
as one container per device keeps that layout until it is unprepared.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..node.cdispec import write_cdi_spec
from ..node.identity import Owner
from ..node.realize import realize
from ..node.service import LedgerConflict, NodeDoor, Reservation
from ..devices.types import MigPlacement, MigProfile
from ..placement import Decision
from ..placement.result import ContainerAssignment, DeviceAssignment
from ..placement.view import MODE_MIG, SHARE_MPS, GpuView
from ..request.model import ContainerRequest, GpuRequest, Request
from . import names
from .claims import MIB, ClaimAllocation, ClaimError



@dataclass(frozen=True)
class PreparedDevice:
    """What kubelet is told of one allocated device."""

    request: str
    device: str
    cdi_ids: tuple[str, ...]  # the claim's one CDI device on its first device, none on the others
    share_id: str | None


def owner_key(uid: str) -> str:
    return Owner("claim", uid).key


def spec_path(cdi_dir: str, uid: str) -> str:
    return os.path.join(cdi_dir, f"{names.DRIVER}-claim-{uid}.json")


def devices_by_name(gpus: tuple[GpuView, ...]) -> dict[str, tuple[GpuView, MigProfile | None, MigPlacement | None]]:
    """Pool device name -> (its GPU, the MIG profile and placement it is)."""
    out: dict[str, tuple[GpuView, MigProfile | None, MigPlacement | None]] = {}
    for g in gpus:
        if g.mode == MODE_MIG:
            for p in g.mig_profiles:
                for pl in p.placements:
                    out[names.mig_device_name(g.index, p.name, pl.start)] = (g, p, pl)
        else:
            out[names.device_name(g.index)] = (g, None, None)
    return out


# One container holds every allocated device of a claim: its name is the one the first layout gave a
# claim's first device, so a one-device claim's reservation, slot and CDI device are what they were.
CONTAINER = "d0"


def claim_plan(alloc: ClaimAllocation, gpus: tuple[GpuView, ...], dra_gpus: frozenset[str],
               node: str) -> tuple[Request, Decision]:
    """What the ledger books for ``alloc``: exactly the scheduler's choice, as ONE container
    (:data:`CONTAINER`) holding every allocated device (its GPU, the memory and cores it consumes, or
    its MIG profile placement), since every container that references the claim gets all of it:
    one limits file listing each GPU with its own share, one region directory, one
    ``NVIDIA_VISIBLE_DEVICES``. The request it stands for is kept with it for the priority and
    compute policy the limits file says; each device's amounts are the decision's, which is what the
    ledger re-checks (:func:`hamid.placement.engine.check`).

    A device without consumed capacity (a cluster whose consumable-capacity gate is off allocates
    it whole) books the whole GPU: all its memory and cores 100."""
    by_name = devices_by_name(gpus)
    claim = f"claim {alloc.namespace}/{alloc.name}"
    devs: list[DeviceAssignment] = []
    for d in alloc.devices:
        got = by_name.get(d.device)
        if got is None:
            raise ClaimError(f"{claim}: device {d.device!r} is not in this node's "
                             f"pool (it has: {', '.join(sorted(by_name)) or 'none'})")
        g, prof, pl = got
        if g.uuid not in dra_gpus:
            raise ClaimError(f"{claim}: GPU {g.index} ({d.device}) does not serve DRA on this node (draDevices)")
        if prof is not None and pl is not None:
            devs.append(DeviceAssignment(g.uuid, g.index, prof.memory_mib, 0, prof.name, pl, False))
            continue
        if d.memory_bytes == 0:
            raise ClaimError(f"{claim}: device {d.device} consumes no memory; a share needs at least 1Mi")
        whole = d.memory_bytes is None and d.cores is None
        mem_mib = g.mem_total if d.memory_bytes is None else -(-d.memory_bytes // MIB)
        cores = 100 if whole else (d.cores or 0)
        mps = bool(g.serves) and g.serves[0] == SHARE_MPS
        devs.append(DeviceAssignment(g.uuid, g.index, mem_mib, cores, None, None, mps))
    _one_container(claim, alloc, devs)
    first = alloc.devices[0].config
    mig = devs[0].mig_profile is not None
    # The typed request says one amount per GPU; a claim's devices may each consume another, so it
    # says the common one where they agree (None / the largest cores where not: shown, not booked).
    gpu = GpuRequest(count=len(devs), devices=tuple(d.uuid for d in devs), priority=first.priority,
                     core_policy=None if mig else first.core_policy,
                     mem_mib=None if mig else _common([d.mem_mib for d in devs]), mem_percent=None,
                     cores=0 if mig else max(d.cores for d in devs),
                     mig_profile=_common([d.mig_profile for d in devs]) if mig else None,
                     mode="mig" if mig else (SHARE_MPS if devs[0].mps else None))
    request = Request(owner=f"claim:{alloc.namespace}/{alloc.name}",
                      containers=(ContainerRequest(name=CONTAINER, gpu=gpu),), uid=alloc.uid)
    return request, Decision(node=node, containers=(ContainerAssignment(CONTAINER, False, tuple(devs)),))


def _common(values: list) -> Any:
    return values[0] if len(set(values)) == 1 else None


def _one_container(claim: str, alloc: ClaimAllocation, devs: list[DeviceAssignment]) -> None:
    """Refuse, naming the claim, what one container's edits cannot say of the allocated devices."""
    if len(devs) < 2:
        return
    n = len(devs)
    seen: dict[str, str] = {}
    for a, d in zip(alloc.devices, devs):
        if d.uuid in seen:  # one limits-file entry per GPU; a reservation records one MIG instance per GPU
            raise ClaimError(f"{claim}: {n} devices, {seen[d.uuid]} and {a.device} on the same GPU {d.index}; "
                             "one claim takes each GPU once: ask for one share of the size needed (a CUDA process "
                             "uses one MIG instance of a GPU)")
        seen[d.uuid] = a.device
    if len({d.mig_profile is None for d in devs}) > 1:
        raise ClaimError(f"{claim}: {n} devices mixing MIG instances and shares of whole GPUs "
                         f"({', '.join(a.device for a in alloc.devices)}); one container gets either; "
                         "ask for them in separate claims")
    if any(d.mps for d in devs):
        raise ClaimError(f"{claim}: {n} devices on MPS GPUs ({', '.join(a.device for a in alloc.devices)}); "
                         "an MPS client share is one GPU: a claim of one device each")
    configs = {(a.config.priority, a.config.core_policy) for a in alloc.devices}
    if len(configs) > 1:
        shown = "; ".join(f"{a.request}: priority {a.config.priority}, corePolicy {a.config.core_policy}"
                          for a in alloc.devices)
        raise ClaimError(f"{claim}: its {n} devices have different GpuConfig ({shown}); one container has one "
                         "priority and compute policy: give the claim's requests the same config")


class ClaimPreparer:
    """Prepare and unprepare claims against the node's ledger (blocking: the node service's threads)."""

    def __init__(self, door: NodeDoor, cdi_dir: str) -> None:
        self.door = door
        self.cdi_dir = os.path.abspath(cdi_dir)
        door.own_file_dir(self.cdi_dir)  # release deletes the claims' specs there, and nothing else

    def prepare(self, alloc: ClaimAllocation, dra_gpus: frozenset[str]) -> list[PreparedDevice]:
        if not alloc.devices:
            return []
        key = owner_key(alloc.uid)
        request, decision = claim_plan(alloc, self.door.view().gpus, dra_gpus, self.door.facts.node)
        res = self.door.get(key)
        if res is not None and res.state == "releasing":
            raise ClaimError(f"claim {alloc.namespace}/{alloc.name} is being released; kubelet retries")
        if res is not None and _booked(res.decision) != _booked(decision):
            raise ClaimError(f"claim {alloc.namespace}/{alloc.name} was prepared here with another allocation "
                             f"({_shown(res)}); it must be unprepared first")
        owner = Owner("claim", alloc.uid, name=f"{alloc.namespace}/{alloc.name}")
        if res is None:
            try:
                res = self.door.commit(owner, decision, request=request)
            except LedgerConflict as e:
                raise ClaimError(f"claim {alloc.namespace}/{alloc.name} does not fit on this node now: {e}") from None
        if res.state == "reserved":  # MIG instances, MPS daemons, limits files, then allocated
            try:
                res = self.door.prepare(key, user=None)
            except BaseException:
                self.door.release(key)  # ours alone to undo: kubelet retries the whole prepare
                raise
        path = self._write_spec(res)
        self.door.attach_file(key, path)
        return _answer(alloc, decision, res)

    def _write_spec(self, res: Reservation) -> str:
        uid = res.owner.partition(":")[2]
        devices = [(f"{uid}-{c.name}", realize(res, self.door.facts, c.name)) for c in res.decision.containers]
        return write_cdi_spec(spec_path(self.cdi_dir, uid), names.CDI_KIND, devices)


def _device_key(d: DeviceAssignment) -> tuple:
    return (d.uuid, d.mem_mib, d.cores, d.mig_profile, d.mig_placement)


def _booked(decision: Decision) -> list[tuple]:
    """The devices ``decision`` books, whatever containers hold them: a claim prepared by the first
    layout (one container per device) matches the same allocation planned as one container."""
    return sorted((_device_key(d) for c in decision.containers for d in c.devices), key=repr)


def _answer(alloc: ClaimAllocation, planned: Decision, res: Reservation) -> list[PreparedDevice]:
    """What kubelet is told: every allocated device, the first a container of ``res`` holds
    carrying that container's CDI device, the others none. Kubelet hands a container the CDI
    devices of all the claim's devices it references (Device.cdi_device_ids is repeated and may be
    empty), so the claim's one set of edits reaches it once, never twice at the same paths. A claim
    prepared by the first layout (one container per device) is answered as it was: its pods run
    with those edits."""
    uid = alloc.uid
    where = {_device_key(d): c.name for c in res.decision.containers for d in c.devices}
    told: set[str] = set()
    out = []
    for a, d in zip(alloc.devices, planned.containers[0].devices):
        cont = where.get(_device_key(d))
        ids = () if cont is None or cont in told else (f"{names.CDI_KIND}={uid}-{cont}",)
        if cont is not None:
            told.add(cont)
        out.append(PreparedDevice(request=a.request, device=a.device, cdi_ids=ids, share_id=a.share_id))
    return out


def _shown(res: Reservation) -> str:
    parts = []
    for c in res.decision.containers:
        for d in c.devices:
            parts.append(f"GPU {d.index}: {d.mem_mib} MiB, {d.cores} % cores" if not d.mig_profile
                         else f"GPU {d.index}: MIG {d.mig_profile}")
    return "; ".join(parts) or "no devices"
