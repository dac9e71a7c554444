"""The extender's per-node filter verdicts, per request shape, kept up to date from the cluster view's journal.

What it owns: for each recently filtered request shape (the pod's GPU
containers and GPU policy: every replica of a workload has the same), each
live node's verdict (None: the request fits there; else the message
kube-scheduler shows in ``FailedNodes``), as of a :class:`~.placer.Snapshot`.
A call whose shape is cached looks again only at the nodes the snapshot's
journal names as changed since, so kube-scheduler filtering replica after
replica against thousands of nodes costs O(changed nodes) in the engine plus
one pass over the names it sent. With a namespace quota, what each fitting
node's decision would give the pod is kept the same way (decided once per
node until it changes), and the quota, which changes with every placement in
the namespace, is asked afresh on every call, once per distinct amount. What
it does not: the verdicts themselves (:func:`hamid.placement.engine.feasible`)
or the HTTP (``extender``).

Called from the event loop (a call that needs a few verdicts) or a worker
thread (more): one lock keeps the table and each call's reading of it consistent.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from itertools import filterfalse

from ..placement import Decision
from ..placement.engine import feasible, fit_node
from ..request.model import Request
from .placer import Member, Snapshot
from .quota import Usage, decision_usage

NO_DAEMON = "hamid: no hamid daemon publishes this node's GPUs"
# Shapes remembered. kube-scheduler works through the pending pods of a few
# workloads at a time, and each shape costs a dict and a set of one entry per
# node (~1 MB at 5,000 nodes); a shape not remembered costs one full pass.
SHAPES_MAX = 16


def shape(request: Request) -> Hashable:
    """What a node's verdict depends on: the containers' GPU requests (names
    included: reasons name the container of a multi-container pod) and the GPU policy."""
    return request.containers, request.gpu_policy


def verdict(request: Request, m: Member) -> str | None:
    why = feasible(request, m.view)
    return None if not why else "hamid: " + "; ".join(why)


class _Shape:
    """One request shape's verdicts as of snapshot ``gen``."""

    __slots__ = ("gen", "table", "fits", "usage")

    def __init__(self, gen: int, table: dict[str, str | None], fits: set[str]) -> None:
        self.gen = gen
        self.table = table  # node -> verdict
        self.fits = fits  # the nodes whose verdict is None
        self.usage: dict[str, Usage] = {}  # node -> what its decision gives the pod (quotas), filled on demand


class Verdicts:
    def __init__(self, max_shapes: int = SHAPES_MAX) -> None:
        self._lock = threading.Lock()
        self._by: OrderedDict[Hashable, _Shape] = OrderedDict()
        self._max = max_shapes
        self.computed = 0  # node verdicts computed by the engine (a node that did not change costs none)
        self.decided = 0  # node decisions computed for quotas (likewise)

    def _current(self, request: Request, snap: Snapshot) -> _Shape:
        key = shape(request)
        hit = self._by.get(key)
        if hit is not None and hit.gen >= snap.gen:
            # up to date, or brought up to a newer snapshot by a call that overtook this one: the
            # newer view is as good an answer (every commit is re-checked by the node's ledger)
            self._by.move_to_end(key)
            return hit
        changed = snap.log.since(hit.gen) if hit is not None else None
        if hit is None or changed is None:
            table = {name: verdict(request, m) for name, m in snap.members.items()}
            hit = _Shape(snap.gen, table, {name for name, v in table.items() if v is None})
            self.computed += len(table)
        else:
            table, fits, usage = hit.table, hit.fits, hit.usage
            for name in changed:
                m = snap.members.get(name)
                usage.pop(name, None)
                if m is None:
                    table.pop(name, None)
                    fits.discard(name)
                    continue
                v = table[name] = verdict(request, m)
                if v is None:
                    fits.add(name)
                else:
                    fits.discard(name)
            hit.gen = snap.gen
            self.computed += len(changed)
        self._by[key] = hit
        self._by.move_to_end(key)
        while len(self._by) > self._max:
            self._by.popitem(last=False)
        return hit

    def work(self, request: Request, snap: Snapshot, usage: bool = False) -> int:
        """How many node verdicts (and, with ``usage``, decisions for a quota) :meth:`split` and
        :meth:`within` would compute for ``request`` on ``snap`` now."""
        with self._lock:
            hit = self._by.get(shape(request))
            if hit is None:
                return len(snap.members) * (2 if usage else 1)
            changed = snap.log.since(hit.gen) if hit.gen < snap.gen else set()
            n = len(snap.members) if changed is None else len(changed)
            if usage:
                n += len(hit.fits) - len(hit.usage) + (len(changed) if changed is not None else len(snap.members))
            return n

    def split(self, request: Request, snap: Snapshot, names: Iterable[str]) -> tuple[list[str], dict[str, str]]:
        """``names`` that can take ``request`` (in their order), and why each other cannot."""
        with self._lock:
            hit = self._current(request, snap)
            table, fits = hit.table, hit.fits
            names = names if isinstance(names, list) else list(names)
            # filter() with a set's C method: no Python step per node (this pass is per node, per call)
            ok = list(filter(fits.__contains__, names))
            if len(ok) == len(names):
                return ok, {}
            get = table.get
            return ok, {name: get(name) or NO_DAEMON for name in filterfalse(fits.__contains__, names)}

    def within(self, request: Request, snap: Snapshot, ok: list[str],
               check: Callable[[Usage], str | None]) -> tuple[list[str], dict[str, str]]:
        """Of ``ok`` (nodes that fit), those whose decision for ``request`` stays within a quota
        (``check``: None, or the reason), and why each other does not. What a node's decision gives
        the pod is kept per node like its verdict; ``check`` is asked once per distinct amount."""
        with self._lock:
            hit = self._current(request, snap)
            usage = hit.usage
            answers: dict[Usage, str | None] = {}
            keep: list[str] = []
            over: dict[str, str] = {}
            for name in ok:
                u = usage.get(name)
                if u is None:
                    d = fit_node(request, snap.members[name].view)
                    if not isinstance(d, Decision):  # fits by its verdict: cannot happen, said plainly if it does
                        over[name] = "hamid: " + "; ".join(d)
                        continue
                    u = usage[name] = decision_usage(d)
                    self.decided += 1
                if u not in answers:
                    answers[u] = check(u)
                why = answers[u]
                if why is None:
                    keep.append(name)
                else:
                    over[name] = "hamid: " + why
            return keep, over
