"""The MIG lifecycle of a reservation: instances made inside admission,
destroyed inside release, before the ledger row goes.

Creation happens while the reservation row is ``reserved``: the instance is
made at the placement the ledger committed, its two capability nodes are
read, and all of it is recorded on the row before the container is given
anything. Destruction happens while the row is ``releasing`` and still books
the placement, so no newer reservation can be given that placement (and an
instance there) until the old instance is gone. hamid never switches a GPU's
MIG mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..devices import DeviceBackend, DeviceError
from ..devices.types import MigPlacement
from ..ledger import Reservation
from ..logs import get_logger
from . import devnodes
from .facts import NodeFacts

log = get_logger("mig")


def wanted(res: Reservation) -> list:
    """The MIG slots of a reservation's decision (every container's)."""
    return [d for c in res.decision.containers for d in c.devices if d.mig_profile]


def create_instances(backend: DeviceBackend, res: Reservation, facts: NodeFacts,
                     record: Callable[[dict[str, Any]], object]) -> None:
    """Make the reservation's missing instances, ``record``-ing each one
    (``{gpu uuid: {gi, ci, uuid, caps}}``) as soon as it exists, so a crash
    right after leaves a row that release can tear down by its record."""
    for d in wanted(res):
        if (res.mig.get(d.uuid) or {}).get("uuid"):
            continue  # made by an earlier, interrupted admission
        inst = backend.create_mig_instance(d.uuid, d.mig_profile, MigPlacement(*d.mig_placement))
        entry: dict[str, Any] = {"gi": inst.gi_id, "ci": inst.ci_id, "uuid": inst.uuid, "caps": []}
        record({d.uuid: entry})
        minor = facts.gpu_minors.get(d.uuid)
        if minor is not None:
            caps = devnodes.mig_cap_nodes(facts.dev_root, facts.caps_root, minor, inst.gi_id, inst.ci_id,
                                          required=facts.real)
            entry = {**entry, "caps": [n.to_cdi() for n in caps]}
            record({d.uuid: entry})


def destroy_instances(backend: DeviceBackend, res: Reservation) -> int:
    """Destroy the MIG instances made for a reservation that is being released.

    Instances recorded on the reservation are destroyed by their GPU-instance
    ID. A MIG slot with no record (its creator died between creating it and
    recording it) is found among the GPU's live instances by its profile and
    placement, which the still-present row keeps anyone else from holding.
    Already gone is fine. Returns how many were destroyed.
    """
    slots = wanted(res)
    if not slots:
        return 0
    live = None
    done = 0
    for d in slots:
        gi = (res.mig.get(d.uuid) or {}).get("gi")
        if gi is None:
            if live is None:
                live = {g.uuid: g.mig_instances for g in backend.gpus()}
            match = [i for i in live.get(d.uuid, ()) if i.profile == d.mig_profile
                     and tuple(i.placement) == tuple(d.mig_placement)]
            if not match:
                continue
            gi = match[0].gi_id
        try:
            done += backend.destroy_mig_instance(d.uuid, int(gi))
        except DeviceError as e:
            log.error("could not destroy MIG instance", owner=res.owner, gpu=d.uuid, gi=gi, error=str(e))
            raise
    return done
