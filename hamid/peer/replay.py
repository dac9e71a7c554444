"""Freshness of peer requests: a timestamp window and a bounded cache of seen ids.

A request is accepted when its timestamp lies within ``window`` seconds of
this node's clock, is not older than this guard (so requests recorded before
a restart, when the cache was empty, are refused too), and its id was not
seen before. An id is remembered until its timestamp leaves the window (from
then on the window alone refuses it), so the cache holds at most the ids of
one window. When it is full of ids still inside the window, new requests are
refused as busy rather than forgetting an id early (which would let that
request be replayed). This module does no I/O.
"""

from __future__ import annotations

import heapq
import time

from .frames import BUSY, REPLAY, STALE


class Refused(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class ReplayGuard:
    def __init__(self, window_s: float, max_ids: int, *, now: float | None = None) -> None:
        if window_s <= 0 or max_ids < 1:
            raise ValueError("window_s must be > 0 and max_ids >= 1")
        self.window_s = window_s
        self.max_ids = max_ids
        self.since = time.time() if now is None else now
        self._seen: set[bytes] = set()
        self._expiry: list[tuple[float, bytes]] = []  # heap of (timestamp, id)

    def __len__(self) -> int:
        return len(self._seen)

    def _forget_expired(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] < now - self.window_s:
            _, rid = heapq.heappop(self._expiry)
            self._seen.discard(rid)

    def admit(self, rid: bytes, ts: float, now: float | None = None) -> None:
        """Record ``rid`` or raise :class:`Refused` (kind ``stale``, ``replay`` or ``busy``)."""
        now = time.time() if now is None else now
        if abs(now - ts) > self.window_s:
            raise Refused(STALE, f"request timestamp is {now - ts:+.1f} s from this node's clock; "
                                 f"accepted: within {self.window_s:g} s (check the nodes' clocks)")
        if ts < self.since:
            raise Refused(STALE, f"request stamped {self.since - ts:.1f} s before this node's peer API "
                                 "started; send it again")
        self._forget_expired(now)
        if rid in self._seen:
            raise Refused(REPLAY, "request id already seen: a replayed request")
        if len(self._seen) >= self.max_ids:
            raise Refused(BUSY, f"{len(self._seen)} requests within the last {self.window_s:g} s, "
                                f"the replay cache's limit (peerReplayCacheSize); retry shortly")
        self._seen.add(rid)
        heapq.heappush(self._expiry, (ts, rid))
