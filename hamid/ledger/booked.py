"""The node's booked state kept as running sums, so a commit costs the same on a full node as on an empty one.

:class:`Booked` holds, for one snapshot of the ledger, each reservation's
use of each GPU (:func:`hamid.placement.usage.parts`), their sum
(:class:`hamid.placement.usage.Tally`).
Adding, replacing or removing one reservation costs that reservation's size;
the node's view, with or without one owner, costs the number of GPUs. The
ledger decides when a snapshot is still valid (:mod:`hamid.ledger.store`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..placement import Decision, NodeView
from ..placement.usage import Part, Tally, parts
from ..placement.view import GpuView


class Booked:
    def __init__(self, node: str, capacity: Sequence[GpuView], gpu_policy: str) -> None:
        self.node = node
        self.gpu_policy = gpu_policy
        self.tally = Tally(capacity)
        self._parts: dict[str, dict[str, Part]] = {}

    def __len__(self) -> int:
        return len(self._parts)

    def put(self, owner: str, decision: Decision) -> None:
        self.remove(owner)
        got = parts(decision, self.tally.caps)
        self.tally.add(got)
        self._parts[owner] = got

    def remove(self, owner: str) -> None:
        got = self._parts.pop(owner, None)
        if got is None:
            return
        self.tally.add(got, -1)

    def view(self, without: str | None = None) -> NodeView:
        return self.tally.view(self.node, self.gpu_policy, self._parts.get(without) if without else None)
