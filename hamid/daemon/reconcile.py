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
            destroy_mig(self._backend, r)
            log.info("released stale reservation", owner=r.owner, kind=r.kind)
        return released


def destroy_mig(backend: DeviceBackend, r: Reservation) -> None:
    """Destroy every MIG instance recorded on ``r``; already gone is fine."""
    for gpu_uuid, inst in r.mig.items():
        try:
            backend.destroy_mig_instance(gpu_uuid, int(inst["gi"]))
        except DeviceError as e:
            log.error("could not destroy MIG instance", owner=r.owner, gpu=gpu_uuid, gi=inst.get("gi"), error=str(e))
