"""Committing a placement on its node, and taking it back: the one sequence gate and extender mode share.

:func:`commit` books the decision in the cluster view at once (unless the caller did) (other placements
choose around it), commits it on the chosen node's ledger through the peer API
with a fresh attempt id, and says whether the reservation the node now holds
is this call's: the node's ledger is idempotent per owner, so a pod that an
earlier call (another leader's, or a retried bind) already placed comes back
as that earlier reservation. :func:`undo` releases only a commit that was this
call's (the reason a failed Binding can never free a running pod's GPU), and
forgets it in the view. A commit the node refused is forgotten and raised.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from ..errors import HamidError
from ..logs import get_logger
from ..node.identity import Owner
from ..placement import Decision

log = get_logger("control")


@dataclass(frozen=True)
class Commit:
    owner: Owner
    decision: Decision  # what the node holds for the owner (this call's, or the earlier one)
    address: str  # the node's peer API
    ours: bool  # made by this call: only then may a failure undo it


async def commit(peer: Any, cluster: Any, address: str, owner: Owner, decision: Decision, *, request: dict,
                 placed_by: str, booked: bool = False, send: Any = None) -> Commit:
    """``booked``: the caller has already put ``decision`` in the view (``cluster.committed``: a
    pass that decides several pods before committing any). ``send``: what sends the commit, with
    ``peer.commit``'s signature (the gate leader's :class:`~.batches.NodeBatches`); ``peer.commit``
    when not given."""
    attempt = uuid.uuid4().hex
    if not booked:
        cluster.committed(decision)  # at once: other placements choose around it
    try:
        res = await (send or peer.commit)(address, owner, decision, request=request,
                                          details={"placed_by": placed_by, "attempt": attempt})
    except HamidError:
        cluster.forget(decision)
        raise
    if (res.get("details") or {}).get("attempt") == attempt:
        cluster.applied(decision)  # the overlay stays until the node publishes a document read after this
        return Commit(owner, decision, address, True)
    cluster.forget(decision)  # the node holds an earlier placement of this owner: not ours to open or undo
    return Commit(owner, Decision.from_dict(res["decision"]), address, False)


async def undo(peer: Any, cluster: Any, c: Commit) -> None:
    """Release ``c`` on its node if this call made it (else leave it: it is someone else's)."""
    if not c.ours:
        return
    try:
        await peer.release(c.address, c.owner.key, node=c.decision.node)
    except HamidError as e:  # the node's reconciler releases it once the pod is gone
        log.warning("could not release a placement after a failure", owner=c.owner.key, error=str(e))
    cluster.forget(c.decision)
