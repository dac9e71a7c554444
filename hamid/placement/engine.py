"""Choosing a node and GPUs for a whole request, and re-checking a decision.

Nodes are ranked on their current use (``binpack``: fullest first,
``spread``: emptiest first) and the request goes to the first node where all
of its containers fit. Within a node, each container's GPUs are ranked by
HAMi's GPU score including the request (``binpack``: the GPU that ends up
fullest; ``spread``: the emptiest), ties broken by NUMA node then index.

Containers of one pod are fitted in order on an accumulating copy of the
node's use, so they can share a GPU. Init containers run before the app
containers and never beside them, so each one is fitted against the node
without the pod's app containers and the pod books, per GPU, the larger of
its init peak and its app sum. MIG instances are real objects that exist
together, so they always accumulate.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from ..request.model import GpuRequest, Request
from . import mig
from .fit import Use, book, eligible, room, score, try_gpu
from .result import ContainerAssignment, Decision, DeviceAssignment, NoFit
from .view import MODE_MIG, GpuView, NodeView


class _NodeUse:
    """Lazily copied use of one node's GPUs while one request is fitted."""

    __slots__ = ("base", "app")

    def __init__(self, node: NodeView) -> None:
        self.base = {g.index: g for g in node.gpus}
        self.app: dict[int, Use] = {}

    def app_use(self, g: GpuView) -> Use:
        u = self.app.get(g.index)
        if u is None:
            u = self.app[g.index] = Use.of(g)
        return u

    def init_use(self, g: GpuView) -> Use:
        u = Use.of(g)
        u.mig = self.app_use(g).mig  # MIG instances always accumulate
        return u


def _rank_key(policy: str):
    if policy == "binpack":
        return lambda c: (-c[0], c[1].numa if c[1].numa is not None else 1 << 30, c[1].index)
    return lambda c: (c[0], c[1].numa if c[1].numa is not None else 1 << 30, c[1].index)


def _fit_container(req: GpuRequest, node: NodeView, use: _NodeUse, init: bool, policy: str):
    cands = []
    reasons: list[str] = []
    statically_ok = 0
    for g in node.gpus:
        u = use.init_use(g) if init else use.app_use(g)
        got = try_gpu(req, g, u)
        if isinstance(got, str):
            reasons.append(got)
            if eligible(req, g) is None:
                statically_ok += 1
            continue
        statically_ok += 1
        mem, cores, _, _ = got
        cands.append((score(g, u, mem, cores), g, u, got))
    need = req.count if req.count is not None else statically_ok
    if need == 0:
        return reasons or ["no GPUs"], None
    if len(cands) < need:
        reasons.append(f"needs {need} GPU(s), {len(cands)} fit")
        return reasons, None
    cands.sort(key=_rank_key(policy))
    if req.numa_bind:
        groups: dict = {}
        for c in cands:
            groups.setdefault(c[1].numa, []).append(c)
        chosen = next((grp for grp in groups.values() if len(grp) >= need), None)
        if chosen is None:
            sizes = ", ".join(f"NUMA {k}: {len(v)}" for k, v in groups.items())
            return [f"numa-bind: needs {need} GPU(s) on one NUMA node, fitting GPUs per node are {sizes}"], None
        cands = chosen
    out = []
    for _, g, u, (mem, cores, prof, pl) in cands[:need]:
        book(u, mem, cores, prof, pl)
        out.append(DeviceAssignment(g.uuid, g.index, mem, cores, prof, pl))
    return None, tuple(out)


def _quick_reject(req: GpuRequest, node: NodeView) -> str | None:
    """A cheap necessary condition on the node as a whole (None = look closer).

    Requests that name no mode may land on shim or MIG GPUs alike, so both
    kinds are counted for them. A percent of memory is resolved per GPU, so
    it is not checked here. This runs for every node a request passes over,
    so it is O(1) for nodes without MIG GPUs.
    """
    need = req.count or 1
    mig_ok = 0
    if req.mode != "hami-core" and node.mig_creatable:
        for best, names in node.mig_creatable:
            if req.mig_profile is not None:
                mig_ok += req.mig_profile in names
            elif req.mem_mib is None or best >= req.mem_mib:
                mig_ok += 1
    if req.wants_mig:
        if mig_ok < need:
            what = req.mig_profile or (f"{req.mem_mib} MiB" if req.mem_mib else "any profile")
            return f"needs {need} MIG GPU(s) that can still create {what}, {mig_ok} can"
        return None
    free = node.open_shim_free_mem  # most free first
    short = need - mig_ok
    if short <= 0:
        return None
    if len(free) < short:
        return f"needs {need} GPU(s) with a free share slot, {len(free) + mig_ok} have one"
    if req.mem_mib is not None and free[short - 1] < req.mem_mib:
        n = sum(1 for f in free if f >= req.mem_mib)
        return (f"needs {need} GPU(s) with {req.mem_mib} MiB free and a free share slot, {n + mig_ok} have it "
                f"(most free: {free[0]} MiB)")
    return None


def fit_node(request: Request, node: NodeView, quick: bool = True) -> Decision | list[str]:
    """All containers of ``request`` on ``node``, or the reasons they do not fit.

    With ``quick``, a node that cannot possibly fit is turned away with one
    node-level reason; without it every GPU's reason is collected.
    """
    multi = sum(1 for c in request.containers if c.gpu is not None) > 1
    for c in request.containers:
        if quick and c.gpu is not None:
            why = _quick_reject(c.gpu, node)
            if why:
                return [f"container {c.name}: {why}" if multi else why]
    policy = request.gpu_policy or node.gpu_policy
    use = _NodeUse(node)
    out = []
    for c in request.containers:
        if c.gpu is None:
            out.append(ContainerAssignment(c.name, c.init, ()))
            continue
        reasons, devs = _fit_container(c.gpu, node, use, c.init, policy)
        if devs is None:
            prefix = f"container {c.name}: " if multi else ""
            seen: list[str] = []
            for r in reasons:
                if r not in seen:
                    seen.append(prefix + r if prefix else r)
            return seen
        out.append(ContainerAssignment(c.name, c.init, devs))
    return Decision(node.name, tuple(out))


_BY_SCORE = attrgetter("usage_score")


def place(request: Request, nodes: Sequence[NodeView], node_policy: str = "binpack") -> Decision | NoFit:
    """Choose a node and GPUs for ``request``, or say per node why not."""
    if not request.wants_gpu:
        return NoFit({"*": ("the request asks for no GPU",)})
    policy = request.node_policy or node_policy
    ordered = sorted(nodes, key=_BY_SCORE, reverse=(policy == "binpack"))
    for node in ordered:
        got = fit_node(request, node)
        if isinstance(got, Decision):
            return got
    # Nothing fits: only now pay for the per-GPU reasons on every node.
    reasons: dict[str, tuple[str, ...]] = {}
    for node in ordered:
        got = fit_node(request, node, quick=False)
        reasons[node.name] = tuple(got) if isinstance(got, list) and got else ("no GPUs",)
    return NoFit(reasons)


def check(decision: Decision, node: NodeView) -> list[str]:
    """Why ``decision`` cannot be committed on ``node`` as it is now ([] = it can).

    The ledger calls this inside its transaction, so whatever proposed the
    decision (the local API, the extender, a runtime hook) is re-checked
    against the node's own record.
    """
    gpus = {g.uuid: g for g in node.gpus}
    use = _NodeUse(node)
    problems: list[str] = []
    for c in decision.containers:
        seen: set[str] = set()
        for d in c.devices:
            g = gpus.get(d.uuid)
            if g is None:
                problems.append(f"container {c.name}: no GPU {d.uuid} on node {node.name}")
                continue
            if d.uuid in seen:
                problems.append(f"container {c.name}: GPU {g.index} assigned twice")
                continue
            seen.add(d.uuid)
            if g.filtered:
                problems.append(f"container {c.name}: GPU {g.index} is excluded by this node's filterDevices")
                continue
            if not g.healthy:
                problems.append(f"container {c.name}: GPU {g.index} is unhealthy")
                continue
            u = use.init_use(g) if c.init else use.app_use(g)
            if d.mig_profile is not None:
                if g.mode != MODE_MIG or d.mig_placement is None:
                    problems.append(f"container {c.name}: GPU {g.index} is not in MIG mode")
                    continue
                why = mig.slot_is_valid(g, d.mig_profile, d.mig_placement, u.mig)
            else:
                if g.mode == MODE_MIG:
                    problems.append(f"container {c.name}: GPU {g.index} is in MIG mode; a shim share cannot go there")
                    continue
                if d.mem_mib <= 0 or not 0 <= d.cores <= 100:
                    problems.append(f"container {c.name}: GPU {g.index}: bad amounts {d.mem_mib} MiB, {d.cores}%")
                    continue
                why = room(g, u, d.mem_mib, d.cores)
            if why:
                problems.append(f"container {c.name}: {why}")
                continue
            book(u, d.mem_mib, d.cores, d.mig_profile, d.mig_placement)
    return problems
