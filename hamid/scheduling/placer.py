"""Choosing a node and GPUs for a pod, from the cluster as the leader sees it.

The cluster view is every node's gossiped capacity document (what its ledger
has booked, as of its last publication) plus the placements this leader has
committed since, which gossip has not carried back yet: without them, pods
placed in a burst would all be proposed for the same free GPU and refused
one after another by the node's re-check. An overlay entry is dropped once
the node has published a document read after it answered the commit (never
while the commit is in flight), or after ``OVERLAY_MAX_S``; a stale view costs at most a refused commit and a retry,
never a double booking (the node's ledger re-checks every commit).

A node is a candidate only if kube-scheduler would also take the pod there
(:func:`hamid.scheduling.kubefit.kube_filters`: taints, affinity, resources...,
GPU resources left to hamid) and a hamid daemon publishes its GPUs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from ..cluster.changes import ChangeLog, LogView
from ..placement import Decision, NodeView, place
from ..placement.engine import fit_node as fit_gpus
from ..placement.result import NoFit
from ..placement.usage import with_usage
from ..request.model import Request
from .gcfreeze import Freezer

OVERLAY_MAX_S = 10.0
READ_AFTER_MS = 250  # a document versioned this long after a commit was read after it


@dataclass(frozen=True)
class _Pending:
    decision: Decision
    at_ms: int  # when it was booked here (its age: OVERLAY_MAX_S)
    applied_ms: int | None = None  # when the node answered that it applied it; None: in flight


@dataclass(frozen=True)
class Member:
    view: NodeView
    peer: str | None  # the node's peer API address
    version: int  # its capacity document's version (wall-clock ms of publication)
    overlay: tuple[_Pending, ...] = ()  # this leader's commits gossip has not carried back yet (in ``view``)


class DocSource(Protocol):
    """Where the live capacity documents come from (the gossip membership)."""

    def live_docs(self) -> dict[str, dict]: ...

    def live_doc(self, name: str) -> dict | None: ...

    def live_changes(self, cursor: int | None) -> tuple[int, set[str] | None]: ...


class _FullRead:
    """A DocSource over a plain function: no journal, so every reader re-reads everything."""

    def __init__(self, read: Callable[[], dict[str, dict]]) -> None:
        self._read = read

    def live_docs(self) -> dict[str, dict]:
        return self._read()

    def live_doc(self, name: str) -> dict | None:
        return self._read().get(name)

    def live_changes(self, cursor: int | None) -> tuple[int, set[str] | None]:
        return 0, None


@dataclass(frozen=True)
class Snapshot:
    """The cluster view at one moment: never changed once published, so a worker thread may read it."""

    gen: int  # grows with every change of a member; ``log`` says which members changed at which gen
    members: Mapping[str, Member]
    log: LogView


class ClusterView:
    """The leader's view of every live node, kept up to date incrementally.

    ``source`` gives each live node's capacity document (as gossiped: with
    ``version`` and ``peer``) and which ones changed since a cursor;
    ``to_view(doc)`` turns one into a NodeView. Only nodes whose document or
    overlay changed since the last call are looked at again, so a call costs
    O(changes), not O(nodes); views are cached per (node, version). Each
    change publishes a new :class:`Snapshot` (copy on write of the member
    map: one C-level dict copy per batch of changes, none while nothing
    changed) and journals the changed names, from which readers (the
    extender's filter cache) update their own state. Call from the trio thread.
    """

    def __init__(self, source: DocSource | None = None, to_view: Callable[[dict], NodeView] | None = None, *,
                 read: Callable[[], dict[str, dict]] | None = None, freeze_gc: bool = False) -> None:
        """``read``, instead of ``source``: a plain function giving every live document (tests, tools):
        it has no journal, so every call reads everything (correct, O(nodes)). ``freeze_gc``: move the
        views out of the garbage collector's sight as they pile up (:mod:`.gcfreeze`; the daemon's
        leader sets it: it is process-wide)."""
        if (source is None) == (read is None) or to_view is None:
            raise TypeError("ClusterView needs to_view and one of source (a journaled DocSource) or read")
        self.source = source if source is not None else _FullRead(read)
        self.to_view = to_view
        self.pending: dict[str, list[_Pending]] = {}
        self._views: dict[str, tuple[int, NodeView]] = {}  # base view per node, for its document's version
        self._members: dict[str, Member] = {}
        self._cursor: int | None = None  # the source's; None: read every document next time
        self._dirty: set[str] = set()  # overlays changed by committed/forget since the last refresh
        self._log = ChangeLog()
        self._snap = Snapshot(0, MappingProxyType({}), self._log.frozen())
        self.rebuilt = 0  # views built from documents (a node whose document did not change costs none)
        self._freezer = Freezer() if freeze_gc else None

    def committed(self, decision: Decision) -> None:
        self.pending.setdefault(decision.node, []).append(_Pending(decision, int(time.time() * 1000)))
        self._dirty.add(decision.node)

    def applied(self, decision: Decision) -> None:
        """The node answered that its ledger holds ``decision``: its overlay entry stays until the
        node publishes a document read after that answer (a document read while the commit was
        still queued or in flight, which a starved node or a batch behind another may take longer
        than ``READ_AFTER_MS`` to apply, must not drop it)."""
        now = int(time.time() * 1000)
        pend = self.pending.get(decision.node)
        if not pend:
            return
        for i, p in enumerate(pend):
            if p.decision == decision and p.applied_ms is None:
                pend[i] = _Pending(p.decision, p.at_ms, now)
                self._dirty.add(decision.node)
                return

    def forget(self, decision: Decision) -> None:
        """A commit that was released again (its pod update failed)."""
        self.pending[decision.node] = [p for p in self.pending.get(decision.node, ()) if p.decision != decision]
        self._dirty.add(decision.node)

    def members(self) -> Mapping[str, Member]:
        return self.snapshot().members

    def snapshot(self) -> Snapshot:
        now = int(time.time() * 1000)
        cursor, names = self.source.live_changes(self._cursor)
        if names is None:  # first call, or too far behind: every document, and every member we hold
            docs = self.source.live_docs()
            names, doc_of = set(docs) | set(self._members), docs.get
        else:
            doc_of = self.source.live_doc
        self._cursor = cursor
        if self._dirty:
            names |= self._dirty
            self._dirty = set()
        for name, pend in self.pending.items():  # overlays that time out (few: commits in flight)
            if any(now - p.at_ms >= OVERLAY_MAX_S * 1000 for p in pend):
                names.add(name)
        if not names:
            return self._snap
        built = self.rebuilt
        new: dict[str, Member] | None = None
        for name in names:
            old = self._members.get(name)
            m = self._member(name, doc_of(name), now, old)
            if m is old:
                continue
            if new is None:
                new = dict(self._members)
            if m is None:
                del new[name]
            else:
                new[name] = m
            self._log.mark(name)
        if new is not None:
            self._members = new
            self._snap = Snapshot(self._log.cursor, MappingProxyType(new), self._log.frozen())
        if self._freezer is not None and self.rebuilt > built:
            self._freezer.built(self.rebuilt - built, len(self._members))
        return self._snap

    def _member(self, name: str, doc: dict | None, now: int, old: Member | None) -> Member | None:
        if doc is None:
            self._views.pop(name, None)
            return None
        version = int(doc.get("version") or 0)
        pend = self.pending.get(name)
        keep: tuple[_Pending, ...] = ()
        if pend is not None:
            keep = tuple(p for p in pend if now - p.at_ms < OVERLAY_MAX_S * 1000 and (
                p.applied_ms is None or version < p.applied_ms + READ_AFTER_MS))
            if keep:
                self.pending[name] = list(keep)
            else:
                del self.pending[name]
        peer = doc.get("peer")
        if old is not None and old.version == version and old.peer == peer and old.overlay == keep:
            return old
        hit = self._views.get(name)
        if hit is None or hit[0] != version:
            hit = (version, self.to_view(doc))
            self._views[name] = hit
            self.rebuilt += 1
        view = hit[1] if not keep else _with(hit[1], [p.decision for p in keep])
        return Member(view, peer, version, keep)


def _with(view: NodeView, decisions: list[Decision]) -> NodeView:
    fresh = [g.with_use(0, 0, 0, False, ()) for g in view.gpus]
    added = {g.uuid: g for g in with_usage(view.name, fresh, decisions).gpus}
    gpus = tuple(g.with_use(g.mem_used + a.mem_used, g.cores_used + a.cores_used, g.shares_used + a.shares_used,
                            g.exclusive or a.exclusive, g.mig_used + a.mig_used,
                            g.mps_used + a.mps_used)
                 for g in view.gpus for a in (added[g.uuid],))
    return NodeView(view.name, gpus, view.gpu_policy)


@dataclass
class Choice:
    decision: Decision | None
    peer: str | None
    reasons: dict[str, list[str]]  # node -> why not (kube-scheduler's and hamid's GPU reasons)


def choose(request: Request, pod: dict, members: Mapping[str, Member], nodes: dict[str, dict],
           pods_by_node: dict[str, list[dict]], *, node_policy: str, ignored: set[str],
           exclude: Mapping[str, str] | None = None, kube_filters: Callable | None = None,
           quota=None) -> Choice:
    """The node and GPUs for ``pod``, or why not on each node. ``exclude``: nodes that refused the
    pod's commit moments ago, each with what happened (the reason the pod shows). ``quota``: the
    pod's namespace GPU quota (:class:`hamid.scheduling.quota.NamespaceQuota`), None where the
    namespace has none: a node whose decision would take the namespace past it is left out with
    the reason."""
    if kube_filters is None:
        from .kubefit import kube_filters
    reasons: dict[str, list[str]] = {}
    views = []
    skip = exclude or {}
    for name, node in nodes.items():
        if name in skip:
            reasons[name] = [skip[name]]
            continue
        k8s = kube_filters(pod, node, pods_by_node.get(name, []), ignored_resources=ignored)
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
