"""Gossip face: membership and capacity exchange with peer daemons.

SWIM with Lifeguard's refinements (``membership``) over trio-websocket links
(``transport``) carrying CBOR frames (``codec``) sealed with AES-GCM from a
keyring (``keyring``); each node's capacity document (``capacity``) spreads
to every member. ``service`` wires them into the daemon's nursery;
``params`` holds every protocol parameter and its formulas; ``stats`` the
counters and their Prometheus collector.

Nothing here touches the ledger's file or the devices directly: the daemon
hands the service a function that returns the node's current view.
"""

from .params import GossipParams

__all__ = ["GossipParams"]
