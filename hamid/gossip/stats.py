"""Gossip counters and their Prometheus collector.

Counters are plain integers on a :class:`Stats` object (cheap to bump on the
hot path, one object per gossip instance so many instances can share a
process in the benchmark); :class:`GossipCollector` turns them into
``hamid_gossip_*`` metrics at scrape time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class Stats:
    def __init__(self) -> None:
        self.probes: Counter[str] = Counter()  # ok, indirect, failed, late (not judged: this node ran late)
        self.suspicions = 0
        self.refutations = 0
        self.deaths = 0
        self.bytes_sent = 0
        self.bytes_received = 0
        self.frames_sent = 0
        self.frames_received = 0
        # size, key, decode, version, schema, queue, fault, idle; relay: no front (frontDir) to hand it to or from
        self.dropped: Counter[str] = Counter()
        self.push_pulls = 0
        # updates and documents not taken, by reason (hamid.gossip.membership's "Identity"): unsigned,
        # signature, identity, identity-self, unsigned-left, doc-unknown, doc-identity, ahead, not-a-node, cap
        self.refused: Counter[str] = Counter()


class GossipCollector:
    """Reads ``stats`` and ``members_by_state()`` on each scrape."""

    def __init__(self, stats: Stats, members_by_state: Callable[[], dict[str, int]],
                 health: Callable[[], int]) -> None:
        self._stats = stats
        self._members = members_by_state
        self._health = health

    def collect(self):
        s = self._stats
        m = GaugeMetricFamily("hamid_gossip_members", "Gossip members by state (this node included)",
                              labels=["state"])
        for state, n in sorted(self._members().items()):
            m.add_metric([state], n)
        yield m
        p = CounterMetricFamily("hamid_gossip_probes", "Probes by outcome", labels=["result"])
        for r in ("ok", "indirect", "failed", "late"):
            p.add_metric([r], s.probes[r])
        yield p
        yield CounterMetricFamily("hamid_gossip_suspicions", "Members this node began to suspect",
                                  value=s.suspicions)
        yield CounterMetricFamily("hamid_gossip_refutations", "Suspicions of this node it refuted",
                                  value=s.refutations)
        yield CounterMetricFamily("hamid_gossip_deaths", "Members declared dead by this node", value=s.deaths)
        yield CounterMetricFamily("hamid_gossip_sent_bytes", "Frame bytes sent", value=s.bytes_sent)
        yield CounterMetricFamily("hamid_gossip_received_bytes", "Frame bytes received", value=s.bytes_received)
        yield CounterMetricFamily("hamid_gossip_push_pulls", "Full-state exchanges", value=s.push_pulls)
        d = CounterMetricFamily("hamid_gossip_dropped_frames", "Frames dropped, by reason", labels=["reason"])
        for r in ("size", "key", "decode", "version", "schema", "queue", "fault", "relay"):
            d.add_metric([r], s.dropped[r])
        yield d
        r = CounterMetricFamily("hamid_gossip_refused_updates",
                                "Membership updates and capacity documents not taken, by reason (cap: the member "
                                "table is full, gossipMaxMembers; not-a-node: no Node object of that name; "
                                "identity, signature, unsigned, unsigned-left, doc-*: not signed by the key "
                                "the name is pinned to; ahead: an incarnation or version from the future)",
                                labels=["reason"])
        for reason in sorted(s.refused):
            r.add_metric([reason], s.refused[reason])
        yield r
        yield GaugeMetricFamily("hamid_gossip_health_score",
                                "Lifeguard local health (0 = healthy; probe interval is x (score + 1))",
                                value=self._health())
