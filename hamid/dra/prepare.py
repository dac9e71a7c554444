"""A claim's allocation into the node's ledger, and back out: the blocking half of prepare.

Runs in the node service's threads (:meth:`NodeService.run_blocking`). A
claim is the owner ``claim:<UID>``; each allocated device is one "container"
of its reservation (``d0``, ``d1``...), pinned to the GPU the scheduler
chose, with the memory and cores the claim consumes; the ledger re-checks it
against everything booked on the node (device-plugin pods, Docker
containers, other claims) and refuses what does not fit. The reservation's
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

import json
import os
from dataclasses import dataclass

from ..node.identity import Owner
from ..node.realize import realize
from ..node.service import LedgerConflict, NodeDoor, Reservation
from ..placement.view import MODE_MIG, GpuView
from ..request.model import ContainerRequest, GpuRequest, Request
from . import names
from .claims import MIB, ClaimAllocation, ClaimError

CDI_VERSION = "0.6.0"  # containerd >= 1.7 and CRI-O read it


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


def _devices_by_name(gpus: tuple[GpuView, ...]) -> dict[str, tuple[GpuView, str | None]]:
    """Pool device name -> (its GPU, the MIG profile it is)."""
    out: dict[str, tuple[GpuView, str | None]] = {}
    for g in gpus:
        if g.mode == MODE_MIG:
            for p in g.mig_profiles:
                for pl in p.placements:
                    out[names.mig_device_name(g.index, p.name, pl.start)] = (g, p.name)
        else:
            out[names.device_name(g.index)] = (g, None)
    return out


def claim_request(alloc: ClaimAllocation, gpus: tuple[GpuView, ...], dra_gpus: frozenset[str]) -> Request:
    """The ledger's request for ``alloc``: one container per allocated device, pinned to its GPU."""
    by_name = _devices_by_name(gpus)
    conts = []
    for i, d in enumerate(alloc.devices):
        got = by_name.get(d.device)
        if got is None:
            raise ClaimError(f"claim {alloc.namespace}/{alloc.name}: device {d.device!r} is not in this node's "
                             f"pool (it has: {', '.join(sorted(by_name)) or 'none'})")
        g, profile = got
        if g.uuid not in dra_gpus:
            raise ClaimError(f"claim {alloc.namespace}/{alloc.name}: GPU {g.index} ({d.device}) does not serve DRA "
                             "on this node (draDevices)")
        if profile is not None:
            gpu = GpuRequest(count=1, mem_percent=None, mem_mib=None, devices=(g.uuid,), mig_profile=profile,
                             mode="mig", priority=d.config.priority)
        else:
            mem_mib = -(-d.memory_bytes // MIB) if d.memory_bytes else None
            if d.memory_bytes is not None and d.memory_bytes == 0:
                raise ClaimError(f"claim {alloc.namespace}/{alloc.name}: device {d.device} consumes no memory; "
                                 "a share needs at least 1Mi")
            gpu = GpuRequest(count=1, mem_mib=mem_mib, mem_percent=None if mem_mib else 100,
                             cores=d.cores or 0, devices=(g.uuid,), priority=d.config.priority,
                             core_policy=d.config.core_policy)
        conts.append(ContainerRequest(name=f"d{i}", gpu=gpu))
    return Request(owner=f"claim:{alloc.namespace}/{alloc.name}", containers=tuple(conts), uid=alloc.uid)


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
        request = claim_request(alloc, self.door.view().gpus, dra_gpus)
        res = self.door.get(key)
        if res is not None and res.state == "releasing":
            raise ClaimError(f"claim {alloc.namespace}/{alloc.name} is being released; kubelet retries")
        if res is not None and not _same(res, request):
            raise ClaimError(f"claim {alloc.namespace}/{alloc.name} was prepared here with another allocation "
                             f"({_shown(res)}); it must be unprepared first")
        if res is None or res.state == "reserved":
            try:
                res = self.door.admit(Owner("claim", alloc.uid, name=f"{alloc.namespace}/{alloc.name}"), request,
                                      slots={}).reservation
            except LedgerConflict as e:
                raise ClaimError(f"claim {alloc.namespace}/{alloc.name} does not fit on this node now: {e}") from None
        path = self._write_spec(res)
        self.door.attach_file(key, path)
        return [PreparedDevice(request=d.request, device=d.device, cdi_id=f"{names.CDI_KIND}={alloc.uid}-d{i}",
                               share_id=d.share_id) for i, d in enumerate(alloc.devices)]

    def _write_spec(self, res: Reservation) -> str:
        uid = res.owner.partition(":")[2]
        devices = []
        for c in res.decision.containers:
            edits = realize(res, self.door.facts, c.name).to_cdi()
            if not edits.get("hooks"):
                edits.pop("hooks", None)
            devices.append({"name": f"{uid}-{c.name}", "containerEdits": edits})
        doc = {"cdiVersion": CDI_VERSION, "kind": names.CDI_KIND, "devices": devices}
        os.makedirs(self.cdi_dir, mode=0o755, exist_ok=True)
        path = spec_path(self.cdi_dir, uid)
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path


def _same(res: Reservation, request: Request) -> bool:
    """Whether ``res`` books what ``request`` asks (a repeated prepare of the same allocation)."""
    booked = {c.name: c.devices for c in res.decision.containers}
    if set(booked) != {c.name for c in request.containers}:
        return False
    for c in request.containers:
        g = c.gpu
        devs = booked[c.name]
        if g is None or len(devs) != 1 or devs[0].uuid not in g.devices:
            return False
        d = devs[0]
        if g.mig_profile is not None:
            if d.mig_profile != g.mig_profile:
                return False
        elif (g.mem_mib is not None and d.mem_mib != g.mem_mib) or d.cores != g.cores:
            return False
    return True


def _shown(res: Reservation) -> str:
    parts = []
    for c in res.decision.containers:
        for d in c.devices:
            parts.append(f"GPU {d.index}: {d.mem_mib} MiB, {d.cores} % cores" if not d.mig_profile
                         else f"GPU {d.index}: MIG {d.mig_profile}")
    return "; ".join(parts) or "no devices"
