"""The protocol's parameters and the formulas that scale them with group size.

Defaults follow hashicorp/memberlist's LAN profile
(``DefaultLANConfig``) except where noted in
``hamid/config/schema.py``, which documents each key with its reason. The
formulas are memberlist's as coded (``util.go``), not as its comments say.
This module does no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class GossipParams:
    probe_interval: float = 1.0
    probe_timeout: float = 0.5
    indirect_checks: int = 3
    suspicion_mult: float = 3.0
    suspicion_max_timeout_mult: float = 6.0
    suspicion_confirmations: int = 2
    retransmit_mult: int = 4
    gossip_interval: float = 0.2
    gossip_nodes: int = 3
    push_pull_interval: float = 30.0
    gossip_to_the_dead: float = 30.0
    connect_timeout: float = 5.0
    awareness_max: int = 8
    max_frame_bytes: int = 256 * 1024
    piggyback_bytes: int = 16 * 1024
    capacity_interval: float = 1.0
    reconnect_interval: float = 10.0
    dead_retention: float = 86400.0
    join_retry_max: float = 30.0
    max_members: int = 16384  # the member table's cap, this node included (gossipMaxMembers)
    # How long a pinned key must have been silent (its member dead or left) before a new self-signed key
    # may take its name (hamid.gossip.identity): far longer than a live node takes to refute a false death
    # (seconds: it hears of it by gossip, push/pull or the reconnect to the dead every 10 s), short enough
    # that a reinstalled node is back within minutes without anyone's help.
    identity_reset_after: float = 600.0

    @classmethod
    def from_config(cls, config) -> "GossipParams":
        """From the daemon's Config (the ``gossip*`` keys)."""
        m = {
            "probe_interval": "gossipProbeInterval", "probe_timeout": "gossipProbeTimeout",
            "indirect_checks": "gossipIndirectChecks", "suspicion_mult": "gossipSuspicionMult",
            "suspicion_max_timeout_mult": "gossipSuspicionMaxTimeoutMult",
            "suspicion_confirmations": "gossipSuspicionConfirmations",
            "retransmit_mult": "gossipRetransmitMult", "gossip_interval": "gossipInterval",
            "gossip_nodes": "gossipNodes", "push_pull_interval": "gossipPushPullInterval",
            "gossip_to_the_dead": "gossipToTheDeadTime", "connect_timeout": "gossipConnectTimeout",
            "awareness_max": "gossipAwarenessMaxMultiplier", "max_frame_bytes": "gossipMaxFrameBytes",
            "piggyback_bytes": "gossipPiggybackBytes", "capacity_interval": "gossipCapacityInterval",
            "reconnect_interval": "gossipReconnectInterval", "dead_retention": "gossipDeadRetention",
            "max_members": "gossipMaxMembers", "identity_reset_after": "gossipIdentityResetAfter",
        }
        return cls(**{k: getattr(config, v) for k, v in m.items()})

    def with_(self, **kw) -> "GossipParams":
        return replace(self, **kw)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    # --- formulas (memberlist util.go) -----------------------------------

    def suspicion_bounds(self, n: int) -> tuple[float, float]:
        """(min, max) suspicion timeout in seconds for a group of ``n``:
        min = mult * max(1, log10 n) * probe interval, max = maxmult * min."""
        node_scale = max(1.0, math.log10(max(1, n)))
        lo = self.suspicion_mult * node_scale * self.probe_interval
        return lo, lo * self.suspicion_max_timeout_mult

    def confirmations_needed(self, n: int) -> int:
        """Independent confirmations that shrink a suspicion to its minimum;
        0 when the group is too small to supply them (n - 2 < k)."""
        k = self.suspicion_confirmations
        return 0 if n - 2 < k else k

    def retransmit_limit(self, n: int) -> int:
        """How many times each update is piggybacked: mult * ceil(log10(n + 1))."""
        return self.retransmit_mult * max(1, math.ceil(math.log10(n + 1)))

    def push_pull_scaled(self, n: int) -> float:
        """Push/pull interval, stretched for groups above 32 so the full-state
        traffic stays flat: x (ceil(log2 n - 5) + 1)."""
        if n <= 32:
            return self.push_pull_interval
        return self.push_pull_interval * (math.ceil(math.log2(n) - 5) + 1)


def suspicion_timeout(lo: float, hi: float, confirmations: int, needed: int) -> float:
    """Lifeguard's shrinking timeout: from ``hi`` down to ``lo`` as
    ``hi - (hi - lo) * ln(c + 1) / ln(k + 1)``, floored at ``lo``."""
    if needed <= 0:
        return lo
    frac = math.log(confirmations + 1) / math.log(needed + 1)
    return max(lo, hi - (hi - lo) * frac)
