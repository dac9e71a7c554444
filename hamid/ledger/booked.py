"""The node's booked state kept as running sums, so a commit costs the same on a full node as on an empty one.

:class:`Booked` holds, for one snapshot of the ledger, each reservation's
use of each GPU (:func:`hamid.placement.usage.parts`), their sum
(:class:`hamid.placement.usage.Tally`) and the time slots taken on each GPU.
Adding, replacing or removing one reservation costs that reservation's size;
the node's view, with or without one owner, costs the number of GPUs. The
ledger decides when a snapshot is still valid (:mod:`hamid.ledger.store`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..placement import Decision, NodeView
from ..placement.usage import Part, Tally, parts
from ..placement.view import GpuView

Span = tuple[int, int]


class Booked:
    def __init__(self, node: str, capacity: Sequence[GpuView], gpu_policy: str) -> None:
        self.node = node
        self.gpu_policy = gpu_policy
        self.tally = Tally(capacity)
        self._parts: dict[str, dict[str, Part]] = {}
        self._slots: dict[str, dict] = {}
        self.taken: dict[str, list[Span]] = {}  # GPU uuid -> time slots every reservation holds there

    def __len__(self) -> int:
        return len(self._parts)

    @staticmethod
    def _spans(slots: dict) -> Iterable[tuple[str, Span]]:
        for per_gpu in slots.values():
            for uuid, spans in per_gpu.items():
                for a, b in spans:
                    yield uuid, (int(a), int(b))

    def put(self, owner: str, decision: Decision, slots: dict) -> None:
        self.remove(owner)
        got = parts(decision, self.tally.caps)
        self.tally.add(got)
        self._parts[owner] = got
        self._slots[owner] = slots
        for uuid, span in self._spans(slots):
            self.taken.setdefault(uuid, []).append(span)

    def remove(self, owner: str) -> None:
        got = self._parts.pop(owner, None)
        if got is None:
            return
        self.tally.add(got, -1)
        for uuid, span in self._spans(self._slots.pop(owner)):
            self.taken[uuid].remove(span)

    def view(self, without: str | None = None) -> NodeView:
        return self.tally.view(self.node, self.gpu_policy, self._parts.get(without) if without else None)

    def taken_without(self, owner: str) -> dict[str, list[Span]]:
        mine = list(self._spans(self._slots.get(owner) or {}))
        if not mine:
            return self.taken
        out = {uuid: list(spans) for uuid, spans in self.taken.items()}
        for uuid, span in mine:
            out[uuid].remove(span)
        return out
