"""The leader's nodes in placement order, kept in step with the cluster view, and a choice that walks them.

What it owns: per node policy a :class:`~hamid.placement.ranked.RankedNodes`
brought up to each :class:`~.placer.Snapshot` from the snapshot's journal
(only the members that changed since are re-ranked: a pass of gated pods
costs O(changed nodes), not a sort of every node per pod), and
:func:`choose_ranked`, which walks the nodes whose GPUs can take a request in
the engine's order and checks kube-scheduler's filters, the peer address and
the namespace quota only on those, taking the first that passes.

That is :func:`.placer.choose` (kube-scheduler's filters on every node, then
``place()`` over the nodes that pass) with the work turned around: the first
node of placement order that passes every filter is the same node either way,
since filtering a list does not change the order of what is left. Ties of
``usage_score`` are broken by the API server's node order as it stood when the
index was built (as the engine's stable sort over that order did), and nodes
that join later rank after those it held then. When nothing
passes, :func:`choose_ranked` answers None and the caller asks
:func:`.placer.choose` for every node's reasons (the slow path, taken only for
a pod that stays gated).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..placement.ranked import RankedNodes
from ..request.model import Request
from .placer import Choice, Snapshot


class RankedView:
    """One :class:`RankedNodes` per node policy, each as of the last snapshot it was brought to."""

    def __init__(self) -> None:
        self._by: dict[str, tuple[RankedNodes, int]] = {}
        self.reranked = 0  # member views (re)inserted (tests: a pass over unchanged nodes costs none)

    def ranked(self, snap: Snapshot, policy: str, order: Iterable[str] = ()) -> RankedNodes:
        """The nodes of ``snap`` ranked for ``policy``. ``order``: the node names in the order ties
        go when the index is built (the API server's node order, as the one-by-one choice sorted
        them); members not named follow, and nodes that join later go after those."""
        hit = self._by.get(policy)
        if hit is not None:
            ranked, gen = hit
            if gen == snap.gen:
                return ranked
            changed = snap.log.since(gen)
            if changed is not None:
                for name in changed:
                    m = snap.members.get(name)
                    if m is None:
                        ranked.remove(name)
                    else:
                        ranked.update(m.view)
                        self.reranked += 1
                self._by[policy] = (ranked, snap.gen)
                return ranked
        members = snap.members
        first = [n for n in order if n in members]
        named = set(first)
        ranked = RankedNodes([members[n].view for n in first] + [m.view for n, m in members.items() if n not in named],
                             policy)
        self.reranked += len(ranked)
        self._by[policy] = (ranked, snap.gen)
        return ranked


def choose_ranked(request: Request, pod: dict, snap: Snapshot, ranked: RankedView, nodes: Mapping[str, dict],
                  load_of: Callable[[str, dict], Any], *, node_policy: str, ignored: set[str],
                  exclude: Iterable[str] = (), kube_filters: Callable | None = None, quota=None) -> Choice | None:
    """The first node in placement order whose GPUs take ``request`` and that kube-scheduler, the
    node's peer address and ``quota`` accept; None when there is none (then :func:`.placer.choose`
    says why, node by node). ``load_of(node, pod)``: the pods on ``node`` as
    :func:`~.kubefit.kube_filters` takes them (a list, or their :class:`~.kubefit.NodeLoad`)."""
    if kube_filters is None:
        from .kubefit import kube_filters as default_filters
        kube_filters = default_filters
    skip = set(exclude)
    for d in ranked.ranked(snap, request.node_policy or node_policy, nodes).fits(request):
        name = d.node
        node = nodes.get(name)
        m = snap.members.get(name)
        if name in skip or node is None or m is None or not m.peer:
            continue
        if kube_filters(pod, node, load_of(name, pod), ignored_resources=ignored):
            continue
        if quota is not None and quota.check(d) is not None:
            continue
        return Choice(d, m.peer, {})
    return None
