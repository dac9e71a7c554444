"""The peer API: a node answers ``commit``, ``commit_many``, ``release`` and ``status`` from its peers.

The elected leader commits a placement it chose on the chosen node; that node
re-checks it against its own ledger in one transaction and answers yes, or no
with the ledger's reasons. Requests and answers are sealed with the gossip
keyring, so both ends prove they hold a key (mutual authentication), and a
request is accepted once only (timestamp window plus a cache of seen ids).

Modules: ``address`` (HOST:PORT), ``frames`` (the sealed wire format),
``replay`` (freshness and the seen-id cache), ``server`` (:class:`PeerFace`),
``client`` (:class:`PeerClient`), ``stats`` (its Prometheus counters).
"""

from .client import PeerClient
from .errors import (PeerError, PeerProtocolError, PeerRefused, PeerUnauthenticated, PeerUnknownMethod,
                     PeerUnreachable)
from .server import PeerFace

__all__ = ["PeerClient", "PeerFace", "PeerError", "PeerProtocolError", "PeerRefused",
           "PeerUnauthenticated", "PeerUnknownMethod", "PeerUnreachable"]
