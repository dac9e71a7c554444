"""Plain, immutable descriptions of GPUs and MIG profiles.

These types are what every other part sees of a device: the placement engine
reasons over them, the ledger stores them, the CLI prints them. They carry no
behaviour that needs a driver.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple


class MigPlacement(NamedTuple):
    """A span of memory slices ``[start, start + size)`` on one GPU.

    A named tuple: placements are hashed and compared in the placement
    engine's inner loop, where tuples are several times cheaper.
    """

    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size

    def overlaps(self, other: "MigPlacement") -> bool:
        return self.start < other.end and other.start < self.end

    def __str__(self) -> str:
        return f"{self.start}:{self.size}"


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile as NVML reports it for a given device.

    ``profile_id`` is the per-device ID NVML wants in create calls (never
    hard-code it across models); ``slices`` is the compute-slice count (the
    ``Ng`` of the name); ``placements`` are the possible memory-slice spans.
    """

    name: str
    profile_id: int
    memory_mib: int
    slices: int
    max_instances: int
    sm_count: int
    placements: tuple[MigPlacement, ...]
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        # Profiles key the placement engine's caches; hash the table once.
        object.__setattr__(self, "_hash", hash((self.name, self.profile_id, self.memory_mib, self.slices,
                                                self.max_instances, self.sm_count, self.placements)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def media_extensions(self) -> bool:
        return self.name.endswith("+me")


@dataclass(frozen=True)
class MigInstance:
    """A live GPU instance (with its one compute instance) on a GPU."""

    profile: str
    placement: MigPlacement
    gi_id: int
    ci_id: int
    uuid: str


@dataclass(frozen=True)
class GpuInfo:
    """Everything hamid needs to know about one physical GPU."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    sm_count: int
    numa_node: int | None = None
    healthy: bool = True
    mig_capable: bool = False
    mig_enabled: bool = False
    memory_slices: int = 0
    compute_slices: int = 0
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_instances: tuple[MigInstance, ...] = field(default=())
    minor: int | None = None
    links: tuple[tuple[str, int], ...] = ()  # (peer UUID, HAMi link score: n NVLinks x 100, else PCIe 10-60)

    def profile(self, name: str) -> MigProfile | None:
        for p in self.mig_profiles:
            if p.name == name:
                return p
        return None


@dataclass(frozen=True)
class BusyReading:
    """What one GPU ran since the previous reading (the sharing correction, hamid/shimlimits/live.py)."""

    busy_pct: float  # device-wide: the mean of NVML's GPU utilization samples since then
    busy_pids: frozenset[int]  # pids with a process utilization sample of smUtil > 0 since then
    pids: frozenset[int] | None = None  # every process with a context on it now (host pids); None: not known
    # pid -> the mean smUtil (%) of its process utilization samples since then; None: not known. Alone on the
    # GPU this is the process's share of GPU time; time-sliced beside others each busy process reads about the
    # device's whole busy share (an over-read, never an under-read)
    pid_busy: Mapping[int, float] | None = None
    # pid -> the GPU memory (bytes) NVML's process list says it holds now (usedGpuMemory); None: not known
    # (a pid NVML lists without a figure is left out)
    pid_mem: Mapping[int, int] | None = None


@dataclass(frozen=True)
class HostReading:
    """What one GPU reports of its use right now (for metrics); None: not known."""

    index: int
    uuid: str
    name: str
    memory_used_bytes: int | None = None
    utilization_gpu: int | None = None  # percent of time a kernel ran over the driver's sample period
    utilization_memory: int | None = None  # percent of time memory was read or written
    temperature_c: int | None = None
    power_w: float | None = None
    ecc_uncorrected: int | None = None  # volatile: since the driver loaded
