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
        self._by: OrderedDict[Hashable, tuple[int, dict[str, str | None]]] = OrderedDict()
        self._max = max_shapes
        self.computed = 0  # node verdicts computed by the engine (a node that did not change costs none)

    def _current(self, request: Request, snap: Snapshot) -> dict[str, str | None]:
        key = shape(request)
        hit = self._by.get(key)
        if hit is not None and hit[0] >= snap.gen:
            # up to date, or brought up to a newer snapshot by a call that overtook this one: the
            # newer view is as good an answer (every commit is re-checked by the node's ledger)
            self._by.move_to_end(key)
            return hit[1]
        changed = snap.log.since(hit[0]) if hit is not None else None
        if changed is None:
            table = {name: verdict(request, m) for name, m in snap.members.items()}
            self.computed += len(table)
        else:
            table = hit[1]
            for name in changed:
                m = snap.members.get(name)
                if m is None:
                    table.pop(name, None)
                else:
                    table[name] = verdict(request, m)
            self.computed += len(changed)
        self._by[key] = (snap.gen, table)
        self._by.move_to_end(key)
        while len(self._by) > self._max:
            self._by.popitem(last=False)
        return table

    def split(self, request: Request, snap: Snapshot, names: Iterable[str]) -> tuple[list[str], dict[str, str]]:
        """``names`` that can take ``request`` (in their order), and why each other cannot."""
        with self._lock:
            table = self._current(request, snap)
            get = table.get
            names = names if isinstance(names, list) else list(names)
            ok = [name for name in names if get(name, NO_DAEMON) is None]  # comprehensions: this is per node
            if len(ok) == len(names):
                return ok, {}
            return ok, {name: v for name in names if (v := get(name, NO_DAEMON)) is not None}
