"""The extender's per-node filter verdicts, per request shape, kept up to date from the cluster view's journal.

What it owns: for each recently filtered request shape (the pod's GPU
containers and GPU policy: every replica of a workload has the same), each
live node's verdict (None: the request fits there; else the message
kube-scheduler shows in ``FailedNodes``), as of a :class:`~.placer.Snapshot`.
A call whose shape is cached looks again only at the nodes the snapshot's
journal names as changed since, so kube-scheduler filtering replica after
replica against thousands of nodes costs O(changed nodes) in the engine plus
one pass over the names it sent. What it does not: the verdicts themselves
(:func:`hamid.placement.engine.feasible`) or the HTTP (``extender``).

Called from worker threads (the extender fits off the event loop): one lock
keeps the table and each call's reading of it consistent.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from itertools import filterfalse

from ..placement.engine import feasible
from ..request.model import Request
from .placer import Member, Snapshot

NO_DAEMON = "hamid: no hamid daemon publishes this node's GPUs"
# Shapes remembered. kube-scheduler works through the pending pods of a few
# workloads at a time, and each shape costs a dict of one entry per node
# (~0.5 MB at 5,000 nodes); a shape not remembered costs one full pass.
SHAPES_MAX = 16


def shape(request: Request) -> Hashable:
    """What a node's verdict depends on: the containers' GPU requests (names
    included: reasons name the container of a multi-container pod) and the GPU policy."""
    return request.containers, request.gpu_policy


def verdict(request: Request, m: Member) -> str | None:
    why = feasible(request, m.view)
    return None if not why else "hamid: " + "; ".join(why)


class Verdicts:
    def __init__(self, max_shapes: int = SHAPES_MAX) -> None:
        self._lock = threading.Lock()
        # shape -> (snapshot gen, node -> verdict, the nodes whose verdict is None)
        self._by: OrderedDict[Hashable, tuple[int, dict[str, str | None], set[str]]] = OrderedDict()
        self._max = max_shapes
        self.computed = 0  # node verdicts computed by the engine (a node that did not change costs none)

    def _current(self, request: Request, snap: Snapshot) -> tuple[dict[str, str | None], set[str]]:
        key = shape(request)
        hit = self._by.get(key)
        if hit is not None and hit[0] >= snap.gen:
            # up to date, or brought up to a newer snapshot by a call that overtook this one: the
            # newer view is as good an answer (every commit is re-checked by the node's ledger)
            self._by.move_to_end(key)
            return hit[1], hit[2]
        changed = snap.log.since(hit[0]) if hit is not None else None
        if changed is None:
            table = {name: verdict(request, m) for name, m in snap.members.items()}
            fits = {name for name, v in table.items() if v is None}
            self.computed += len(table)
        else:
            table, fits = hit[1], hit[2]
            for name in changed:
                m = snap.members.get(name)
                v = None if m is None else verdict(request, m)
                if m is None:
                    table.pop(name, None)
                else:
                    table[name] = v
                if m is not None and v is None:
                    fits.add(name)
                else:
                    fits.discard(name)
            self.computed += len(changed)
        self._by[key] = (snap.gen, table, fits)
        self._by.move_to_end(key)
        while len(self._by) > self._max:
            self._by.popitem(last=False)
        return table, fits

    def work(self, request: Request, snap: Snapshot) -> int:
        """How many node verdicts :meth:`split` would compute for ``request`` on ``snap`` now."""
        with self._lock:
            hit = self._by.get(shape(request))
            if hit is not None and hit[0] >= snap.gen:
                return 0
            changed = snap.log.since(hit[0]) if hit is not None else None
            return len(snap.members) if changed is None else len(changed)

    def split(self, request: Request, snap: Snapshot, names: Iterable[str]) -> tuple[list[str], dict[str, str]]:
        """``names`` that can take ``request`` (in their order), and why each other cannot."""
        with self._lock:
            table, fits = self._current(request, snap)
            names = names if isinstance(names, list) else list(names)
            # filter() with a set's C method: no Python step per node (this pass is per node, per call)
            ok = list(filter(fits.__contains__, names))
            if len(ok) == len(names):
                return ok, {}
            get = table.get
            return ok, {name: get(name) or NO_DAEMON for name in filterfalse(fits.__contains__, names)}
