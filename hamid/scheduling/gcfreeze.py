"""When the leader moves its long-lived objects out of the cyclic garbage collector's sight.

What it owns: calling :func:`gc.freeze` after the cluster view has built many
node views, so that generation-2 collections stop walking them. At 5,000
nodes the gossiped documents and the views are millions of objects that live
for minutes; CPython's full collection walks every one (measured: 100-360 ms
pauses on the trio thread, which made the extender's p99). Frozen objects are
still freed by reference counting when they are dropped (views and documents
hold no cycles), so memory is not held by the freeze itself.

The one cost: a garbage *cycle* that is in the tracked generations when they
are frozen is never collected. Each freeze therefore first collects the young
generations (cheap: they are small by design), and every ``FULL_EVERY_S`` the
frozen objects are given back to the collector for one full collection and
frozen again: one full pause per hour instead of one every few hundred calls.
"""

from __future__ import annotations

import gc
import time

# Freeze once this many views were built since the last freeze, and at least a
# tenth of the cluster: often enough that the unfrozen remainder stays small
# (generation-2 pauses scale with it), rarely enough that the young-generation
# collection each freeze makes is noise.
MIN_BUILT = 500
FULL_EVERY_S = 3600.0  # reclaim any cycle frozen by mistake: one full collection per hour


class Freezer:
    def __init__(self, min_built: int = MIN_BUILT, full_every_s: float = FULL_EVERY_S) -> None:
        self.min_built = min_built
        self.full_every_s = full_every_s
        self._built = 0
        self._full_at = time.monotonic()
        self.freezes = 0

    def built(self, views: int, members: int) -> None:
        """``views`` node views were just built; ``members``: the cluster's size."""
        self._built += views
        if self._built < max(self.min_built, members // 10):
            return
        self._built = 0
        now = time.monotonic()
        if now - self._full_at >= self.full_every_s:
            self._full_at = now
            gc.unfreeze()
            gc.collect()
        else:
            gc.collect(1)
        gc.freeze()
        self.freezes += 1
