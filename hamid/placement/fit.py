"""Per-GPU checks: may this GPU serve this request, and does it have room.

Checks run in HAMi's order (health, cordon, filters, mode, UUIDs, slots,
memory, cores, exclusivity, MIG) and each failure is a sentence naming the GPU and
the numbers, e.g. ``GPU 1 has 2048 MiB free, 4096 requested``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..devices.types import MigPlacement
from ..request.model import GpuRequest, ScoringWeights
from . import mig
from .view import MODE_MIG, GpuView, MigSlot, type_matches


@dataclass
class Use:
    """Mutable use of one GPU while a request is being fitted."""

    mem: int
    cores: int
    slots: int
    exclusive: bool
    mig: list[MigSlot] = field(default_factory=list)

    @classmethod
    def of(cls, g: GpuView) -> "Use":
        return cls(g.mem_used, g.cores_used, g.slots_used, g.exclusive, list(g.mig_used))

    def copy(self) -> "Use":
        return Use(self.mem, self.cores, self.slots, self.exclusive, list(self.mig))


def eligible(req: GpuRequest, g: GpuView) -> str | None:
    """Static checks that do not depend on use."""
    if g.filtered:
        return f"GPU {g.index} is excluded by this node's filterDevices"
    if not g.healthy:
        return f"GPU {g.index} is unhealthy"
    if g.cordoned:
        return f"GPU {g.index} is cordoned (hami.io/device-cordon): it takes no new tenants"
    if req.devices and str(g.index) not in req.devices and g.uuid not in req.devices:
        return f"GPU {g.index} is not among the requested devices {','.join(req.devices)}"
    if req.use_types and not any(type_matches(g, t) for t in req.use_types):
        return (f"GPU {g.index} type {g.name!r} (HAMi type {g.type_names[1]!r}) does not match use-gputype "
                f"{','.join(req.use_types)}")
    if req.nouse_types and any(type_matches(g, t) for t in req.nouse_types):
        return f"GPU {g.index} type {g.name!r} matches nouse-gputype {','.join(req.nouse_types)}"
    if req.use_uuids and g.uuid not in req.use_uuids:
        return f"GPU {g.index} ({g.uuid}) is not in use-gpuuuid"
    if req.nouse_uuids and g.uuid in req.nouse_uuids:
        return f"GPU {g.index} ({g.uuid}) is in nouse-gpuuuid"
    if req.wants_mig and g.mode != MODE_MIG:
        return f"GPU {g.index} is not in MIG mode (it shares through the shim, mode hami-core)"
    if req.mode == "hami-core" and g.mode == MODE_MIG:
        return f"GPU {g.index} is in MIG mode; hami-core was requested"
    return None


def request_mem(req: GpuRequest, g: GpuView) -> int:
    if req.mem_mib is not None:
        return req.mem_mib
    return g.mem_total * (req.mem_percent or 100) // 100


def takes_whole(g: GpuView, cores: int) -> bool:
    """Does a share of ``cores`` % hold ``g`` exclusively? Only on a GPU of
    exactly 100% cores, as HAMi: with deviceCoreScaling above 1 a GPU has more
    than 100% to hand out and cores=100 is one tenant's part of it."""
    return cores >= 100 and g.cores_total == 100


def room(g: GpuView, u: Use, mem: int, cores: int) -> str | None:
    """Does a shim (hami-core) share of ``mem`` MiB and ``cores`` % fit now."""
    if u.slots >= g.slots_total:
        return f"GPU {g.index} has all {g.slots_total} share slots in use"
    if u.exclusive:
        return f"GPU {g.index} is held exclusively (cores=100)"
    if takes_whole(g, cores) and u.slots > 0:
        return f"GPU {g.index} has {u.slots} tenant(s); exclusive use (cores=100) needs an idle GPU"
    free = g.mem_total - u.mem
    if mem > free:
        return f"GPU {g.index} has {free} MiB free, {mem} requested"
    if u.cores + cores > g.cores_total:
        return f"GPU {g.index} has {g.cores_total - u.cores}% cores free, {cores} requested"
    if cores == 0 and u.cores >= g.cores_total:
        return f"GPU {g.index} has no cores left (all {g.cores_total}% reserved)"
    return None


def score(g: GpuView, u: Use, mem: int, cores: int, weights: ScoringWeights | None = None) -> float:
    """HAMi's GPU score including the request (higher = fuller), each
    fraction weighted by ``hami.io/device-scoring-weights`` (1 each unset)."""
    if g.mode == MODE_MIG:
        used = sum(s.placement.size for s in u.mig)
        return 10.0 * used / max(1, g.memory_slices)
    slot = (u.slots + 1) / max(1, g.slots_total)
    core = (u.cores + cores) / max(1, g.cores_total)
    memory = (u.mem + mem) / max(1, g.mem_total)
    if weights is None:
        return 10.0 * (slot + core + memory)
    return 10.0 * (weights.slot * slot + weights.core * core + weights.memory * memory)


def try_gpu(req: GpuRequest, g: GpuView, u: Use):
    """Either a reason string, or (mem, cores, mig_profile, mig_placement)."""
    why = eligible(req, g)
    if why:
        return why
    mem = request_mem(req, g)
    if g.mode == MODE_MIG:
        got = mig.choose(g, mem, req.mig_profile, u.mig)
        if isinstance(got, str):
            return got
        prof, pl = got
        return prof.memory_mib, 0, prof.name, pl
    why = room(g, u, mem, req.cores)
    if why:
        return why
    return mem, req.cores, None, None


def book(u: Use, g: GpuView, mem: int, cores: int, mig_profile: str | None,
         placement: MigPlacement | None) -> None:
    if mig_profile is not None and placement is not None:
        u.mig.append(MigSlot(mig_profile, placement))
        u.slots += 1
        return
    u.mem += mem
    u.cores += cores
    u.slots += 1
    if takes_whole(g, cores):
        u.exclusive = True
