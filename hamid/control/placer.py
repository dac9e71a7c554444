"""Choosing a node and GPUs for a pod, from the cluster as the leader sees it.

The cluster view is every node's gossiped capacity document (what its ledger
has booked, as of its last publication) plus the placements this leader has
committed since, which gossip has not carried back yet: without them, pods
placed in a burst would all be proposed for the same free GPU and refused
one after another by the node's re-check. An overlay entry is dropped once
the node has published a document read after the commit, or after
``OVERLAY_MAX_S``; a stale view costs at most a refused commit and a retry,
never a double booking (the node's ledger re-checks every commit).

A node is a candidate only if kube-scheduler would also take the pod there
(:func:`hamid.control.nodefit.fit_node`: taints, affinity, resources...,
GPU resources left to hamid) and a hamid daemon publishes its GPUs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..placement import Decision, NodeView, place
from ..placement.engine import fit_node as fit_gpus
from ..placement.result import NoFit
from ..placement.usage import with_usage
from ..request.model import Request

OVERLAY_MAX_S = 10.0
READ_AFTER_MS = 250  # a document versioned this long after a commit was read after it


@dataclass(frozen=True)
class Member:
    view: NodeView
    peer: str | None  # the node's peer API address
    version: int  # its capacity document's version (wall-clock ms of publication)


@dataclass
class _Pending:
    decision: Decision
    at_ms: int


@dataclass
class ClusterView:
    """``read()`` gives each live node's capacity document (as gossiped: with
    ``version`` and ``peer``), ``to_view(doc)`` turns one into a NodeView;
    views are cached per (node, version). Call from the trio thread."""

    read: Callable[[], dict[str, dict]]
    to_view: Callable[[dict], NodeView]
    pending: dict[str, list[_Pending]] = field(default_factory=dict)
    _cache: dict[str, tuple[int, NodeView]] = field(default_factory=dict)

    def _base(self) -> dict[str, Member]:
        out = {}
        docs = self.read()
        for name, doc in docs.items():
            version = int(doc.get("version") or 0)
            hit = self._cache.get(name)
            if hit is None or hit[0] != version:
                hit = (version, self.to_view(doc))
                self._cache[name] = hit
            out[name] = Member(hit[1], doc.get("peer"), version)
        for gone in set(self._cache) - set(docs):
            del self._cache[gone]
        return out

    def committed(self, decision: Decision) -> None:
        self.pending.setdefault(decision.node, []).append(_Pending(decision, int(time.time() * 1000)))

    def forget(self, decision: Decision) -> None:
        """A commit that was released again (its pod update failed)."""
        self.pending[decision.node] = [p for p in self.pending.get(decision.node, ()) if p.decision != decision]

    def members(self) -> dict[str, Member]:
        now = int(time.time() * 1000)
        out = {}
        for name, m in self._base().items():
            keep = [p for p in self.pending.get(name, ())
                    if m.version < p.at_ms + READ_AFTER_MS and now - p.at_ms < OVERLAY_MAX_S * 1000]
            self.pending[name] = keep
            out[name] = m if not keep else Member(_with(m.view, [p.decision for p in keep]), m.peer, m.version)
        return out


def _with(view: NodeView, decisions: list[Decision]) -> NodeView:
    fresh = [g.with_use(0, 0, 0, False, ()) for g in view.gpus]
    added = {g.uuid: g for g in with_usage(view.name, fresh, decisions).gpus}
    gpus = tuple(g.with_use(g.mem_used + a.mem_used, g.cores_used + a.cores_used, g.slots_used + a.slots_used,
                            g.exclusive or a.exclusive, g.mig_used + a.mig_used,
                            g.mps_used + a.mps_used)
                 for g in view.gpus for a in (added[g.uuid],))
    return NodeView(view.name, gpus, view.gpu_policy)


@dataclass
class Choice:
    decision: Decision | None
    peer: str | None
    reasons: dict[str, list[str]]  # node -> why not (kube-scheduler's and hamid's GPU reasons)


def choose(request: Request, pod: dict, members: dict[str, Member], nodes: dict[str, dict],
           pods_by_node: dict[str, list[dict]], *, node_policy: str, ignored: set[str],
           exclude: Iterable[str] = (), fit_node: Callable | None = None, quota=None) -> Choice:
    """The node and GPUs for ``pod``, or why not on each node. ``quota``: the pod's namespace GPU quota
    (:class:`hamid.control.quota.NamespaceQuota`), None where the namespace has none: a node whose
    decision would take the namespace past it is left out with the reason."""
    if fit_node is None:
        from .nodefit import fit_node as fit_node
    reasons: dict[str, list[str]] = {}
    views = []
    skip = set(exclude)
    for name, node in nodes.items():
        if name in skip:
            reasons[name] = ["placement refused moments ago by the node's ledger"]
            continue
        k8s = fit_node(pod, node, pods_by_node.get(name, []), ignored_resources=ignored)
        if k8s:
            reasons[name] = list(k8s)
            continue
        m = members.get(name)
        if m is None:
            reasons[name] = ["no hamid daemon publishes this node's GPUs"]
            continue
        if not m.peer:
            reasons[name] = ["the node's hamid daemon has no peer API address"]
            continue
        views.append(m.view)
    if quota is not None:
        keep = []
        for view in views:
            d = fit_gpus(request, view)
            why = quota.check(d) if isinstance(d, Decision) else None
            if why is not None:
                reasons[view.name] = [why]
            else:
                keep.append(view)
        views = keep
    if not views:
        return Choice(None, None, reasons)
    got = place(request, views, node_policy)
    if isinstance(got, NoFit):
        for name, why in got.reasons.items():
            reasons[name] = list(why)
        return Choice(None, None, reasons)
    return Choice(got, members[got.node].peer, reasons)
