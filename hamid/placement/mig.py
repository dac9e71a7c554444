"""MIG: which profile, and which placement, for a request on one GPU.

The profile is the one named, or else the smallest whose memory holds the
request (then the fewest slices); ``+me`` profiles are only used when named.
Among the free placements of that profile, the engine takes the one after
which the largest profiles can still be created the most times, so small
instances do not fragment a GPU that could still host a big one.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from ..devices.types import MigPlacement, MigProfile
from .view import GpuView, MigSlot
from .reasons import Reason


def _max_instances(prof: MigProfile, used: Sequence[MigSlot], gpu) -> int:
    """How many more instances of ``prof`` could be created given ``used``."""
    left = prof.max_instances - sum(1 for s in used if s.profile == prof.name)
    if left <= 0:
        return 0
    if gpu.compute_slices:
        used_slices = 0
        for s in used:
            p = gpu.profile(s.profile)
            used_slices += p.slices if p else 0
        left = min(left, (gpu.compute_slices - used_slices) // max(1, prof.slices))
        if left <= 0:
            return 0
    # Greedy by end point gives the most non-overlapping placements.
    taken = [(s.placement[0], s.placement[0] + s.placement[1]) for s in used]
    count = 0
    for start, size in sorted(prof.placements, key=lambda p: (p[0] + p[1], p[0])):
        end = start + size
        if all(end <= a or b <= start for a, b in taken):
            taken.append((start, end))
            count += 1
            if count >= left:
                break
    return count


def free_placements(prof: MigProfile, used: Sequence[MigSlot], gpu) -> tuple[MigPlacement, ...]:
    """Placements of ``prof`` that could be created now (``gpu``: a GpuView)."""
    return _free(_key(gpu), prof, tuple(used))


@lru_cache(maxsize=65536)
def _free(gpu, prof: MigProfile, used: tuple[MigSlot, ...]) -> tuple[MigPlacement, ...]:
    if _max_instances(prof, used, gpu) <= 0:
        return ()
    spans = [(s.placement[0], s.placement[0] + s.placement[1]) for s in used]
    return tuple(pl for pl in prof.placements
                 if all(pl[0] + pl[1] <= a or b <= pl[0] for a, b in spans))


def slot_is_valid(gpu: GpuView, profile: str, placement: MigPlacement, used: Sequence[MigSlot]) -> str | None:
    """Why ``profile`` at ``placement`` cannot be booked on ``gpu`` now, or None."""
    prof = gpu.profile(profile)
    if prof is None:
        return Reason("migprofile", f"GPU {gpu.index} ({gpu.name}) has no MIG profile {profile}", gpu=gpu.index,
                      what=profile)
    if placement not in prof.placements:
        return Reason("migplace", f"GPU {gpu.index}: {placement} is not a placement of {profile}", gpu=gpu.index,
                      what=profile)
    if placement not in free_placements(prof, used, gpu):
        return Reason("migplace", f"GPU {gpu.index}: {profile} at {placement} overlaps a live instance or exceeds the "
                      "profile's limit", gpu=gpu.index, what=profile)
    return None


def _keep_score(gpu: GpuView, used: Sequence[MigSlot]) -> tuple[int, ...]:
    order = sorted(gpu.mig_profiles, key=lambda p: (-p.slices, -p.memory_mib, p.name))
    return tuple(_max_instances(p, used, gpu) for p in order if not p.media_extensions)


def profiles_for(gpu: GpuView, mem_mib: int, named: str | None) -> list[MigProfile] | str:
    """Candidate profiles in order of preference, or why there are none."""
    if named is not None:
        prof = gpu.profile(named)
        if prof is None:
            names = ", ".join(p.name for p in gpu.mig_profiles) or "none"
            return Reason("migprofile", f"GPU {gpu.index} ({gpu.name}) has no MIG profile {named}; its profiles: {names}",
                          gpu=gpu.index, what=named)
        return [prof]
    fits = [p for p in gpu.mig_profiles if p.memory_mib >= mem_mib and not p.media_extensions]
    if not fits:
        biggest = max((p.memory_mib for p in gpu.mig_profiles), default=0)
        return Reason("migsize", f"GPU {gpu.index}: no MIG profile holds {mem_mib} MiB (largest {biggest} MiB)",
                      gpu=gpu.index, asked=mem_mib)
    return sorted(fits, key=lambda p: (p.memory_mib, p.slices, p.name))


def choose(gpu: GpuView, mem_mib: int, named: str | None, used: Sequence[MigSlot]) -> tuple[MigProfile, MigPlacement] | str:
    """The profile and placement to create, or why none is free."""
    # Only the MIG-relevant parts of the view matter, so the answer is cached
    # on them: a cluster of identical GPUs asks the same question many times.
    return _choose(_key(gpu), mem_mib, named, tuple(used))


def _key(gpu) -> "_MigKey":
    return gpu if isinstance(gpu, _MigKey) else _MigKey(gpu.index, gpu.name, gpu.mig_profiles, gpu.compute_slices)


class _MigKey:
    """The MIG-relevant part of a GpuView, cheap to hash.

    Views of the same model share one profile tuple, so identity stands in
    for equality of the (large) profile table.
    """

    __slots__ = ("index", "name", "mig_profiles", "compute_slices", "_hash")

    def __init__(self, index, name, profiles, compute_slices):
        self.index, self.name, self.mig_profiles, self.compute_slices = index, name, profiles, compute_slices
        self._hash = hash((index, name, id(profiles), compute_slices))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return (isinstance(other, _MigKey) and self.index == other.index and self.name == other.name
                and self.compute_slices == other.compute_slices
                and (self.mig_profiles is other.mig_profiles or self.mig_profiles == other.mig_profiles))

    def profile(self, name: str) -> MigProfile | None:
        for p in self.mig_profiles:
            if p.name == name:
                return p
        return None


@lru_cache(maxsize=65536)
def _choose(gpu: _MigKey, mem_mib: int, named: str | None, used: tuple[MigSlot, ...]):
    cands = profiles_for(gpu, mem_mib, named)
    if isinstance(cands, str):
        return cands
    for prof in cands:
        free = free_placements(prof, used, gpu)
        if not free:
            continue
        if len(free) == 1:
            return prof, free[0]
        best = max(free, key=lambda pl: (_keep_score(gpu, [*used, MigSlot(prof.name, pl)]), -pl.start))
        return prof, best
    names = "/".join(p.name for p in cands)
    return Reason("migplace", f"GPU {gpu.index}: no free placement for {names} ({len(used)} MIG instance(s) live)",
                  gpu=gpu.index, what=str(names))
