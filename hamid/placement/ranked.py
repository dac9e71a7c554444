"""A cluster's nodes kept in placement order, with summaries that let a request skip nodes it cannot use.

What it owns: the nodes of a cluster ranked as :func:`.engine.place` ranks
them (by ``usage_score``: binpack fullest first, spread emptiest first, ties
in the order the nodes were first added), kept up to date one node at a time,
so a decision does not sort every node again; and, per block of ranked nodes,
the element-wise maximum of each node's free-room summary, so a request walks
past whole blocks that no node of could take (a MIG profile on a cluster whose
MIG nodes are the emptiest, at the far end of binpack's order).

:meth:`RankedNodes.place` answers exactly what ``place(request, nodes,
node_policy)`` answers for the same nodes in insertion order: the summary
test is a necessary condition of the engine's own quick node check
(``engine._quick_reject``), so a skipped node is one the engine would have
turned away before looking at a GPU, and nodes are tried in the same order.
What it does not: fitting (``engine.fit_node``) or where views come from.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator

from ..request.model import GpuRequest, Request
from .engine import fit_node
from .result import Decision, NoFit
from .view import NodeView

# Nodes per block. A walk costs (blocks passed) + (nodes looked at in blocks
# that might fit); an update costs one block's summary. 64 keeps both small
# from 100 to 15,000 nodes (~235 blocks).
BLOCK = 64

_Summary = tuple  # (shim free, MIG best, combined, {profile: GPUs that can create it}); tuples sorted, largest first


def summary(node: NodeView) -> _Summary:
    """What a node could still take, as sorted tuples (the engine's cached per-view figures)."""
    shim = node.open_shim_free_mem
    mig = tuple(best for best, _ in node.mig_creatable)
    profiles: dict[str, int] = {}
    for _, names in node.mig_creatable:
        for p in names:
            profiles[p] = profiles.get(p, 0) + 1
    return shim, mig, tuple(sorted(shim + mig, reverse=True)), profiles


def _merge(sums: Iterable[_Summary]) -> _Summary:
    """Element-wise maximum: a block's summary is at least each of its nodes' in every entry."""
    out: list = [[], [], [], {}]
    for s in sums:
        for k in range(3):
            acc, new = out[k], s[k]
            for i, v in enumerate(new):
                if i < len(acc):
                    if v > acc[i]:
                        acc[i] = v
                else:
                    acc.append(v)
        prof = out[3]
        for p, n in s[3].items():
            if n > prof.get(p, 0):
                prof[p] = n
    return tuple(out[0]), tuple(out[1]), tuple(out[2]), out[3]


def _at_least(values: tuple, need: int, threshold: int) -> bool:
    """At least ``need`` of ``values`` (sorted, largest first) are >= ``threshold``."""
    return len(values) >= need and values[need - 1] >= threshold


def _may_take(req: GpuRequest, s: _Summary) -> bool:
    """False only when ``engine._quick_reject`` turns the node (or every node of the block) away."""
    need = req.count or 1
    thr = req.mem_mib if req.mem_mib is not None else 0  # free figures are >= 0: 0 means "has one"
    shim, mig, both, profiles = s
    if req.wants_mig:
        if req.mode == "hami-core":
            return False  # the quick check counts no MIG GPU for it
        if req.mig_profile is not None:
            return profiles.get(req.mig_profile, 0) >= need
        return _at_least(mig, need, thr)
    if req.mode == "hami-core":
        return _at_least(shim, need, thr)
    return _at_least(both, need, thr)


class RankedNodes:
    """Nodes in placement order for one node policy, updated one node at a time."""

    def __init__(self, nodes: Iterable[NodeView] = (), node_policy: str = "binpack") -> None:
        if node_policy not in ("binpack", "spread"):
            raise ValueError(f"node policy {node_policy!r}: accepted: binpack, spread")
        self.policy = node_policy
        self._seq: dict[str, int] = {}  # name -> insertion order (ties keep it, as a stable sort does)
        self._views: dict[str, NodeView] = {}
        self._key: dict[str, tuple] = {}
        self._blocks: list[list[tuple]] = []  # each sorted; every key of block i < every key of block i+1
        self._firsts: list[tuple] = []  # each block's first key, for bisect
        self._sums: list[_Summary] = []
        self._dirty: list[bool] = []  # a node left the block since its summary was computed
        self._node_sum: dict[str, _Summary] = {}
        for n in nodes:
            self.update(n)

    def __len__(self) -> int:
        return len(self._views)

    def _rank(self, view: NodeView) -> tuple:
        s = view.usage_score
        return (-s if self.policy == "binpack" else s, self._seq[view.name])

    def update(self, view: NodeView) -> None:
        """Add ``view``, or replace the view of the node of that name."""
        name = view.name
        if name in self._views:
            self._remove(name)
        else:
            self._seq[name] = len(self._seq)
        key = self._rank(view)
        self._views[name] = view
        self._key[name] = key
        ns = self._node_sum[name] = summary(view)
        entry = (key, name)
        if not self._blocks:
            self._blocks.append([entry])
            self._firsts.append(key)
            self._sums.append(ns)
            self._dirty.append(False)
            return
        b = max(0, bisect_right(self._firsts, key) - 1)
        block = self._blocks[b]
        insort(block, entry)
        self._firsts[b] = block[0][0]
        self._sums[b] = _merge((self._sums[b], ns))  # a summary only grows by an insert: O(1)
        if len(block) > 2 * BLOCK:
            half = len(block) // 2
            self._blocks[b:b + 1] = [block[:half], block[half:]]
            self._firsts[b:b + 1] = [block[0][0], block[half][0]]
            self._sums[b:b + 1] = [self._block_sum(block[:half]), self._block_sum(block[half:])]
            self._dirty[b:b + 1] = [False, False]

    def remove(self, name: str) -> None:
        if name in self._views:
            self._remove(name)
            del self._views[name], self._key[name], self._node_sum[name]

    def _block_sum(self, block: list[tuple]) -> _Summary:
        return _merge(self._node_sum[n] for _, n in block)

    def _remove(self, name: str) -> None:
        key = self._key[name]
        b = bisect_right(self._firsts, key) - 1
        block = self._blocks[b]
        block.pop(bisect_left(block, (key, name)))
        if not block:
            del self._blocks[b], self._firsts[b], self._sums[b], self._dirty[b]
            return
        self._firsts[b] = block[0][0]
        # the block's summary may now be larger than its nodes': still a true bound (a skip stays
        # right), made exact again only when a walk would look inside the block
        self._dirty[b] = True

    def ordered(self) -> Iterator[NodeView]:
        """Every node in placement order."""
        for block in self._blocks:
            for _, name in block:
                yield self._views[name]

    def fits(self, request: Request) -> Iterator[Decision]:
        """Every node's decision for ``request``, in placement order, only nodes that can take it:
        the first is what :meth:`place` answers; a caller with filters of its own (kube-scheduler's,
        a quota) takes the first it accepts, which is ``place`` over the nodes it accepts. Do not
        update the index while iterating."""
        if (request.node_policy or self.policy) != self.policy:
            raise ValueError(f"request asks for node policy {request.node_policy!r}; this index ranks for "
                             f"{self.policy!r}: use one RankedNodes per policy")
        if not request.wants_gpu:
            return
        reqs = [c.gpu for c in request.containers if c.gpu is not None]
        views, sums = self._views, self._node_sum
        for b, block in enumerate(self._blocks):
            if not all(_may_take(r, self._sums[b]) for r in reqs):
                continue
            if self._dirty[b]:
                self._sums[b], self._dirty[b] = self._block_sum(block), False
                if not all(_may_take(r, self._sums[b]) for r in reqs):
                    continue
            for _, name in block:
                if not all(_may_take(r, sums[name]) for r in reqs):
                    continue
                got = fit_node(request, views[name])
                if isinstance(got, Decision):
                    yield got

    def place(self, request: Request) -> Decision | NoFit:
        """What ``engine.place(request, nodes in insertion order, self.policy)`` answers, without
        sorting the nodes or looking at a node its summary rules out."""
        if not request.wants_gpu:
            return NoFit({"*": ("the request asks for no GPU",)})
        for got in self.fits(request):
            return got
        reasons: dict[str, tuple[str, ...]] = {}
        for node in self.ordered():  # nothing fits: only now pay for every node's reasons
            why = fit_node(request, node, quick=False)
            reasons[node.name] = tuple(why) if isinstance(why, list) and why else ("no GPUs",)
        return NoFit(reasons)
