"""The scheduling face: the cluster half of Kubernetes, on every daemon.

- the Lease election (:class:`hamid.kube.election.LeaderElector`, handed in) among the daemons;
- while this daemon leads, in gate mode, the gate controller (:mod:`.gates`):
  the work is cancelled the instant the term ends;
- in extender mode, the extender's HTTP server (:mod:`.extender`), on every
  daemon, a follower forwarding to the leader; while this daemon leads, the
  pod and ResourceQuota informers its namespace quotas count on (:mod:`.quota`);
- HAMi's namespace quota series, from the leader alone (see :mod:`.quota`).

The webhook is a face of its own (served by every daemon whether or not it
leads). Placement reads the cluster view the daemon hands in (every node's
gossiped capacity), commits go through the peer API to the chosen node,
whose ledger re-checks them: nothing here assumes there is exactly one
leader.
"""

from __future__ import annotations

import time
from typing import Any

import trio

from ..logs import get_logger
from ..request.model import Defaults
from .extender import Extender
from .gates import GateController
from .placer import ClusterView
from .quota import QuotaBook

log = get_logger("control")

CONFIRM_LEADER_S = 0.5  # at most one Lease read per this, to confirm a sender the peer API does not see as leader
TRACK_LEADER_S = 0.5  # how often the leader's node is re-read from the elector's last observation (cached: no API call)


class SchedulingFace:
    name = "scheduling"

    def __init__(self, *, api, peer, cluster: ClusterView, elector, mode: str, defaults: Defaults,
                 node_policy: str, ignored: set[str], extender_listen: str | None = None,
                 extender_of=None, extender_tls=None, extender_client_ca: str | None = None,
                 extender_forward_tls: tuple[str, str, str] | None = None, extender_group: int | None = None,
                 scheduler_names: tuple[str, ...] = ("default-scheduler",), legacy_metrics: bool = False) -> None:
        """``extender_tls``: a blocking callable giving the (certificate, key)
        files the extender serves (the webhook's), None for plain HTTP;
        ``extender_client_ca``: the CA whose client certificates may call it;
        ``extender_group``: with a ``unix:`` ``extender_listen`` (``hamid front``
        serves the port), the group that may connect to the socket."""
        self.api = api
        self.peer = peer
        self.cluster = cluster
        self.elector = elector
        self.mode = mode
        self.defaults = defaults
        self.node_policy = node_policy
        self.ignored = ignored
        self.extender_listen = extender_listen
        self.gates: GateController | None = None
        self.extender_of = extender_of or (lambda node: None)  # a node's extender URL, from gossip
        self.leader_node: str | None = None  # the node the leader runs on (its identity may be a pod name)
        self._confirming = trio.Lock()
        self._confirmed_at = -CONFIRM_LEADER_S
        self.extender_tls = extender_tls
        self.extender_client_ca = extender_client_ca
        self.extender_group = extender_group
        self.legacy_metrics = legacy_metrics
        self._extender_quotas: QuotaBook | None = None  # extender mode, while leading
        self.extender = Extender(api, peer, cluster, defaults=defaults, node_policy=node_policy,
                                 is_leader=lambda: self.elector.is_leader,
                                 leader_url=lambda: self.extender_of(self.leader_node) if self.leader_node else None,
                                 scheduler_names=scheduler_names, forward_tls=extender_forward_tls,
                                 quotas=lambda: self._extender_quotas)

    @property
    def quotas(self) -> QuotaBook | None:
        """The namespace quota count of the current term (None while this daemon does not lead)."""
        if not self.elector.is_leader:
            return None
        if self.mode == "gate":
            return self.gates.quotas if self.gates is not None else None
        return self._extender_quotas

    def collector(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        face = self

        class _Collector:
            def collect(self):
                lead = GaugeMetricFamily("hamid_leader", "1 while this daemon holds the leader Lease")
                lead.add_metric([], 1 if face.elector.is_leader else 0)
                yield lead
                placed = CounterMetricFamily("hamid_pods_placed", "GPU pods placed by this daemon as leader",
                                             labels=["mode"])
                placed.add_metric(["gate"], face.gates.placed if face.gates else 0)
                placed.add_metric(["extender"], face.extender.bound)
                yield placed
                refused = CounterMetricFamily("hamid_extender_binds_refused",
                                              "extender bind calls refused before any commit")
                refused.add_metric([], face.extender.refused)
                yield refused
                yield from face._quota_families()

        return _Collector()

    def _quota_families(self):
        """HAMi's quota series, sampled on the leader (empty families elsewhere)."""
        from ..hamimetrics import Emitter

        em = Emitter(legacy=self.legacy_metrics)
        book = self.quotas
        if book is not None and book.ready:
            for ns, res, used, limit, limit_set in book.series():
                em.add("hami_resource_quota_used", (ns, res, str(limit)), used)
                if limit_set:
                    em.add("hami_resource_quota_limit", (ns, res), limit)
        yield from em.families(("hami_resource_quota_used", "hami_resource_quota_limit"))

    async def _lead_extender(self) -> None:
        """The extender leader's term: the informers its namespace quotas count on."""
        from ..kube.informer import Informer

        pods = Informer(self.api, "/api/v1/pods", name="pods")
        book = QuotaBook(self.api, pods, names=self.defaults.names, memory_factor=self.defaults.memory_factor)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(pods.run)
                await nursery.start(book.run)
                self._extender_quotas = book
                await trio.sleep_forever()
        finally:
            self._extender_quotas = None

    async def _lead(self) -> None:
        """The leader's work for one term (cancelled when the term ends)."""
        self.gates = GateController(self.api, self.peer, self.cluster, defaults=self.defaults,
                                    node_policy=self.node_policy, ignored=self.ignored)
        log.info("leading: placing gated pods")
        await self.gates.run()

    async def confirm_leader(self, sender: str) -> str | None:
        """The leader's node, read afresh from the Lease when ``sender`` is not the one
        last seen (the peer API asks before refusing a commit from ``sender``): a new
        leader's first commits are taken once its Lease is valid, not a retry period
        later. At most one read per ``CONFIRM_LEADER_S``, whoever asks."""
        if sender == self.leader_node:
            return sender
        async with self._confirming:
            if sender != self.leader_node and time.monotonic() - self._confirmed_at >= CONFIRM_LEADER_S:
                self._confirmed_at = time.monotonic()
                try:
                    await self.elector.refresh()
                    self.leader_node = await self.elector.leader_node()
                except Exception as e:  # the API unreachable: the last answer stands
                    log.info("could not read the Lease to confirm a new leader", sender=sender, error=str(e))
        return self.leader_node

    async def _track_leader(self) -> None:
        """Which node the leader runs on, for followers to forward to (a pod-name identity is
        looked up through the API; the node name needs none)."""
        while True:
            try:
                self.leader_node = await self.elector.leader_node()
            except Exception as e:  # the API unreachable: keep the last answer
                log.debug("leader's node unknown", error=str(e))
            await trio.sleep(TRACK_LEADER_S)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.elector.run)
            nursery.start_soon(self._track_leader)  # followers forward to it; the peer API takes commits only from it
            if self.mode == "gate":
                nursery.start_soon(self.elector.run_while_leading, self._lead)
            elif self.mode == "extender" and self.extender_listen:
                from ..serving import serve_asgi

                listen = self.extender_listen

                certfile = keyfile = None
                if self.extender_tls is not None:
                    certfile, keyfile = await trio.to_thread.run_sync(self.extender_tls)
                elif not listen.startswith("unix:"):  # a socket: hamid front does TLS and callers
                    log.warning("extender on plain HTTP without authentication (extenderInsecure): anyone who "
                                "reaches it can bind pods", listen=listen)
                nursery.start_soon(self.elector.run_while_leading, self._lead_extender)
                await nursery.start(lambda task_status: serve_asgi(
                    self.extender.app(), listen, what="extenderListen", certfile=certfile,
                    keyfile=keyfile, client_ca=self.extender_client_ca, unix_group=self.extender_group,
                    task_status=task_status))
            task_status.started()
