"""Per-GPU checks: may this GPU serve this request, and does it have room.

Checks run in HAMi's order (health, cordon, filters, mode, UUIDs, shares,
memory, cores, exclusivity, MIG) and each failure is a sentence naming the GPU and
the numbers, e.g. ``GPU 1 has 2048 MiB free, 4096 requested``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..devices.types import MigPlacement
from ..request.model import GpuRequest, ScoringWeights
from . import mig
from .reasons import Reason
from .view import MODE_MIG, MODE_SHIM, SHARE_MPS, GpuView, MigSlot, type_matches

# What a refusal tells the operator to change when a GPU does not serve the mode asked for.
MODE_SETTING = "operatingMode (node) or deviceModes (per GPU) in the hamid config"
# What a node that should serve MPS needs and lacks. NVIDIA's MPS programs come with the driver (their
# version must match it), so no image can carry them: the NVIDIA container runtime mounts them into a
# container given the driver's "compute" capability (libnvidia-container's compute binaries).
MPS_PROGRAMS_HELP = ("NVIDIA's nvidia-cuda-mps-control and nvidia-cuda-mps-server (the driver's MPS programs) must "
                     "be on hamid's PATH, or mpsControl must name the control program's path: on Kubernetes give "
                     "hamid's container the driver's compute capability (chart: nvidia.driverCapabilities "
                     "\"utility,compute\", the default) so the NVIDIA runtime mounts them; on a host, install the "
                     "driver's utilities (e.g. Debian's nvidia-cuda-mps); then restart hamid")


@dataclass
class Use:
    """Mutable use of one GPU while a request is being fitted."""

    mem: int
    cores: int
    shares: int  # tenants, against the GPU's shares_total (deviceSplitCount)
    exclusive: bool
    mig: list[MigSlot] = field(default_factory=list)
    mps: int = 0  # of shares, the MPS client shares

    @classmethod
    def of(cls, g: GpuView) -> "Use":
        return cls(g.mem_used, g.cores_used, g.shares_used, g.exclusive, list(g.mig_used), g.mps_used)

    def copy(self) -> "Use":
        return Use(self.mem, self.cores, self.shares, self.exclusive, list(self.mig), self.mps)


def eligible(req: GpuRequest, g: GpuView) -> Reason | None:
    """Static checks that do not depend on use."""
    if g.filtered:
        return Reason("filtered", f"GPU {g.index} is excluded by this node's filterDevices", gpu=g.index)
    if g.dra and not names_gpu(req, g):
        return dra_reason(g)
    if not g.healthy:
        return Reason("unhealthy", f"GPU {g.index} is unhealthy", gpu=g.index)
    if g.cordoned:
        return Reason("cordoned", f"GPU {g.index} is cordoned (hami.io/device-cordon): it takes no new tenants", gpu=g.index)
    if req.devices and str(g.index) not in req.devices and g.uuid not in req.devices:
        return Reason("devices", f"GPU {g.index} is not among the requested devices {','.join(req.devices)}",
                      gpu=g.index, asked=",".join(req.devices))
    if req.use_types and not any(type_matches(g, t) for t in req.use_types):
        return Reason("usetype", f"GPU {g.index} type {g.name!r} (HAMi type {g.type_names[1]!r}) does not match "
                      f"use-gputype {','.join(req.use_types)}", gpu=g.index, asked=",".join(req.use_types))
    if req.nouse_types and any(type_matches(g, t) for t in req.nouse_types):
        return Reason("nousetype", f"GPU {g.index} type {g.name!r} matches nouse-gputype {','.join(req.nouse_types)}",
                      gpu=g.index, asked=",".join(req.nouse_types))
    if req.use_uuids and g.uuid not in req.use_uuids:
        return Reason("useuuid", f"GPU {g.index} ({g.uuid}) is not in use-gpuuuid", gpu=g.index)
    if req.nouse_uuids and g.uuid in req.nouse_uuids:
        return Reason("nouseuuid", f"GPU {g.index} ({g.uuid}) is in nouse-gpuuuid", gpu=g.index)
    if req.wants_mig and g.mode != MODE_MIG:
        return Reason("notmig", not_mig_reason(g), gpu=g.index, what="mode" if g.mig_capable else "hardware")
    if req.mode in (MODE_SHIM, SHARE_MPS) and g.mode == MODE_MIG:
        return Reason("mig", f"GPU {g.index} is in MIG mode; {req.mode} was requested", gpu=g.index, asked=req.mode)
    if req.mode in (MODE_SHIM, SHARE_MPS) and req.mode not in g.serves:
        return Reason("serves", f"GPU {g.index} does not serve {req.mode} (it serves {g.mode_label}); to allow it set "
                      f"{MODE_SETTING} to {req.mode} or any", gpu=g.index, asked=req.mode)
    if req.mode == SHARE_MPS and g.mps_missing:
        return mps_missing_reason(g)
    return None


def names_gpu(req: GpuRequest, g: GpuView) -> bool:
    """Does ``req`` name ``g`` among its devices (Docker's ``HAMI_VISIBLE_DEVICES``)?"""
    return str(g.index) in req.devices or g.uuid in req.devices


def dra_reason(g: GpuView) -> Reason:
    # A GPU of draDevices is DRA's: the device plugin does not offer it, and placement chooses it only for
    # a container that names it, so nothing lands there by accident.
    return Reason("dra", f"GPU {g.index} serves DRA (draDevices): DRA claims use it, and Docker containers that "
                  "name it (HAMI_VISIBLE_DEVICES); not device-plugin pods", gpu=g.index)


def mps_missing_reason(g: GpuView) -> Reason:
    # the help (~480 characters) is said once per refusal, by NoFit.message, not once per GPU
    return Reason("mpsmissing", f"GPU {g.index} is set to serve mps but its node cannot run MPS (NVIDIA's MPS "
                  "programs are missing)", gpu=g.index, asked=SHARE_MPS, what=MPS_PROGRAMS_HELP)


def share_mode(req: GpuRequest, g: GpuView, u: "Use") -> str:
    """The mode a share of ``g`` for ``req`` takes: the one asked for, else
    the mode the GPU's current tenants use, else the GPU's default."""
    if req.mode in (MODE_SHIM, SHARE_MPS):
        return req.mode
    if u.shares:
        return SHARE_MPS if u.mps else MODE_SHIM
    if g.mps_missing:  # the first mode it can run (an mps-only GPU stays mps, and mode_room says why not)
        return next((m for m in g.serves if m != SHARE_MPS), g.serves[0])
    return g.serves[0]


def mode_room(g: GpuView, u: "Use", mode: str) -> Reason | None:
    """One share mode at a time: MPS clients and hami-core tenants never share a GPU
    (a non-MPS context would time-slice against the MPS server's partitions)."""
    if mode == SHARE_MPS and g.mps_missing:
        return mps_missing_reason(g)
    if mode == SHARE_MPS and u.shares > u.mps:
        return Reason("onemode", f"GPU {g.index} has {u.shares - u.mps} hami-core tenant(s); an MPS share needs a GPU "
                      "without them (a GPU serves one mode at a time)", gpu=g.index, asked=mode, what=MODE_SHIM)
    if mode == MODE_SHIM and u.mps:
        return Reason("onemode", f"GPU {g.index} has {u.mps} MPS tenant(s); a hami-core share needs a GPU without "
                      "them (a GPU serves one mode at a time)", gpu=g.index, asked=mode, what=SHARE_MPS)
    return None


def not_mig_reason(g: GpuView) -> str:
    """Why a MIG request cannot go to a GPU that shares through the shim, and what would change that."""
    if not g.mig_capable:
        return (f"GPU {g.index} ({g.name}) has no MIG: it shares through the shim only (MIG needs an A100, A30, "
                "H100, H200 or newer); ask for memory and cores instead of a MIG profile")
    return (f"GPU {g.index} is not in MIG mode (it serves {g.mode_label}); to use MIG on it, "
            f"enable MIG mode (as root, no process on the GPU: nvidia-smi -i {g.index} -mig 1), set "
            "operatingMode: mig for this node, and restart hamid")


def request_mem(req: GpuRequest, g: GpuView) -> int:
    if req.mem_mib is not None:
        return req.mem_mib
    return g.mem_total * (req.mem_percent or 100) // 100


def takes_whole(g: GpuView, cores: int) -> bool:
    """Does a share of ``cores`` % hold ``g`` exclusively? Only on a GPU of
    exactly 100% cores, as HAMi: with deviceCoreScaling above 1 a GPU has more
    than 100% to hand out and cores=100 is one tenant's part of it."""
    return cores >= 100 and g.cores_total == 100


def room(g: GpuView, u: Use, mem: int, cores: int) -> Reason | None:
    """Does a shim (hami-core) share of ``mem`` MiB and ``cores`` % fit now."""
    if u.shares >= g.shares_total:
        return Reason("shares", f"GPU {g.index} has all {g.shares_total} shares in use (deviceSplitCount)", gpu=g.index)
    if u.exclusive:
        return Reason("exclusive", f"GPU {g.index} is held exclusively (cores=100)", gpu=g.index)
    if takes_whole(g, cores) and u.shares > 0:
        return Reason("idle", f"GPU {g.index} has {u.shares} tenant(s); exclusive use (cores=100) needs an idle GPU",
                      gpu=g.index)
    free = g.mem_total - u.mem
    if mem > free:
        return Reason("mem", f"GPU {g.index} has {free} MiB free, {mem} requested", gpu=g.index, asked=mem, free=free)
    if u.cores + cores > g.cores_total:
        return Reason("cores", f"GPU {g.index} has {g.cores_total - u.cores}% cores free, {cores} requested", gpu=g.index,
                      asked=cores, free=g.cores_total - u.cores)
    if cores == 0 and u.cores >= g.cores_total:
        return Reason("nocores", f"GPU {g.index} has no cores left (all {g.cores_total}% reserved)", gpu=g.index)
    return None


def score(g: GpuView, u: Use, mem: int, cores: int, weights: ScoringWeights | None = None) -> float:
    """HAMi's GPU score including the request (higher = fuller), each
    fraction weighted by ``hami.io/device-scoring-weights`` (1 each unset)."""
    if g.mode == MODE_MIG:
        used = sum(s.placement.size for s in u.mig)
        return 10.0 * used / max(1, g.memory_slices)
    shares = (u.shares + 1) / max(1, g.shares_total)
    core = (u.cores + cores) / max(1, g.cores_total)
    memory = (u.mem + mem) / max(1, g.mem_total)
    if weights is None:
        return 10.0 * (shares + core + memory)
    return 10.0 * (weights.shares * shares + weights.core * core + weights.memory * memory)


def try_gpu(req: GpuRequest, g: GpuView, u: Use):
    """Either a reason string, or (mem, cores, mig_profile, mig_placement, mps)."""
    why = eligible(req, g)
    if why:
        return why
    mem = request_mem(req, g)
    if g.mode == MODE_MIG:
        got = mig.choose(g, mem, req.mig_profile, u.mig)
        if isinstance(got, str):
            return got
        prof, pl = got
        return prof.memory_mib, 0, prof.name, pl, False
    mode = share_mode(req, g, u)
    why = mode_room(g, u, mode) or room(g, u, mem, req.cores)
    if why:
        return why
    return mem, req.cores, None, None, mode == SHARE_MPS


def book(u: Use, g: GpuView, mem: int, cores: int, mig_profile: str | None,
         placement: MigPlacement | None, mps: bool = False) -> None:
    if mig_profile is not None and placement is not None:
        u.mig.append(MigSlot(mig_profile, placement))
        u.shares += 1
        return
    u.mem += mem
    u.cores += cores
    u.shares += 1
    u.mps += int(mps)
    if takes_whole(g, cores):
        u.exclusive = True
