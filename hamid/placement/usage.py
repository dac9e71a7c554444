"""Turning committed decisions into the use of each GPU.

Per decision and GPU, a pod books the larger of its init containers' peak
and its app containers' sum (they never run together); a tenant with
``cores >= 100`` holds a GPU of 100% cores exclusively; MIG slots always add up;
MPS client shares are counted apart (``mps_used``) so the GPU keeps one share mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .fit import takes_whole
from .result import Decision
from .view import GpuView, MigSlot, NodeView


def with_usage(name: str, capacity: Sequence[GpuView], decisions: Iterable[Decision],
               gpu_policy: str = "spread") -> NodeView:
    acc: dict[str, list] = {g.uuid: [0, 0, 0, False, [], 0] for g in capacity}
    caps = {g.uuid: g for g in capacity}
    for dec in decisions:
        per: dict[str, list[int]] = {}  # uuid -> [init mem, init cores, init n, app mem, app cores, app n, mps]
        for c in dec.containers:
            for d in c.devices:
                a = acc.get(d.uuid)
                if a is None:
                    continue  # a GPU that left the inventory; the reconciler reports it
                if d.mig_profile is not None and d.mig_placement is not None:
                    a[4].append(MigSlot(d.mig_profile, d.mig_placement))
                    a[2] += 1
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
                    a[3] = True
        for uuid, p in per.items():
            a = acc[uuid]
            a[0] += max(p[0], p[3])
            a[1] += max(p[1], p[4])
            n = max(p[2], p[5])
            a[2] += n
            a[5] += n if p[6] else 0  # a pod's shares of one GPU are all MPS or none (one mode per GPU)
    gpus = tuple(g.with_use(a[0], a[1], a[2], a[3], tuple(a[4]), a[5]) for g in capacity for a in (acc[g.uuid],))
    return NodeView(name, gpus, gpu_policy)
