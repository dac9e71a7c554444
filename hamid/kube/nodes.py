"""Which names are Node objects: the gossip membership's admission rule under Kubernetes.

What it owns: one informer of the cluster's Nodes (list and watch, names
only read) and the predicate :meth:`NodeNames.is_node` that gossip asks
before a name becomes a member. Under Kubernetes every daemon runs on a
Node, so a member whose name is no Node is made up (a holder of the gossip
key adding fake nodes with fake GPUs for the leader to place pods on).
Until the first list has arrived no name is a Node: gossip refuses members
for those seconds, and its join loop asks again.
"""

from __future__ import annotations

import trio

from .informer import Informer


class NodeNames:
    name = "gossip-nodes"  # as a face of the daemon's (supervised, restarted when its watch fails)

    def __init__(self, api) -> None:
        self.informer = Informer(api, "/api/v1/nodes", name="gossip-nodes")

    def is_node(self, name: str) -> bool:
        return self.informer.synced.is_set() and self.informer.get(f"/{name}") is not None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await self.informer.run(task_status=task_status)
