"""Choosing a node and GPUs for a whole request, and re-checking a decision.

Nodes are ranked on their current use (``binpack``: fullest first,
``spread``: emptiest first) and the request goes to the first node where all
of its containers fit. Within a node, each container's GPUs are ranked by
HAMi's GPU score including the request, weighted by the pod's
``hami.io/device-scoring-weights`` (``binpack``: the GPU that ends up
fullest; ``spread``: the emptiest), ties broken by NUMA node then index.
The GPU policy may also be ``mutex`` (idle GPUs only, ranked as spread),
``topology-aware`` (the set of GPUs with the highest summed link score; one
GPU: the least linked one) and may be chained with ``numa`` (``binpack,numa``:
a multi-GPU container stays on one NUMA node when one has enough GPUs).

Containers of one pod are fitted in order on an accumulating copy of the
node's use, so they can share a GPU. Init containers run before the app
containers and never beside them, so each one is fitted against the node
without the pod's app containers and the pod books, per GPU, the larger of
its init peak and its app sum. MIG instances are real objects that exist
together, so they always accumulate.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from math import comb
from operator import attrgetter

from ..request.model import GpuRequest, Request, ScoringWeights
from . import mig
from .fit import (MODE_SETTING, Use, book, dra_reason, eligible, mode_room, names_gpu, not_mig_reason, room, score,
                  try_gpu)
from .result import ContainerAssignment, Decision, DeviceAssignment, NoFit
from .view import MODE_MIG, MODE_SHIM, SHARE_MPS, GpuView, NodeView
from .reasons import Reason, in_container


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


def _rank_key(primary: str):
    if primary == "binpack":
        return lambda c: (-c[0], c[1].numa if c[1].numa is not None else 1 << 30, c[1].index)
    return lambda c: (c[0], c[1].numa if c[1].numa is not None else 1 << 30, c[1].index)


# Exact search over GPU sets for topology-aware up to this many sets; above
# it (more than ~16 candidate GPUs), a greedy build from the best pair.
TOPOLOGY_EXACT_MAX = 20000


def _pair_sum(gs) -> int:
    return sum(a.link_score(b.uuid) for a, b in combinations(gs, 2))


def _topology_pick(cands: list, need: int, node: NodeView) -> list:
    """HAMi's topology-aware choice among ranked candidates: one GPU, the one
    least linked to the node's others (keeping well-linked GPUs together for
    multi-GPU requests); several, the set with the highest summed pair score.
    Ties keep the policy's rank order."""
    if need == 1:
        total = {g.uuid: sum(g.link_score(o.uuid) for o in node.gpus if o.uuid != g.uuid) for g in node.gpus}
        return [min(cands, key=lambda c: total[c[1].uuid])]  # min keeps the first of equals
    if comb(len(cands), need) <= TOPOLOGY_EXACT_MAX:
        best = max(combinations(range(len(cands)), need),
                   key=lambda ix: (_pair_sum([cands[i][1] for i in ix]), [-i for i in ix]))
        return [cands[i] for i in best]
    i, j = max(combinations(range(len(cands)), 2),
               key=lambda p: (cands[p[0]][1].link_score(cands[p[1]][1].uuid), -p[0], -p[1]))
    chosen = [i, j]
    while len(chosen) < need:
        rest = [k for k in range(len(cands)) if k not in chosen]
        nxt = max(rest, key=lambda k: (sum(cands[k][1].link_score(cands[c][1].uuid) for c in chosen), -k))
        chosen.append(nxt)
    return [cands[k] for k in sorted(chosen)]


def _selector_misses(req: GpuRequest, node: NodeView) -> list[str]:
    """Requested devices (HAMI_VISIBLE_DEVICES) that name no GPU of ``node``."""
    have = {g.uuid for g in node.gpus} | {str(g.index) for g in node.gpus}
    out = []
    for d in req.devices:
        if d not in have:
            out.append(f"no GPU with UUID {d}" if d.startswith("GPU-") else
                       f"no GPU with index {d} (this node has {len(node.gpus)})")
    return out


def _fit_container(req: GpuRequest, node: NodeView, use: _NodeUse, init: bool, policy: str,
                   weights: ScoringWeights | None = None):
    primary, _, numa = policy.partition(",")
    cands = []
    reasons: list[str] = []
    statically_ok = 0
    for g in node.gpus:
        if req.devices and str(g.index) not in req.devices and g.uuid not in req.devices:
            continue  # not a candidate at all; a selector that names no GPU is said once below
        u = use.init_use(g) if init else use.app_use(g)
        got = try_gpu(req, g, u)
        if isinstance(got, str):
            reasons.append(got)
            if eligible(req, g) is None:
                statically_ok += 1
            continue
        statically_ok += 1
        if primary == "mutex" and u.shares > 0:
            reasons.append(Reason("idle", f"GPU {g.index} has {u.shares} tenant(s); the mutex policy takes idle GPUs only",
                                  gpu=g.index))
            continue
        mem, cores = got[0], got[1]
        cands.append((score(g, u, mem, cores, weights), g, u, got))
    need = req.count if req.count is not None else statically_ok
    if need == 0:
        return reasons or ["no GPUs"], None
    if len(cands) < need:
        reasons.extend(_selector_misses(req, node))
        reasons.append(Reason("count", f"needs {need} GPU(s), {len(cands)} fit", asked=need, free=len(cands)))
        return reasons, None
    cands.sort(key=_rank_key(primary))
    if req.numa_bind:
        groups: dict = {}
        for c in cands:
            groups.setdefault(c[1].numa, []).append(c)
        chosen = next((grp for grp in groups.values() if len(grp) >= need), None)
        if chosen is None:
            sizes = ", ".join(f"NUMA {k}: {len(v)}" for k, v in groups.items())
            return [f"numa-bind: needs {need} GPU(s) on one NUMA node, fitting GPUs per node are {sizes}"], None
        cands = chosen
    elif numa and need > 1:
        # The numa policy: one NUMA node when one has enough (the one holding
        # the best-ranked GPU first), otherwise the policy's order across nodes.
        groups = {}
        for c in cands:
            groups.setdefault(c[1].numa, []).append(c)
        cands = next((grp for grp in groups.values() if len(grp) >= need), cands)
    picked = _topology_pick(cands, need, node) if primary == "topology-aware" else cands[:need]
    out = []
    for _, g, u, (mem, cores, prof, pl, mps) in picked:
        book(u, g, mem, cores, prof, pl, mps)
        out.append(DeviceAssignment(g.uuid, g.index, mem, cores, prof, pl, mps))
    return None, tuple(out)


def gpu_scores(request: Request, node: NodeView) -> dict[str, float | str]:
    """Per GPU of ``node``: the score it has for the first GPU container of
    ``request`` (HAMi's GPU score with the request and the pod's weights), or
    why that container cannot use it. What ``hamid plan`` prints."""
    c = next((c for c in request.containers if c.gpu is not None), None)
    if c is None:
        return {}
    out: dict[str, float | str] = {}
    for g in node.gpus:
        u = Use.of(g)
        got = try_gpu(c.gpu, g, u)
        if isinstance(got, str):
            out[g.uuid] = got
        else:
            out[g.uuid] = round(score(g, u, got[0], got[1], request.weights), 4)
    return out


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
            return Reason("migcreate", f"needs {need} MIG GPU(s) that can still create {what}, {mig_ok} can",
                          asked=need, free=mig_ok, what=what)
        return None
    free = node.open_shim_free_mem  # most free first
    short = need - mig_ok
    if short <= 0:
        return None
    if len(free) < short:
        return Reason("shares", f"needs {need} GPU(s) with a free share, {len(free) + mig_ok} have one",
                      asked=need, free=len(free) + mig_ok)
    if req.mem_mib is not None and free[short - 1] < req.mem_mib:
        n = sum(1 for f in free if f >= req.mem_mib)
        return Reason("mem", f"needs {need} GPU(s) with {req.mem_mib} MiB free and a free share, {n + mig_ok} "
                      f"have it (most free: {free[0]} MiB)", asked=req.mem_mib, free=free[0])
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
                return [in_container(why, c.name) if multi else why]
    policy = request.gpu_policy or node.gpu_policy
    use = _NodeUse(node)
    out = []
    for c in request.containers:
        if c.gpu is None:
            out.append(ContainerAssignment(c.name, c.init, ()))
            continue
        reasons, devs = _fit_container(c.gpu, node, use, c.init, policy, request.weights)
        if devs is None:
            seen: list[str] = []
            for r in reasons:
                if r not in seen:
                    seen.append(in_container(r, c.name) if multi else r)
            return seen
        out.append(ContainerAssignment(c.name, c.init, devs))
    return Decision(node.name, tuple(out))


def feasible(request: Request, node: NodeView) -> list[str]:
    """``[]`` when ``request`` fits on ``node``, else the reasons: what the
    extender's filter asks of every node. For one GPU container (the common
    pod) it stops at the first GPUs that fit, without scoring or ranking
    them: the node policies change which GPUs are chosen, not whether enough
    fit. Anything else (several GPU containers, init containers, numa-bind, all
    GPUs) goes through :func:`fit_node`, which answers the same."""
    conts = [c for c in request.containers if c.gpu is not None]
    if len(conts) != 1 or conts[0].init or conts[0].gpu.numa_bind or conts[0].gpu.count is None:
        got = fit_node(request, node)
        return [] if isinstance(got, Decision) else got
    req = conts[0].gpu
    why = _quick_reject(req, node)
    if why:
        return [why]
    primary = (request.gpu_policy or node.gpu_policy).partition(",")[0]
    use = _NodeUse(node)
    n = 0
    for g in node.gpus:
        u = use.app_use(g)
        if isinstance(try_gpu(req, g, u), str) or (primary == "mutex" and u.shares > 0):
            continue
        n += 1
        if n >= req.count:
            return []
    got = fit_node(request, node, quick=False)  # it does not fit: every GPU's reason
    return [] if isinstance(got, Decision) else got


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


def check(decision: Decision, node: NodeView, *, request: Request | None = None, claim: bool = False) -> list[str]:
    """Why ``decision`` cannot be committed on ``node`` as it is now ([] = it can).

    The ledger calls this inside its transaction, so whatever proposed the
    decision (the local API, the extender, a runtime hook) is re-checked
    against the node's own record. ``claim``: the decision is a DRA claim's,
    which goes on DRA GPUs only; anything else goes on a DRA GPU only where
    ``request`` (what the owner asked) names it.
    """
    gpus = {g.uuid: g for g in node.gpus}
    asked = {c.name: c.gpu for c in request.containers} if request is not None else {}
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
            if g.cordoned:
                problems.append(f"container {c.name}: GPU {g.index} is cordoned (hami.io/device-cordon)")
                continue
            if claim and not g.dra:
                problems.append(f"container {c.name}: GPU {g.index} does not serve DRA on this node (draDevices)")
                continue
            req = asked.get(c.name)
            if g.dra and not claim and (req is None or not names_gpu(req, g)):
                problems.append(f"container {c.name}: {dra_reason(g)}")
                continue
            u = use.init_use(g) if c.init else use.app_use(g)
            if d.mig_profile is not None:
                if g.mode != MODE_MIG or d.mig_placement is None:
                    problems.append(f"container {c.name}: " + (not_mig_reason(g) if g.mode != MODE_MIG else
                                                                  f"GPU {g.index}: a MIG share without a placement"))
                    continue
                why = mig.slot_is_valid(g, d.mig_profile, d.mig_placement, u.mig)
            else:
                if g.mode == MODE_MIG:
                    problems.append(f"container {c.name}: GPU {g.index} is in MIG mode; a shim share cannot go there")
                    continue
                if d.mem_mib <= 0 or not 0 <= d.cores <= 100:
                    problems.append(f"container {c.name}: GPU {g.index}: bad amounts {d.mem_mib} MiB, {d.cores}%")
                    continue
                mode = SHARE_MPS if d.mps else MODE_SHIM
                if mode not in g.serves:
                    problems.append(f"container {c.name}: GPU {g.index} does not serve {mode} (it serves "
                                    f"{g.mode_label}); to allow it set {MODE_SETTING} to {mode} or any")
                    continue
                why = mode_room(g, u, mode) or room(g, u, d.mem_mib, d.cores)
            if why:
                problems.append(f"container {c.name}: {why}")
                continue
            book(u, g, d.mem_mib, d.cores, d.mig_profile, d.mig_placement, d.mps)
    return problems
