"""A claim's allocation into the node's ledger, and back out: the blocking half of prepare.

Runs in the node service's threads (:meth:`NodeService.run_blocking`). A
claim is the owner ``claim:<UID>``; each allocated device is one "container"
of its reservation (``d0``, ``d1``...): exactly the scheduler's choice (the
GPU, the memory and cores the claim consumes; a MIG profile at the placement
the scheduler allocated by the counters, so the published counters stay
true), committed as a proposed placement: the ledger re-checks it against
everything booked on the node (device-plugin pods, Docker containers, other
claims) and refuses what does not fit. The reservation's
edits (``realize``: device nodes, shim, ``/etc/ld.so.preload``, limits file,
region directory, MPS pipe, MIG instance) become one CDI device per
allocated device, in one spec file per claim, named by the claim's UID so a
runtime's cache never serves a stale one; the ledger records the file, and
release removes it.

Idempotent: a claim prepared before is answered from its reservation (the
spec rewritten: ``/var/run/cdi`` is a tmpfs); the ledger is the checkpoint,
so this holds across daemon restarts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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
    cdi_id: str
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


def claim_plan(alloc: ClaimAllocation, gpus: tuple[GpuView, ...], dra_gpus: frozenset[str],
               node: str) -> tuple[Request, Decision]:
    """What the ledger books for ``alloc``: exactly the scheduler's choice (each allocated device one
    "container" ``d<n>``: its GPU, the memory and cores it consumes, or its MIG profile placement),
    and the request it stands for (kept with it: the priority and compute policy the limits file says).

    A device without consumed capacity (a cluster whose consumable-capacity gate is off allocates
    it whole) books the whole GPU: all its memory and cores 100."""
    by_name = devices_by_name(gpus)
    conts, assigned = [], []
    for i, d in enumerate(alloc.devices):
        got = by_name.get(d.device)
        if got is None:
            raise ClaimError(f"claim {alloc.namespace}/{alloc.name}: device {d.device!r} is not in this node's "
                             f"pool (it has: {', '.join(sorted(by_name)) or 'none'})")
        g, prof, pl = got
        if g.uuid not in dra_gpus:
            raise ClaimError(f"claim {alloc.namespace}/{alloc.name}: GPU {g.index} ({d.device}) does not serve DRA "
                             "on this node (draDevices)")
        name = f"d{i}"
        if prof is not None and pl is not None:
            gpu = GpuRequest(count=1, mem_percent=None, mem_mib=None, devices=(g.uuid,), mig_profile=prof.name,
                             mode="mig", priority=d.config.priority)
            dev = DeviceAssignment(g.uuid, g.index, prof.memory_mib, 0, prof.name, pl, False)
        else:
            if d.memory_bytes == 0:
                raise ClaimError(f"claim {alloc.namespace}/{alloc.name}: device {d.device} consumes no memory; "
                                 "a share needs at least 1Mi")
            whole = d.memory_bytes is None and d.cores is None
            mem_mib = g.mem_total if d.memory_bytes is None else -(-d.memory_bytes // MIB)
            cores = 100 if whole else (d.cores or 0)
            mps = bool(g.serves) and g.serves[0] == SHARE_MPS
            gpu = GpuRequest(count=1, mem_mib=mem_mib, mem_percent=None, cores=cores, devices=(g.uuid,),
                             priority=d.config.priority, core_policy=d.config.core_policy,
                             mode=SHARE_MPS if mps else None)
            dev = DeviceAssignment(g.uuid, g.index, mem_mib, cores, None, None, mps)
        conts.append(ContainerRequest(name=name, gpu=gpu))
        assigned.append(ContainerAssignment(name, False, (dev,)))
    request = Request(owner=f"claim:{alloc.namespace}/{alloc.name}", containers=tuple(conts), uid=alloc.uid)
    return request, Decision(node=node, containers=tuple(assigned))


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
        return [PreparedDevice(request=d.request, device=d.device, cdi_id=f"{names.CDI_KIND}={alloc.uid}-d{i}",
                               share_id=d.share_id) for i, d in enumerate(alloc.devices)]

    def _write_spec(self, res: Reservation) -> str:
        uid = res.owner.partition(":")[2]
        devices = [(f"{uid}-{c.name}", realize(res, self.door.facts, c.name)) for c in res.decision.containers]
        return write_cdi_spec(spec_path(self.cdi_dir, uid), names.CDI_KIND, devices)


def _booked(decision: Decision) -> list[tuple]:
    return [(c.name, tuple((d.uuid, d.mem_mib, d.cores, d.mig_profile, d.mig_placement) for d in c.devices))
            for c in decision.containers]


def _shown(res: Reservation) -> str:
    parts = []
    for c in res.decision.containers:
        for d in c.devices:
            parts.append(f"GPU {d.index}: {d.mem_mib} MiB, {d.cores} % cores" if not d.mig_profile
                         else f"GPU {d.index}: MIG {d.mig_profile}")
    return "; ".join(parts) or "no devices"
