"""Where else a refused request would fit now: the hint a refusal carries.

Given a request and the node views of the cluster (the gossiped view), list
the nodes where the same request fits as they stand, best first, with what
each has free, and say it in one line for an error message. A refusal on a
full node (``docker run``, a pod that fits nowhere it may go) then tells the
user where to go instead. Pure: no I/O, the caller hands the views in.

Ranking: most free memory first, then most free compute, then the name, so
the answer is the same on every daemon that holds the same view. Free
memory and compute count only GPUs that could take a new tenant (healthy,
not filtered, not cordoned, not held exclusively); a MIG GPU's free memory is
its free memory slices' share of its memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..request.model import Request
from .engine import feasible
from .view import MODE_MIG, GpuView, NodeView

TOP = 3  # the "top three": enough choices without a wall of text in runc's error


@dataclass(frozen=True)
class Fit:
    node: str
    free_mib: int
    free_cores: int  # percent, summed over the node's usable GPUs (200 = two idle GPUs)


def _free(g: GpuView) -> tuple[int, int]:
    if not g.healthy or g.filtered or g.cordoned or g.exclusive:
        return 0, 0
    if g.mode == MODE_MIG and g.memory_slices:
        used = sum(s.placement.size for s in g.mig_used)
        return g.mem_total * (g.memory_slices - used) // g.memory_slices, 0
    if g.shares_used >= g.shares_total:
        return 0, 0
    return max(0, g.mem_total - g.mem_used), max(0, g.cores_total - g.cores_used)


def node_free(view: NodeView) -> tuple[int, int]:
    """(free MiB, free cores %) of a node's GPUs that can take a new tenant."""
    mem = cores = 0
    for g in view.gpus:
        m, c = _free(g)
        mem += m
        cores += c
    return mem, cores


def fits_elsewhere(request: Request, views: Iterable[NodeView], *, exclude: Iterable[str] = (),
                   top: int = TOP) -> list[Fit]:
    """The nodes (at most ``top``) where ``request`` fits now, best first."""
    skip = set(exclude)
    found = []
    for v in views:
        if v.name in skip or feasible(request, v):
            continue
        mem, cores = node_free(v)
        found.append(Fit(v.name, mem, cores))
    found.sort(key=lambda f: (-f.free_mib, -f.free_cores, f.node))
    return found[:top]


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f} GiB" if mib % 1024 else f"{mib // 1024} GiB"


def describe(fits: Sequence[Fit], looked_at: int, *, others: bool = True) -> str:
    """One line: ``it fits now on: b (70 GiB, 180% cores free), c (...)``, or
    that it fits on none of the ``looked_at`` (other, with ``others``) nodes."""
    if not fits:
        other = "other " if others else ""
        if looked_at == 0:
            return f"no {other}node is in this node's gossiped view to suggest"
        return f"it fits on none of the {looked_at} {other}node(s) of the gossiped view now"
    return "it fits now on: " + ", ".join(f"{f.node} ({_gib(f.free_mib)}, {f.free_cores}% cores free)"
                                          for f in fits)


def hint(request: Request, views: Sequence[NodeView], *, exclude: Iterable[str] = (), top: int = TOP) -> str:
    """:func:`fits_elsewhere` said in one line (:func:`describe`); with
    ``exclude`` (the refusing node) the others are called other nodes."""
    skip = set(exclude)
    rest = [v for v in views if v.name not in skip]
    return describe(fits_elsewhere(request, rest, top=top), len(rest), others=bool(skip))
