"""Peer API counters (requests by method and result) and their Prometheus collector."""

from __future__ import annotations

from collections import Counter

from prometheus_client.core import CounterMetricFamily

# every result a request can end in, so each series exists from the start
RESULTS = ("ok", "refused", "unauthenticated", "bad-request", "stale", "replay", "wrong-node", "busy",
           "internal", "too-large")
METHODS = ("commit", "commit_many", "release", "status", "unknown")


class PeerStats:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str]] = Counter()

    def note(self, method: str, result: str) -> None:
        self.requests[(method if method in METHODS else "unknown", result)] += 1


class PeerCollector:
    """``hamid_peer_requests_total{method, result}`` as served by this node."""

    def __init__(self, stats: PeerStats) -> None:
        self._stats = stats

    def collect(self):
        c = CounterMetricFamily("hamid_peer_requests", "Peer API requests served, by method and result",
                                labels=["method", "result"])
        for m in METHODS:
            for r in RESULTS:
                c.add_metric([m, r], self._stats.requests[(m, r)])
        yield c
