"""Leader election among the daemons over a ``coordination.k8s.io/v1`` Lease,
and the leader's pod label that a Service selects.

What this module owns:

* :class:`LeaderElector`: client-go's ``tools/leaderelection`` semantics in
  trio. A candidate tries every ``retryPeriod`` (jittered by up to 1.2 times
  it, as client-go's ``JitterFactor``) and takes the Lease when its holder is
  empty, is itself, or has not changed for ``leaseDurationSeconds`` as
  measured on THIS process's monotonic clock since it last saw the record
  change (client-go's ``observedTime``: the holder's ``renewTime`` is never
  compared with our clock, so clock skew between nodes does not matter, only
  clock-rate skew). The leader renews every ``retryPeriod``; a renewal round
  that has not succeeded within ``renewDeadline`` ends the term: the work
  run under :meth:`LeaderElector.leadership` is cancelled at that instant, the
  label comes off, and the Lease is released if it is still ours. Every write
  sends the object as last read (its ``resourceVersion``), so a racing writer
  gets ``409 Conflict`` and re-reads instead of overwriting; a create that
  loses the race gets ``409 AlreadyExists``. A new holder writes
  ``leaseTransitions + 1`` and a fresh ``acquireTime``; a renewal keeps both.
  Times are written as MicroTime (``2006-01-02T15:04:05.000000Z``), the
  duration as whole seconds (``int(leaseDuration)``, as client-go).
  Release (clean shutdown, or a lost term) is client-go's ``ReleaseOnCancel``:
  one update of the object as last read with ``holderIdentity: ""``,
  ``leaseDurationSeconds: 1``, ``acquireTime``/``renewTime`` now and the
  transitions kept, and only once the term's work has returned; an empty
  holder is free to every candidate at once. After a lost term the elector
  becomes a candidate again (client-go's ``Run`` returns; a daemon keeps
  running). As client-go says of itself, this does not fence: for a moment two
  daemons may both act as leader, which is why every placement is re-checked
  by the chosen node's ledger.

* the leader label (:class:`LeaderLabel`): while leading, the elector labels
  its own pod ``hamid.io/leader: "true"`` (``POD_NAME``/``POD_NAMESPACE`` from
  the downward API) and removes that label from every other daemon pod
  (``daemonPodSelector``) still carrying it, a partitioned or killed ex-leader;
  it checks again every ``leaseDuration``. On losing the lead it removes its
  own. A Service selecting ``hamid.io/leader=true`` reaches the leader (after
  EndpointSlice and kube-proxy catch up). Without ``POD_NAME`` there is no pod
  to label: a warning says so once, and only the Lease is kept.

Identity: ``POD_NAME`` when set (a DaemonSet sets it through the downward API:
unique per pod, so a restarted pod on the same node is a new candidate), else
the node name. :attr:`LeaderElector.leader_identity` is the holder as last
observed (``None`` when the Lease is free or expired by our observation);
:meth:`LeaderElector.leader_node` turns a pod-name identity into the node it
runs on, so followers can forward to the leader.

Lease namespace: ``leaderElectionNamespace``, else ``POD_NAMESPACE``, else
``kube-system``. RBAC: leases get, create, update; pods get, list, patch.

Requests go through :class:`hamid.kube.rest.AsyncKube` on the trio loop (the
official client's configuration: its server, credentials and TLS), each with
the renew deadline as its own, and a cancelled request is simply dropped; the
JSON bodies are written here, so MicroTime keeps its exact format (the
generated models would rewrite it as ``+00:00``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, NoReturn

import trio

from ..errors import HamidError
from ..logs import get_logger
from ..config.leasetiming import JITTER_FACTOR, ElectionConfigError, validate_timing
from .rest import AsyncKube, KubeApiError

log = get_logger("leader")

LEADER_LABEL = "hamid.io/leader"
DAEMON_POD_SELECTOR = "app.kubernetes.io/name=hamid"
DEFAULT_NAMESPACE = "kube-system"
_LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"


class NotLeading(HamidError):
    """:meth:`LeaderElector.leadership` entered while this daemon does not lead."""


# --- the election record --------------------------------------------------------------


def micro_time(now: datetime.datetime | None = None) -> str:
    """``now`` (UTC) as a Kubernetes MicroTime: ``2006-01-02T15:04:05.000000Z``."""
    now = now or datetime.datetime.now(datetime.UTC)
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseRecord:
    """client-go's ``LeaderElectionRecord`` as held in a Lease's spec."""

    holder: str
    duration_s: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None) -> LeaseRecord:
        spec = spec or {}
        return cls(holder=spec.get("holderIdentity") or "", duration_s=int(spec.get("leaseDurationSeconds") or 0),
                   acquire_time=spec.get("acquireTime"), renew_time=spec.get("renewTime"),
                   transitions=int(spec.get("leaseTransitions") or 0))

    def to_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"holderIdentity": self.holder, "leaseDurationSeconds": self.duration_s,
                                "leaseTransitions": self.transitions}
        if self.acquire_time is not None:
            spec["acquireTime"] = self.acquire_time
        if self.renew_time is not None:
            spec["renewTime"] = self.renew_time
        return spec


# --- the leader label ----------------------------------------------------------------


class LeaderLabel:
    """Puts ``hamid.io/leader: "true"`` on this daemon's pod and takes it off
    every other daemon pod."""

    def __init__(self, kube: AsyncKube, namespace: str, pod: str, selector: str = DAEMON_POD_SELECTOR) -> None:
        self.kube = kube
        self.namespace = namespace
        self.pod = pod
        self.selector = selector

    async def _set(self, pod: str, value: str | None) -> None:
        await self.kube.request("PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{pod}",
                          {"metadata": {"labels": {LEADER_LABEL: value}}},
                          content_type="application/merge-patch+json")

    async def mark(self) -> list[str]:
        """Label our pod, unlabel the others; returns the pods unlabelled."""
        await self._set(self.pod, "true")
        got = await self.kube.request("GET", f"/api/v1/namespaces/{self.namespace}/pods",
                                query={"labelSelector": f"{self.selector},{LEADER_LABEL}=true"})
        stale = [p["metadata"]["name"] for p in got.get("items") or [] if p["metadata"]["name"] != self.pod]
        for name in stale:
            try:
                await self._set(name, None)
            except KubeApiError as e:
                if e.status != 404:  # gone meanwhile: nothing to unlabel
                    raise
        return stale

    async def unmark(self) -> None:
        try:
            await self._set(self.pod, None)
        except KubeApiError as e:
            if e.status != 404:
                raise


# --- the elector ---------------------------------------------------------------------


def daemon_namespace(environ: Mapping[str, str] = os.environ) -> str:
    """The namespace of the daemon's pods: ``POD_NAMESPACE`` (downward API), else ``kube-system``."""
    return environ.get("POD_NAMESPACE") or DEFAULT_NAMESPACE


class LeaderElector:
    """One candidate. ``await nursery.start(elector.run)``; then
    ``nursery.start_soon(elector.run_while_leading, work)`` runs ``work()``
    during each term, cancelled the moment the term ends (see
    :meth:`leadership` for the same as a ``with`` block)."""

    def __init__(self, api, *, identity: str, namespace: str = DEFAULT_NAMESPACE, name: str = "hamid-leader",
                 lease_duration: float = 15, renew_deadline: float = 10.0, retry_period: float = 2.0,
                 pod: str | None = None, pod_selector: str = DAEMON_POD_SELECTOR,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not identity:
            raise ElectionConfigError("leader election needs an identity: set POD_NAME or the node name")
        validate_timing(lease_duration, renew_deadline, retry_period)
        self.identity = identity
        self.namespace = namespace
        self.name = name
        self.lease_duration_s = int(lease_duration)
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.pod = pod
        self._clock = clock
        # every request has the renew deadline: a renewal round cannot outlast it anyway
        self._kube = AsyncKube.of(api, timeout_s=renew_deadline)
        self.label = LeaderLabel(self._kube, namespace, pod, pod_selector) if pod else None
        self._path = _LEASES.format(ns=namespace) + f"/{name}"
        # client-go's bookkeeping: the record as last observed, when it was observed, the raw record last read
        self._observed: LeaseRecord | None = None
        self._observed_time = 0.0
        self._observed_raw: LeaseRecord | None = None
        self._lease: dict | None = None  # the Lease object as last read or written (its resourceVersion)
        # the term, seen from outside
        self._leading = False
        self._became_leader = trio.Event()
        self._term_ended = trio.Event()
        self._term_ended.set()
        self._scopes: set[trio.CancelScope] = set()
        self._active_work = 0
        self._work_done = trio.Event()
        self._work_done.set()
        self._leader_nodes: dict[str, str] = {}
        self.terms = 0  # terms begun by this elector (tests, metrics)

    @classmethod
    def from_config(cls, config, api, node_name: str, environ: Mapping[str, str] = os.environ) -> LeaderElector:
        """An elector from the daemon's config and the downward API's environment."""
        pod = environ.get("POD_NAME") or None
        if pod is None:
            log.warning("POD_NAME is not set: the identity is the node name and no pod gets the leader label "
                        f"{LEADER_LABEL}; set POD_NAME and POD_NAMESPACE from the downward API", node=node_name)
        return cls(api, identity=pod or node_name,
                   namespace=config.leaderElectionNamespace or daemon_namespace(environ),
                   name=config.leaderElectionLeaseName, lease_duration=config.leaderElectionLeaseDuration,
                   renew_deadline=config.leaderElectionRenewDeadline,
                   retry_period=config.leaderElectionRetryPeriod, pod=pod, pod_selector=config.daemonPodSelector)

    # --- what callers see ----------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """True during a term: from a successful acquire until a renewal round
        fails (or the elector stops)."""
        return self._leading

    @property
    def leader_identity(self) -> str | None:
        """The holder of the Lease as last observed, ``None`` when it is free
        or expired by our observation (a follower then has nobody to forward to)."""
        if self._leading:
            return self.identity
        obs = self._observed
        if obs is None or not obs.holder or not self._valid(self._clock()):
            return None
        return obs.holder

    async def leader_node(self) -> str | None:
        """The node the leader runs on: with pod identities, the ``spec.nodeName``
        of the leader's pod (read once per identity); otherwise the identity
        itself, which is a node name."""
        ident = self.leader_identity
        if ident is None or self.pod is None:
            return ident
        if ident not in self._leader_nodes:
            pod = await self._kube.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/{ident}")
            node = (pod.get("spec") or {}).get("nodeName")
            if not node:
                return None  # not bound yet; ask again later
            self._leader_nodes[ident] = node
        return self._leader_nodes[ident]

    async def refresh(self) -> str | None:
        """Read the Lease now (not at the next retry) and return :attr:`leader_identity`:
        a follower learns of a new holder at once. A changed record counts as
        observed now, as in a retry round; a leader does not read (it knows)."""
        if self._leading:
            return self.identity
        try:
            lease = await self._kube.request("GET", self._path)
        except KubeApiError as e:
            log.info("could not read the Lease", lease=f"{self.namespace}/{self.name}", error=str(e))
            return self.leader_identity
        record = LeaseRecord.from_spec(lease.get("spec"))
        if not self._leading and record != self._observed_raw:
            self._lease = lease
            self._set_observed(record)
            self._observed_raw = record
        return self.leader_identity

    async def wait_leading(self) -> None:
        """Return once this daemon leads (at once if it does)."""
        while not self._leading:
            await self._became_leader.wait()

    async def wait_not_leading(self) -> None:
        """Return once this daemon does not lead (at once if it does not)."""
        while self._leading:
            await self._term_ended.wait()

    @contextlib.contextmanager
    def leadership(self) -> Iterator[trio.CancelScope]:
        """``with elector.leadership():`` runs its body only within the current
        term: the body is cancelled the instant the term ends (a failed
        renewal round, or the elector stopping), and the Lease is released only
        after the body has left. Raises :class:`NotLeading` outside a term."""
        if not self._leading:
            raise NotLeading(f"{self.identity} does not lead (Lease {self.namespace}/{self.name}, "
                             f"holder {self.leader_identity or 'none'})")
        scope = trio.CancelScope()
        self._scopes.add(scope)
        self._active_work += 1
        self._work_done = trio.Event() if self._active_work == 1 else self._work_done
        try:
            with scope:
                yield scope
        finally:
            self._scopes.discard(scope)
            self._active_work -= 1
            if self._active_work == 0:
                self._work_done.set()

    async def run_while_leading(self, work: Callable[[], Awaitable[object]]) -> NoReturn:
        """Forever: wait to lead, run ``work()`` within :meth:`leadership`. If
        ``work`` returns before the term ends, wait for the next term."""
        while True:
            await self.wait_leading()
            try:
                with self.leadership():
                    await work()
            except NotLeading:
                continue  # the term ended between the wake-up and here
            await self.wait_not_leading()

    # --- the loop ------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> NoReturn:
        """Be a candidate until cancelled: acquire, lead until a renewal round
        fails, release, be a candidate again. An elector runs once: its API
        connections are closed when this returns."""
        log.info("leader election starting", identity=self.identity, lease=f"{self.namespace}/{self.name}",
                 lease_duration_s=self.lease_duration_s, renew_deadline_s=self.renew_deadline,
                 retry_period_s=self.retry_period)
        task_status.started()
        try:
            while True:
                await self._acquire()
                await self._term()
        finally:
            with trio.CancelScope(shield=True):
                await self._kube.aclose()

    async def _acquire(self) -> None:
        while True:
            if await self._try_acquire_or_renew():
                return
            await trio.sleep(self.retry_period * (1 + random.random() * JITTER_FACTOR))

    async def _term(self) -> None:
        self._start_leading()
        try:
            async with trio.open_nursery() as nursery:
                if self.label is not None:
                    nursery.start_soon(self._label_loop)
                await self._renew_until_failure()
                nursery.cancel_scope.cancel()
        finally:
            self._stop_leading()
            with trio.CancelScope(shield=True) as cleanup:
                cleanup.deadline = trio.current_time() + self.renew_deadline
                await self._work_done.wait()  # ReleaseOnCancel: the guarded work has ended first
                if self.label is not None:
                    try:
                        await self.label.unmark()
                    except KubeApiError as e:
                        log.warning("could not remove the leader label from our pod", pod=self.pod, error=str(e))
                await self._release()
            if cleanup.cancelled_caught:
                log.warning("leaving the lead took longer than the renew deadline; the Lease expires on its own",
                            renew_deadline_s=self.renew_deadline)

    async def _renew_until_failure(self) -> None:
        """client-go's ``renew``: every retry period a round of tries, each
        retry period apart, that must succeed within the renew deadline."""
        while True:
            await trio.sleep(self.retry_period)
            with trio.move_on_after(self.renew_deadline):
                while not await self._try_acquire_or_renew():
                    await trio.sleep(self.retry_period)
                continue
            log.warning("could not renew the Lease within the renew deadline: no longer leading",
                        lease=f"{self.namespace}/{self.name}", renew_deadline_s=self.renew_deadline)
            return

    def _start_leading(self) -> None:
        self._leading = True
        self.terms += 1
        self._term_ended = trio.Event()
        self._became_leader.set()
        log.info("became leader", identity=self.identity, lease=f"{self.namespace}/{self.name}",
                 transitions=self._observed.transitions if self._observed else None)

    def _stop_leading(self) -> None:
        if not self._leading:
            return
        self._leading = False
        for scope in list(self._scopes):
            scope.cancel()
        self._became_leader = trio.Event()
        self._term_ended.set()
        log.info("stopped leading", identity=self.identity, lease=f"{self.namespace}/{self.name}")

    async def _label_loop(self) -> None:
        label = self.label
        if label is None:
            return  # no pod to label (started only with one)
        while True:
            try:
                stale = await label.mark()
                if stale:
                    log.info("removed the leader label from a stale leader's pod", pods=stale)
                await trio.sleep(self.lease_duration_s)
            except KubeApiError as e:
                log.warning("could not set the leader label", pod=self.pod, error=str(e))
                await trio.sleep(self.retry_period)

    # --- client-go's tryAcquireOrRenew and release -------------------------------------

    def _valid(self, now: float) -> bool:
        obs = self._observed
        return obs is not None and self._observed_time + obs.duration_s > now

    def _observed_is_me(self) -> bool:
        return self._observed is not None and self._observed.holder == self.identity

    def _set_observed(self, record: LeaseRecord) -> None:
        self._observed = record
        self._observed_time = self._clock()

    async def _put(self, lease: dict, record: LeaseRecord) -> dict:
        body = dict(lease, spec=record.to_spec())  # metadata as read: its resourceVersion makes the write conditional
        return await self._kube.request("PUT", self._path, body)

    async def _create(self, record: LeaseRecord) -> dict:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace}, "spec": record.to_spec()}
        return await self._kube.request("POST", _LEASES.format(ns=self.namespace), body)

    async def _try_acquire_or_renew(self) -> bool:
        now = self._clock()
        stamp = micro_time()
        record = LeaseRecord(self.identity, self.lease_duration_s, stamp, stamp, 0)
        lease_name = f"{self.namespace}/{self.name}"

        # 1. the leader's fast path: update the object last seen
        seen = self._observed
        if seen is not None and self._observed_is_me() and self._valid(now) and self._lease is not None:
            record = replace(record, acquire_time=seen.acquire_time, transitions=seen.transitions)
            try:
                self._lease = await self._put(self._lease, record)
                self._set_observed(record)
                return True
            except KubeApiError as e:
                log.info("optimistic renewal failed, reading the Lease", lease=lease_name, error=str(e))

        # 2. read it, or create it
        try:
            lease = await self._kube.request("GET", self._path)
        except KubeApiError as e:
            if e.status != 404:
                log.warning("could not read the Lease", lease=lease_name, error=str(e))
                return False
            try:
                self._lease = await self._create(record)
            except KubeApiError as e2:  # 409 AlreadyExists: another candidate created it first
                log.info("could not create the Lease", lease=lease_name, error=str(e2))
                return False
            self._set_observed(record)
            return True
        self._lease = lease

        # 3. a changed record restarts the expiry clock; a valid other holder wins
        old = LeaseRecord.from_spec(lease.get("spec"))
        if old != self._observed_raw:
            self._set_observed(old)
            self._observed_raw = old
        if old.holder and self._valid(now) and not self._observed_is_me():
            return False

        # 4. take or keep it
        if self._observed_is_me():
            record = replace(record, acquire_time=old.acquire_time, transitions=old.transitions)
        else:
            record = replace(record, transitions=old.transitions + 1)
        try:
            self._lease = await self._put(lease, record)
        except KubeApiError as e:  # 409 Conflict: someone wrote since our read; the next try reads again
            log.info("could not update the Lease", lease=lease_name, error=str(e))
            return False
        self._set_observed(record)
        return True

    async def _release(self) -> None:
        seen = self._observed
        if seen is None or not self._observed_is_me() or self._lease is None:
            return
        stamp = micro_time()
        record = LeaseRecord("", 1, stamp, stamp, seen.transitions)
        try:
            self._lease = await self._put(self._lease, record)
        except KubeApiError as e:
            log.warning("could not release the Lease; it expires on its own", lease=f"{self.namespace}/{self.name}",
                        error=str(e))
            return
        self._set_observed(record)
        log.info("released the Lease", lease=f"{self.namespace}/{self.name}")


__all__ = ["DAEMON_POD_SELECTOR", "ElectionConfigError", "LEADER_LABEL", "LeaderElector",
           "LeaderLabel", "LeaseRecord", "NotLeading", "daemon_namespace", "micro_time", "validate_timing"]
