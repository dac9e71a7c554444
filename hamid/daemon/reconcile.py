"""Bringing the ledger back to the truth: the reconcile hooks.

Each kind of owner (``docker``, ``pod``) can register a liveness check; a
reservation whose check says its owner is gone is released, and MIG instances
created for it are destroyed (idempotently: already gone is done). Kinds
with no check registered are left alone: hamid never releases what it cannot
prove is gone.
"""

from __future__ import annotations

from collections.abc import Callable

from ..devices import DeviceBackend, DeviceError
from ..ledger import Ledger, Reservation
from ..logs import get_logger

log = get_logger("reconcile")

Liveness = Callable[[Reservation], bool]


class Reconciler:
    def __init__(self, ledger: Ledger, backend: DeviceBackend) -> None:
        self._ledger = ledger
        self._backend = backend
        self._checks: dict[str, Liveness] = {}

    def register(self, kind: str, alive: Liveness) -> None:
        self._checks[kind] = alive

    def _alive(self, r: Reservation) -> bool:
        check = self._checks.get(r.kind)
        if check is None:
            return True
        try:
            return check(r)
        except Exception as e:  # a failing check must not release anything
            log.warning("liveness check failed; keeping reservation", owner=r.owner, error=str(e))
            return True

    def run_once(self) -> list[Reservation]:
        released = self._ledger.reconcile(self._alive)
        for r in released:
            destroy_mig_of(self._backend, r.to_dict())
            log.info("released stale reservation", owner=r.owner, kind=r.kind)
        return released


def destroy_mig_of(backend: DeviceBackend, reservation: dict) -> int:
    """Destroy the MIG instances made for a (released) reservation.

    Instances recorded on the reservation are destroyed by their GPU-instance
    ID. A MIG slot of the decision with no record (the creator died between
    creating it and recording it) is found among the GPU's live instances by
    its profile and placement, which no other reservation can hold. Already
    gone is fine. Returns how many were destroyed.
    """
    recorded = reservation.get("mig") or {}
    wanted = [d for c in reservation["decision"]["containers"] for d in c["devices"] if d.get("mig_profile")]
    if not wanted:
        return 0
    live = None
    done = 0
    for d in wanted:
        gi = (recorded.get(d["uuid"]) or {}).get("gi")
        if gi is None:
            if live is None:
                live = {g.uuid: g.mig_instances for g in backend.gpus()}
            pl = d["mig_placement"]
            match = [i for i in live.get(d["uuid"], ()) if i.profile == d["mig_profile"]
                     and (i.placement.start, i.placement.size) == (pl["start"], pl["size"])]
            if not match:
                continue
            gi = match[0].gi_id
        try:
            done += backend.destroy_mig_instance(d["uuid"], int(gi))
        except DeviceError as e:
            log.error("could not destroy MIG instance", owner=reservation.get("owner"), gpu=d["uuid"], gi=gi,
                      error=str(e))
    return done
