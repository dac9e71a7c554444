"""Turning committed decisions into the use of each GPU.

Per decision and GPU, a pod books the larger of its init containers' peak
and its app containers' sum (they never run together); a tenant with
``cores >= 100`` holds a GPU of 100% cores exclusively; MIG instances always add up;
MPS client shares are counted apart (``mps_used``) so the GPU keeps one share mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .fit import takes_whole
from .result import Decision
from .view import GpuView, MigSlot, NodeView


# One decision's use of one GPU: memory, cores, shares (tenants, against deviceSplitCount), whether it
# holds the GPU whole, its MIG instances, and how many of its shares are MPS clients.
Part = tuple[int, int, int, bool, tuple[MigSlot, ...], int]


def parts(dec: Decision, caps: dict[str, GpuView]) -> dict[str, Part]:
    """What ``dec`` books on each GPU of ``caps`` (GPUs it names that are not
    there are left out: a GPU that left the inventory, which the reconciler reports)."""
    mig: dict[str, list[MigSlot]] = {}
    whole: set[str] = set()
    per: dict[str, list[int]] = {}  # uuid -> [init mem, init cores, init n, app mem, app cores, app n, mps]
    for c in dec.containers:
        for d in c.devices:
            if d.uuid not in caps:
                continue
            if d.mig_profile is not None and d.mig_placement is not None:
                mig.setdefault(d.uuid, []).append(MigSlot(d.mig_profile, d.mig_placement))
                continue
            p = per.setdefault(d.uuid, [0, 0, 0, 0, 0, 0, 0])
            p[6] |= int(d.mps)
            if c.init:
                p[0], p[1], p[2] = max(p[0], d.mem_mib), max(p[1], d.cores), 1
            else:
                p[3] += d.mem_mib
                p[4] += d.cores
                p[5] += 1
            if takes_whole(caps[d.uuid], d.cores):
                whole.add(d.uuid)
    out: dict[str, Part] = {}
    for uuid in set(per) | set(mig) | whole:
        p = per.get(uuid, [0, 0, 0, 0, 0, 0, 0])
        instances = tuple(mig.get(uuid, ()))
        n = max(p[2], p[5])
        # a pod's shares of one GPU are all MPS or none (one mode per GPU)
        out[uuid] = (max(p[0], p[3]), max(p[1], p[4]), n + len(instances), uuid in whole, instances, n if p[6] else 0)
    return out


class Tally:
    """The use of a node's GPUs as a running sum of decisions' :func:`parts`:
    adding or taking away one decision costs its own size, not the node's."""

    def __init__(self, capacity: Sequence[GpuView]) -> None:
        self.capacity = tuple(capacity)
        self.caps = {g.uuid: g for g in self.capacity}
        self._sum: dict[str, list] = {g.uuid: [0, 0, 0, 0, [], 0] for g in self.capacity}  # whole as a count

    def add(self, got: dict[str, Part], sign: int = 1) -> None:
        for uuid, (mem, cores, n, whole, mig, mps) in got.items():
            a = self._sum[uuid]
            a[0] += sign * mem
            a[1] += sign * cores
            a[2] += sign * n
            a[3] += sign * int(whole)
            if sign > 0:
                a[4].extend(mig)
            else:
                for m in mig:
                    a[4].remove(m)
            a[5] += sign * mps

    def view(self, name: str, gpu_policy: str = "spread", without: dict[str, Part] | None = None) -> NodeView:
        """The node with this use, less ``without`` (one decision's parts) if given."""
        if without:
            self.add(without, -1)
        try:
            gpus = tuple(g.with_use(a[0], a[1], a[2], a[3] > 0, tuple(a[4]), a[5])
                         for g in self.capacity for a in (self._sum[g.uuid],))
        finally:
            if without:
                self.add(without)
        return NodeView(name, gpus, gpu_policy)


def with_usage(name: str, capacity: Sequence[GpuView], decisions: Iterable[Decision],
               gpu_policy: str = "spread") -> NodeView:
    tally = Tally(capacity)
    for dec in decisions:
        tally.add(parts(dec, tally.caps))
    return tally.view(name, gpu_policy)
