"""The node service: the node's authority as one object, for trio code.

Every face (the local API, the Docker face, the peer API, later the device
plugin and the scheduling face) calls these async methods and nothing below
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

from ..ledger import Abandoned, Details, LedgerConflict, Reservation
from ..ledger.report import missing_gpus
from ..logs import get_logger
from ..placement import Decision
from ..request.docker import ENV_DEVICES, ENV_SPEC
from ..request.model import Request
from .core import Admitted, Liveness, NodeCore, container_answer, refusal
from .identity import Owner

log = get_logger("node")

# What faces use of the core's types: they import these from here, never the ledger or the core itself
# (tests/test_layers.py holds them to it).
__all__ = ["Abandoned", "Admitted", "Details", "LedgerConflict", "Liveness", "NodeDoor", "NodeService",
           "Reservation", "container_answer", "missing_gpus", "refusal"]

# (event, owner key): event is one of admitted, committed, released, state, conflict, mps_failed, compute_held,
# memory_killed
Listener = Callable[[str, str], None]


class NodeService:
    def __init__(self, core: NodeCore, backend_label: str, *, threads: int = 8) -> None:
        self.core = core
        self.name = core.facts.node
        self.backend_label = backend_label
        self._threads = trio.CapacityLimiter(threads)
        self._listeners: list[Listener] = []
        self._held: set[tuple[str, str, str]] = set()  # (owner, container, GPU) the last pass held from outside

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
                    details: Details | None = None, deadline: float | None = None) -> Admitted:
        got = await self._changing("admitted", owner.key, self.core.admit, owner, request, user=user,
                                   details=details, deadline=deadline)
        log.info("admitted", owner=owner.key, name=owner.name,
                 devices=[d.to_dict() for c in got.reservation.decision.containers for d in c.devices])
        return got

    async def admit_container(self, cid: str, env: list[str], **kw) -> Admitted | None:
        """:meth:`NodeCore.admit_container` (the one container admission path), announced."""
        key = f"docker:{cid}"
        try:
            got = await self._run(self.core.admit_container, cid, env, **kw)
        except LedgerConflict:
            self._notify("conflict", key)
            raise
        if got is not None:  # a container that asks nothing of ours changed nothing
            self._notify("admitted", key)
            log.info("container admitted", id=cid[:12])
        return got

    def admit_container_blocking(self, cid: str, env: list[str], **kw) -> Admitted | None:
        """The same, from a face's blocking work in the service's threads
        (:meth:`run_blocking`); announced in the trio thread all the same."""
        key = f"docker:{cid}"
        try:
            got = self.core.admit_container(cid, env, **kw)
        except LedgerConflict:
            trio.from_thread.run_sync(self._notify, "conflict", key)
            raise
        if got is not None:
            trio.from_thread.run_sync(self._notify, "admitted", key)
            res = got.reservation
            asked = {k: v[:200] for k, _, v in (e.partition("=") for e in env)
                     if k in (ENV_DEVICES, ENV_SPEC)}
            log.info("container admitted", id=cid[:12], name=res.name, spec=asked,
                     gpus=[f"{d.index} {d.mig_profile}" if d.mig_profile else
                           f"{d.index} {d.mem_mib} MiB {d.cores}%{' mps' if d.mps else ''}"
                           for c in res.decision.containers for d in c.devices])
        return got

    def release_blocking(self, key: str) -> Reservation | None:
        """:meth:`release` from a face's blocking work (:meth:`run_blocking`)."""
        res = self.core.release(key)
        trio.from_thread.run_sync(self._notify, "released", key)
        return res

    @property
    def state_dir(self) -> str:
        return str(self.core.state_dir)

    @property
    def facts(self):
        """The node's facts (:class:`hamid.node.facts.NodeFacts`): read-only."""
        return self.core.facts

    def door(self) -> "NodeDoor":
        """The verbs a face's blocking work (in :meth:`run_blocking`) may call."""
        return NodeDoor(self)

    async def commit(self, owner: Owner, decision: Decision, *, request: Request | None = None,
                     details: Details | None = None, deadline: float | None = None) -> Reservation:
        return await self._changing("committed", owner.key, self.core.commit, owner, decision, request=request,
                                    details=details, deadline=deadline)

    async def commit_many(self, items: list[tuple[Owner, Decision, Request | None, Details | None]], *,
                          deadline: float | None = None) -> list[Reservation | LedgerConflict]:
        """Several proposals in one ledger transaction; each its reservation or its refusal
        (a :class:`LedgerConflict`, returned, not raised), in order; each announced as the
        single :meth:`commit` announces it."""
        got = await self._run(self.core.commit_many, items, deadline=deadline)
        for (owner, *_), out in zip(items, got):
            self._notify("conflict" if isinstance(out, LedgerConflict) else "committed", owner.key)
        return got

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

    async def restore_limits_files(self) -> list[str]:
        """At start-up, before any face serves: :meth:`NodeCore.restore_limits_files`."""
        return await self._run(self.core.restore_limits_files)

    async def priority_pass(self) -> int:
        """One live pass (NodeCore.priority_pass); ``compute_held`` is announced for each owner with a
        container the pass began to hold to its compute limit from outside, ``memory_killed`` for each whose
        processes with no shim it killed for their GPU memory."""
        n = await self._run(self.core.priority_pass)
        for owner in sorted({k["owner"] for k in await self._run(self.core.memory_killed)}):
            self._notify("memory_killed", owner)
        held = {(h["owner"], h["container"], h["gpu"]) for h in await self._run(self.core.held_containers)}
        for owner in sorted({k[0] for k in held - self._held}):
            self._notify("compute_held", owner)
        self._held = held
        return n

    def resume_stopped(self) -> None:
        """Continues every process the bypass guard stopped (the daemon is stopping): quick, in the caller."""
        self.core.resume_stopped()

    async def mps_check(self) -> list[dict[str, Any]]:
        """Adopt, stop or restart the GPUs' MPS control daemons (NodeCore.mps_check);
        ``mps_failed`` is announced for each tenant of a daemon that had failed."""
        failures = await self._run(self.core.mps_check)
        for f in failures:
            for owner in f["owners"]:
                self._notify("mps_failed", owner)
        return failures

    # --- reading -----------------------------------------------------------------

    async def view(self):
        """This node's GPUs and what is booked on them (:class:`hamid.placement.NodeView`)."""
        return await self._run(self.core.ledger.view)

    async def gpus(self):
        """The device backend's GPUs as it sees them now (health included)."""
        return await self._run(lambda: self.core.backend.gpus())

    def health_events(self):
        """The backend's blocking health-event watch (for :meth:`run_blocking`), or None."""
        return getattr(self.core.backend, "watch_health_events", None)

    async def status(self) -> dict[str, Any]:
        return await self._run(self.core.status, self.backend_label)

    async def reservations(self) -> list[Reservation]:
        return await self._run(self.core.ledger.list)

    async def get(self, key: str) -> Reservation | None:
        return await self._run(self.core.ledger.get, key)

    async def in_state(self, state: str, kind: str | None = None) -> list[Reservation]:
        """The reservations in ``state`` (of ``kind``), oldest first: only those rows read."""
        return await self._run(self.core.ledger.in_state, state, kind)


class NodeDoor:
    """The node service's verbs for a face's blocking work: called in one of the
    service's worker threads (:meth:`NodeService.run_blocking`), or, once the
    face has told the door its trio loop (:meth:`use_loop`), in threads of its
    own; each change announced in the trio thread as the async verbs announce
    theirs. The kubelet face's admission runs on grpcio's threads; it reaches
    the node through this and nothing else."""

    def __init__(self, service: NodeService) -> None:
        self._service = service
        self._core = service.core
        self.facts = service.core.facts
        self.state_dir = service.core.state_dir
        self._token: trio.lowlevel.TrioToken | None = None

    def use_loop(self, token: trio.lowlevel.TrioToken) -> None:
        """Announce through ``token`` (the daemon's trio loop): the door may then be used from any
        thread, and an announcement is handed to the loop without waiting for it."""
        self._token = token

    def announce(self, event: str, key: str) -> None:
        """Tell the subscribers of a change this face made through the door (``admitted``...)."""
        if self._token is None:
            trio.from_thread.run_sync(self._service._notify, event, key)
            return
        try:
            self._token.run_sync_soon(self._service._notify, event, key)
        except trio.RunFinishedError:
            pass  # the daemon is stopping: nobody is left to tell

    def own_file_dir(self, path: str) -> None:
        self._core.own_file_dir(path)

    def held_containers(self) -> list[dict[str, Any]]:
        """The containers the live pass holds to their compute limits from outside (NodeCore.held_containers)."""
        return self._core.held_containers()

    def take_memory_kills(self, owner: str) -> list[dict[str, Any]]:
        """``owner``'s kills for its GPU memory not yet told (NodeCore.take_memory_kills)."""
        return self._core.take_memory_kills(owner)

    def admit(self, owner: Owner, request: Request, *, slots: Mapping[str, str]) -> Admitted:
        """A pod admitted on the node itself (it came bound, or without a reservation),
        its containers keyed to kubelet's ``slots``; its user is not known (None)."""
        try:
            return self._core.admit(owner, request, user=None, details=Details(container_slots=dict(slots)))
        except LedgerConflict:  # (the admission is announced by the face's run_blocking, once it is whole)
            self.announce("conflict", owner.key)
            raise

    def commit(self, owner: Owner, decision: Decision, *, request: Request | None = None) -> Reservation:
        """A decision made elsewhere (the DRA scheduler's allocation), re-checked by the ledger."""
        try:
            return self._core.commit(owner, decision, request=request)
        except LedgerConflict:
            self.announce("conflict", owner.key)
            raise

    def prepare(self, key: str, **kw) -> Reservation:
        return self._core.prepare(key, **kw)

    def release(self, key: str) -> Reservation | None:
        """Release ``key`` (announced): a face undoing what it booked a moment ago."""
        got = self._core.release(key)
        self.announce("released", key)
        return got

    def write_container_files(self, key: str, container: str, user: tuple[int, int] | None = None) -> None:
        self._core.write_container_files(key, container, user)

    def move(self, key: str, request: Request, slots: Mapping[str, str]) -> Reservation:
        got = self._core.move(key, request, slots)
        self.announce("committed", key)
        return got

    def attach_file(self, key: str, path: str) -> Reservation:
        return self._core.attach_file(key, path)

    def get(self, key: str) -> Reservation | None:
        return self._core.ledger.get(key)

    def view(self):
        return self._core.ledger.view()

    def reservations(self) -> list[Reservation]:
        return self._core.ledger.list()

    def in_state(self, state: str, kind: str | None = None) -> list[Reservation]:
        """The reservations in ``state`` (of ``kind``), oldest first: only those rows read."""
        return self._core.ledger.in_state(state, kind)

    # after every annotation that says list[...]: in the class body the name is this alias from here on
    list = reservations  # what a ledger reader calls it (hamid.metrics.exporter.LedgerReader)

    def gpus(self):
        return self._core.backend.gpus()

    def change_stamp(self):
        """Changes when the ledger does (a cheap check before reading it all)."""
        return self._core.ledger.change_stamp()

    def status(self, backend_label: str) -> dict:
        return self._core.status(backend_label)
