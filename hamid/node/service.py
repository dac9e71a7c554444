"""The node service: the node's authority as one object, for trio code.

Every face (the local API, the Docker face, the peer API, later the device
plugin and the control face) calls these async methods and nothing below
them. Each runs :class:`hamid.node.core.NodeCore` in a worker thread of the
service's own pool (SQLite, NVML and the file system block), so the trio
loop never waits on the disk and no face can starve another's threads.
Every change is announced to subscribers (gossip republishes the node's
capacity, metrics count commits).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import trio

from ..ledger import LedgerConflict, Reservation
from ..logs import get_logger
from ..placement import Decision
from ..request.model import Request
from .core import Admitted, Liveness, NodeCore
from .identity import Owner

log = get_logger("node")

# (event, owner key): event is one of admitted, committed, released, state, conflict, mps_failed
Listener = Callable[[str, str], None]


class NodeService:
    def __init__(self, core: NodeCore, backend_label: str, *, threads: int = 8) -> None:
        self.core = core
        self.name = core.facts.node
        self.backend_label = backend_label
        self._threads = trio.CapacityLimiter(threads)
        self._listeners: list[Listener] = []

    def subscribe(self, fn: Listener) -> None:
        """``fn(event, key)`` after every change (called in the trio thread; must not block)."""
        self._listeners.append(fn)

    def _notify(self, event: str, key: str) -> None:
        for fn in self._listeners:
            try:
                fn(event, key)
            except Exception:  # a listener's bug must not undo a committed change
                log.exception("change listener failed", listener=repr(fn))

    async def _run(self, fn, *args, **kw):
        return await trio.to_thread.run_sync(functools.partial(fn, *args, **kw), limiter=self._threads)

    async def _changing(self, event: str, key: str, fn, *args, **kw):
        try:
            out = await self._run(fn, *args, **kw)
        except LedgerConflict:
            self._notify("conflict", key)
            raise
        self._notify(event, key)
        return out

    def announce(self, event: str, key: str) -> None:
        """Tell the subscribers of a change a face made through :meth:`run_blocking`
        (``admitted``, ``released``, ``conflict``): every change is announced once,
        whichever door it came through."""
        self._notify(event, key)

    async def run_blocking(self, fn, *args, event: str | None = None, key: str = "", **kw):
        """Run a face's blocking work over the core (``fn``) in the service's
        threads; ``event`` (e.g. "admitted") is announced after it succeeds."""
        out = await self._run(fn, *args, **kw)
        if event is not None:
            self._notify(event, out if isinstance(out, str) and not key else key)
        return out

    # --- changes -----------------------------------------------------------------

    async def admit(self, owner: Owner, request: Request, *, user: tuple[int, int] = (0, 0),
                    details: Mapping[str, Any] | None = None, deadline: float | None = None) -> Admitted:
        got = await self._changing("admitted", owner.key, self.core.admit, owner, request, user=user,
                                   details=details, deadline=deadline)
        log.info("admitted", owner=owner.key, name=owner.name,
                 devices=[d.to_dict() for c in got.reservation.decision.containers for d in c.devices])
        return got

    async def commit(self, owner: Owner, decision: Decision, *, request: dict | None = None,
                     details: dict | None = None, deadline: float | None = None) -> Reservation:
        return await self._changing("committed", owner.key, self.core.commit, owner, decision, request=request,
                                    details=details, deadline=deadline)

    async def release(self, key: str) -> Reservation | None:
        res = await self._changing("released", key, self.core.release, key)
        if res is not None:
            log.info("released", owner=key, name=res.name)
        return res

    async def set_state(self, key: str, state: str) -> Reservation:
        return await self._changing("state", key, self.core.set_state, key, state)

    async def drain_released(self) -> list[str]:
        done = await self._run(self.core.drain_released)
        for cid in done:
            self._notify("released", f"docker:{cid}")
        return done

    async def reconcile(self, liveness: Mapping[str, Liveness]) -> list[Reservation]:
        done = await self._run(self.core.reconcile, liveness)
        for r in done:
            self._notify("released", r.owner)
        return done

    async def priority_pass(self) -> int:
        return await self._run(self.core.priority_pass)

    async def mps_check(self) -> list[dict[str, Any]]:
        """Adopt, stop or restart the GPUs' MPS control daemons (NodeCore.mps_check);
        ``mps_failed`` is announced for each tenant of a daemon that had failed."""
        failures = await self._run(self.core.mps_check)
        for f in failures:
            for owner in f["owners"]:
                self._notify("mps_failed", owner)
        return failures

    # --- reading -----------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        return await self._run(self.core.status, self.backend_label)

    async def reservations(self) -> list[Reservation]:
        return await self._run(self.core.ledger.list)

    async def get(self, key: str) -> Reservation | None:
        return await self._run(self.core.ledger.get, key)
