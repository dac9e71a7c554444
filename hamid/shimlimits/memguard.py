"""Holding a container's processes that allocate outside the shim to its memory limit.

Owns the daemon's answer to GPU memory no shim counts. The shim refuses an
allocation past the container's limit, but only in processes that map it: a
process with none of the installed shim files mapped (the kernel's list of its
mappings, hostpids.maps_any) allocates whatever the driver gives it, and its
neighbours' allocations then fail. NVML's process list says how much GPU
memory each host pid holds (usedGpuMemory: nothing the container writes), and
the host's pid map says whose each pid is. A container whose processes hold
more than its limit + SLACK, MEMORY_PASSES passes running, is counted; with
``memoryBypass: kill`` its processes that have no shim are killed (SIGKILL
through a pidfd, the owner checked after the pidfd is open), as a cgroup's
memory limit kills. Memory a stopped process holds stays held, so stopping is
no answer here. Processes that map the shim are never killed: their shim
holds their own allocations to the limit (shim 0.3.1: its own tally, whatever
the region says), and several of them writing their region could at most be
over together; that is counted and logged only.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from hamid.logs import get_logger

log = get_logger("shimlimits")

# What NVML may count of an honest container beyond its limit: the shim counts its context's growth (modules
# loaded lazily, the driver's own allocations) when it next reconciles with NVML, at most 200 ms later and
# always before it refuses; 2 % of the limit, at least 128 MiB, covers a module set loaded in between.
SLACK_MIN_BYTES = 128 << 20
SLACK_RATIO = 0.02
# NVML's process list is read once a pass: over in two passes running is over for a second, not a reading
# taken between an allocation and its free
MEMORY_PASSES = 2

Key = tuple[str, int]  # (limits file, device index): one container on one GPU
# What the status and a pod's Event say of a container the guard acted on, by reason
MEMORY_SAYS = {
    "over-memory": "its processes held more GPU memory than its limit by NVML's count of them, and those with no "
                   "shim (nothing inside counted their allocations) were killed",
}


class Killer(Protocol):
    """What kills a container's processes (Signals; a test's recorder)."""

    def kill(self, key: Key, pids: Iterable[int]) -> int: ...


@dataclass(frozen=True)
class MemUse:
    """One container's GPU memory on one GPU, as the pass read it."""

    key: Key
    limit_bytes: int  # its memory limit there (its limits file); 0: none
    used_bytes: int  # what NVML's process list gives its host pids
    bare: tuple[int, ...] = ()  # those of its pids with no installed shim mapped


def slack(limit_bytes: int) -> int:
    return max(SLACK_MIN_BYTES, int(SLACK_RATIO * limit_bytes))


@dataclass
class MemoryGuard:
    """The pass's memory between runs: each container's passes over its limit, and what it counted."""

    killer: Killer | None = None  # None: only counted (memoryBypass: report)
    over_passes: int = 0  # passes in which some container was over its limit (for /metrics)
    kills: int = 0  # processes killed (for /metrics)
    _streak: dict[Key, int] = field(default_factory=dict)
    killed_last: list[Key] = field(default_factory=list)  # the containers whose processes the last pass killed

    def run(self, uses: Iterable[MemUse]) -> None:
        seen: set[Key] = set()
        self.killed_last = []
        for u in uses:
            seen.add(u.key)
            if not u.limit_bytes or u.used_bytes <= u.limit_bytes + slack(u.limit_bytes):
                self._streak.pop(u.key, None)
                continue
            n = self._streak[u.key] = self._streak.get(u.key, 0) + 1
            if n < MEMORY_PASSES:
                continue
            self.over_passes += 1
            act = self.killer is not None and bool(u.bare)
            if n == MEMORY_PASSES or act:
                log.warning("container over its GPU memory limit by NVML's count of its processes"
                            + (": killing its processes that have no shim" if act else
                               ("" if u.bare else ": all its processes map the shim; counted only")),
                            limits=u.key[0], device=u.key[1], used_mib=u.used_bytes >> 20,
                            limit_mib=u.limit_bytes >> 20, unshimmed=list(u.bare))
            if act and self.killer is not None:
                got = self.killer.kill(u.key, u.bare)
                self.kills += got
                if got:
                    self.killed_last.append(u.key)
        self._streak = {k: v for k, v in self._streak.items() if k in seen}


class PidfdKiller:
    """SIGKILL through pidfds, each process checked to be the container's (``owns``: the host's pid map)
    after its pidfd is open, so a pid handed to another process since the pass read the map is never
    killed."""

    def __init__(self, owns: Callable[[Key, int], bool]) -> None:
        self._owns = owns

    def kill(self, key: Key, pids: Iterable[int]) -> int:
        n = 0
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except OSError:  # gone
                continue
            try:
                if self._owns(key, pid):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    n += 1
            except OSError:  # exited since
                pass
            finally:
                os.close(fd)
        return n
