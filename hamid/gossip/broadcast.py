"""The queue of updates waiting to be piggybacked, with bounded retransmits.

Each update has a key (the member it is about, and its kind); a newer update
with the same key replaces the queued one (memberlist's invalidation). Each
frame takes the least-sent updates first, up to a byte budget, and an update
is retired after ``limit`` transmissions (``GossipParams.retransmit_limit``).
``on_add`` (if given) is called after every add, so the gossip loop can sleep
while the queue is empty. No I/O here.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import cbor2


class Broadcasts:
    def __init__(self, on_add: Callable[[], None] | None = None) -> None:
        self._items: dict[tuple[str, str], list] = {}  # key -> [transmits, -order, msg, size]
        self._order = itertools.count()
        self._on_add = on_add

    def __len__(self) -> int:
        return len(self._items)

    def add(self, key: tuple[str, str], msg: dict) -> None:
        self._items[key] = [0, -next(self._order), msg, len(cbor2.dumps(msg)) + 1]
        if self._on_add is not None:
            self._on_add()

    def drop(self, key: tuple[str, str]) -> None:
        self._items.pop(key, None)

    def take(self, limit: int, budget: int) -> list[dict]:
        if not self._items:
            return []
        out = []
        used = 0
        for key, item in sorted(self._items.items(), key=lambda kv: (kv[1][0], kv[1][1])):
            if used + item[3] > budget:
                continue
            used += item[3]
            out.append(item[2])
            item[0] += 1
            if item[0] >= limit:
                del self._items[key]
        return out
