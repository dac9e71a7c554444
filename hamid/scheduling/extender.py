"""Extender mode: kube-scheduler's HTTP extender, for clusters whose scheduler can be configured.

kube-scheduler (configured by ``contrib/kubelet/``) calls ``filter``,
``prioritize`` and ``bind`` for pods that ask for hamid's resources
(``managedResources``, ``nodeCacheCapable: true``). Wire format: kube-scheduler's
``extender/v1`` types, whose JSON keys are the Go field names.

- ``filter``: every node whose GPUs can take the pod (the placement engine on
  the cluster view) within its namespace's GPU quota (:mod:`.quota`) in
  ``NodeNames``, every other in ``FailedNodes`` with its reason. Nothing is
  booked: kube-scheduler may filter many pods before it binds any. Verdicts
  are kept per request shape (:mod:`.verdicts`) and recomputed only for nodes
  the cluster view says changed, so replicas of one workload cost one pass
  over the names kube-scheduler sent.
- ``prioritize``: 0..10 per feasible node, by the node policy (binpack: the
  fuller the node after placing, the higher).
- ``bind``: the placement on the chosen node is committed on that node's
  ledger through the peer API (re-checked there; no node-wide lock), the
  allocation is recorded on the pod, and the Binding is created; a Binding
  that fails releases the commit this call made (never one an earlier call
  made: the commit carries an attempt id, as the gate controller's do), and
  kube-scheduler retries the pod. The quota is checked again and the
  placement counted in it before the commit; a pod whose ``gpucores`` the
  webhook clamped gets its ``GPUCoresClamped`` Event once bound, as in gate
  mode. ``bind`` refuses a pod that is already
  bound, that another scheduler owns (``schedulerNames``), that asks for no
  GPU of hamid's, or a node this extender did not pass it on in ``filter``.

Who may call: with a client CA (``extenderClientCAFile``) the server is
HTTPS and completes no handshake without a certificate that CA signed
(kube-scheduler's, or a follower daemon's forwarding); only
``extenderInsecure`` serves plain HTTP, for tests on one machine.

Every daemon serves it; a daemon that does not lead forwards each call to
the leader (``leader_url``), and answers itself when no leader is known, which
is safe since every commit is re-checked by the node's ledger; namespace
quotas are the exception, only the leader counts them: a daemon that answers
itself refuses GPU pods saying so, and kube-scheduler tries again.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import httpx
import trio
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..errors import HamidError, Unreachable
from ..kube.events import announce_clamp
from ..kube.rest import AsyncKube, KubeApiError
from ..logs import get_logger
from ..node.identity import Owner
from ..placement import Decision
from ..placement.engine import fit_node
from ..request import parse_pod
from ..request.model import Defaults, Request
from ..serving import BodyTooLarge, read_body
from ..placement import hamiannotations
from .commit import commit, undo
from .placer import ClusterView, Snapshot
from .quota import NamespaceQuota, QuotaBook, QuotaUnknown
from .verdicts import Verdicts

log = get_logger("extender")

MAX_BODY = 8 * 1024 * 1024  # a NodeList of thousands of nodes when not node-cache capable
FORWARDED = "x-hamid-forwarded"
# A node whose daemon could not be reached by this leader's last commit is left out of filter
# for this long. kube-scheduler retries a failed bind with the same scores, so it picks the same node again,
# and a daemon killed outright stays "alive" in gossip until its suspicion runs out (about 8-12 s, README's
# gossip rows): without this the pod waited for gossip, or longer on a loaded machine (the chart test's
# failover: 60 s of binds to the killed leader's node). Short enough that a daemon that was only restarting
# is tried again soon. A refusal (the node's daemon does not yet see this leader) leaves the node in: it
# says nothing about the node, and leaving every node out would hold the pod for the whole time.
COMMIT_FAILED_S = 10.0
FILTERED_TTL_S = 600.0  # kube-scheduler binds within seconds of filtering; a pod filtered longer ago is re-filtered
# Node verdicts a call may compute on the event loop (20-30 us each); more go to a worker thread. Below it
# the hop costs more than the work: ~0.1 ms with an idle core, several ms when the cores are busy.
INLINE_WORK = 32
FILTERED_MAX = 65536  # pods remembered between filter and bind (bounded: one entry per pod, oldest dropped first)
# ... and node names remembered across those pods (a reference each, 8 bytes): 4 Mi names is 32 MiB. At 15,000
# nodes every pod passing everywhere, the most recent 279 filtered pods are remembered (at 5,000, 838): far more
# than kube-scheduler has between its filter and its bind at once (it binds within seconds, the binding cycles
# of the pods it has just scheduled); an older one's bind is refused and the pod filtered again. Without it a
# backlog of 65,536 pending pods at 15,000 nodes held 7.5 GiB of lists.
FILTERED_NAMES_MAX = 4 * 1024 * 1024


class Extender:
    def __init__(self, api, peer, cluster: ClusterView, *, defaults: Defaults, node_policy: str,
                 is_leader: Callable[[], bool], leader_url: Callable[[], str | None],
                 scheduler_names: tuple[str, ...] = ("default-scheduler",),
                 forward_tls: tuple[str, str, str] | None = None,
                 quotas: Callable[[], QuotaBook | None] | None = None) -> None:
        """``forward_tls``: (client certificate, key, CA) a follower uses to reach
        the leader's HTTPS extender; None with a plain-HTTP extender.
        ``quotas``: the leader's namespace quota count (None from it while this
        daemon does not lead); None: quotas are not checked (a bare extender,
        as the benchmark runs)."""
        self.api = api
        self.kube = AsyncKube.of(api) if api is not None else None
        self.peer = peer
        self.cluster = cluster
        self.defaults = defaults
        self.node_policy = node_policy
        self.is_leader = is_leader
        self.leader_url = leader_url
        self.scheduler_names = tuple(scheduler_names)
        self.quotas = quotas
        verify: Any = True
        cert = None
        if forward_tls is not None:
            import ssl

            cert = forward_tls[:2]
            # the leader's serving certificate names the Service, not the pod address gossip gives: the
            # chain is checked against the callers' CA (the chart signs both), the name is not
            verify = ssl.create_default_context(cafile=forward_tls[2])
            verify.check_hostname = False
            verify.load_cert_chain(*cert)
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(30.0), trust_env=False, verify=verify)
        self.bound = 0  # pods bound through this daemon (metrics)
        self.refused = 0  # bind calls refused before any commit (metrics)
        self.verdicts = Verdicts()  # per request shape, each node's filter verdict, updated as nodes change
        self._filtered: OrderedDict[str, tuple[float, list[str]]] = OrderedDict()  # pod uid -> nodes passed
        self._filtered_names = 0  # node names across self._filtered's lists
        self._commit_failed: dict[str, tuple[float, str]] = {}  # node -> (monotonic s, why): commit_failed

    def _quota(self, pod: dict) -> NamespaceQuota | None:
        """The pod's namespace GPU quota (None: none to check); :class:`QuotaUnknown` when it cannot be
        checked here now."""
        if self.quotas is None:
            return None
        book = self.quotas()
        if book is None:
            raise QuotaUnknown("namespace GPU quotas are counted by the leader and this daemon does not lead "
                               "(no leader answered); kube-scheduler tries again")
        meta = pod.get("metadata") or {}
        return book.of(meta.get("namespace") or "default", meta.get("uid"))

    def _request(self, pod: dict) -> Request | None:
        """The pod's GPU request, or None when it asks for no GPU (then every node will do)."""
        req = parse_pod(pod, self.defaults)
        return req if req.wants_gpu else None

    # --- the verbs (pure over the cluster view, except bind) -----------------------------

    def filter(self, args: dict[str, Any], snap: Snapshot | None = None) -> dict[str, Any]:
        pod = args.get("Pod") or {}
        by_names = args.get("NodeNames") is not None
        names = list(args.get("NodeNames") or []) if by_names else [
            (n.get("metadata") or {}).get("name") for n in ((args.get("Nodes") or {}).get("items") or [])]
        try:
            request = self._request(pod)
        except HamidError as e:
            return {"Error": f"hamid: {e}"}
        failed: dict[str, str] = {}
        if request is None:
            ok = names
        else:
            try:
                quota = self._quota(pod)
            except QuotaUnknown as e:
                return {"Error": f"hamid: {e}"}
            snap = self.cluster.snapshot() if snap is None else snap
            ok, failed = self.verdicts.split(request, snap, names)
            if quota is not None and ok:  # what each node would give the pod, against the quota
                ok, over = self.verdicts.within(request, snap, ok, quota.check_usage)
                failed.update(over)
        uid = (pod.get("metadata") or {}).get("uid")
        if request is not None and self._commit_failed:
            now = time.monotonic()
            self._commit_failed = {n: v for n, v in self._commit_failed.items() if now - v[0] < COMMIT_FAILED_S}
            for n in [n for n in ok if n in self._commit_failed]:
                t, why = self._commit_failed[n]
                failed[n] = (f"hamid: the daemon on {n} could not be reached for the last placement {now - t:.0f} s ago "
                             f"({why}); left out for {COMMIT_FAILED_S - (now - t):.0f} s more")
            ok = [n for n in ok if n not in self._commit_failed]
        if request is not None and isinstance(uid, str) and uid:
            self._remember(uid, ok)
        out: dict[str, Any] = {"FailedNodes": failed, "FailedAndUnresolvableNodes": {}, "Error": ""}
        if by_names:
            out["NodeNames"] = ok
        else:
            keep = set(ok)
            out["Nodes"] = {**(args.get("Nodes") or {}),
                            "items": [n for n in (args.get("Nodes") or {}).get("items") or []
                                      if (n.get("metadata") or {}).get("name") in keep]}
        return out

    def prioritize(self, args: dict[str, Any], snap: Snapshot | None = None) -> list[dict[str, Any]]:
        pod = args.get("Pod") or {}
        names = list(args.get("NodeNames") or []) or [
            (n.get("metadata") or {}).get("name") for n in ((args.get("Nodes") or {}).get("items") or [])]
        try:
            request = self._request(pod)
        except HamidError:
            request = None
        if request is None:
            return [{"Host": name, "Score": 0} for name in names]
        snap = self.cluster.snapshot() if snap is None else snap
        ok = set(self.verdicts.split(request, snap, names)[0])
        binpack = self.node_policy == "binpack"
        out = []
        for name in names:
            score = 0
            if name in ok:
                used = snap.members[name].view.mem_used_fraction
                score = round(10 * (used if binpack else 1 - used))
            out.append({"Host": name, "Score": score})
        return out

    def commit_failed(self, node: str, why: str) -> None:
        """``node``'s daemon could not be reached for a commit: filter leaves it out for COMMIT_FAILED_S."""
        self._commit_failed[node] = (time.monotonic(), why[:200])
        log.info("node left out of placements for a while", node=node, seconds=COMMIT_FAILED_S, why=why[:200])

    def _remember(self, uid: str, nodes: list[str]) -> None:
        # the list itself (a reference, O(1) per filter); bind, once per pod, searches it
        self._forget(uid)
        self._filtered[uid] = (time.monotonic(), nodes)
        self._filtered_names += len(nodes)
        while len(self._filtered) > FILTERED_MAX or self._filtered_names > FILTERED_NAMES_MAX:
            self._filtered_names -= len(self._filtered.popitem(last=False)[1][1])

    def _forget(self, uid: str) -> None:
        got = self._filtered.pop(uid, None)
        if got is not None:
            self._filtered_names -= len(got[1])

    def _filtered_onto(self, uid: str, node: str) -> bool:
        got = self._filtered.get(uid)
        return got is not None and time.monotonic() - got[0] <= FILTERED_TTL_S and node in got[1]

    def _refuse(self, message: str) -> dict[str, Any]:
        self.refused += 1
        log.info("bind refused", reason=message)
        return {"Error": f"hamid: {message}"}

    async def bind(self, args: dict[str, Any]) -> dict[str, Any]:
        ns, name, uid, node = args.get("PodNamespace"), args.get("PodName"), args.get("PodUID"), args.get("Node")
        if not all(isinstance(x, str) and x for x in (ns, name, uid, node)):
            return self._refuse("PodName, PodNamespace, PodUID and Node are required")
        if self.kube is None:
            return {"Error": f"hamid: cannot read pod {ns}/{name}: this daemon has no API server"}
        try:
            pod = await self.kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
        except KubeApiError as e:
            return {"Error": f"hamid: cannot read pod {ns}/{name}: {e}"}
        if pod["metadata"]["uid"] != uid:
            return self._refuse(f"pod {ns}/{name} is now another pod (uid {pod['metadata']['uid']})")
        spec = pod.get("spec") or {}
        if spec.get("nodeName"):
            return self._refuse(f"pod {ns}/{name} is already bound to node {spec['nodeName']}")
        sched = spec.get("schedulerName") or "default-scheduler"
        if sched not in self.scheduler_names:
            return self._refuse(f"pod {ns}/{name} belongs to scheduler {sched!r}, not to this extender's "
                                f"({', '.join(self.scheduler_names)}: extenderSchedulerNames)")
        try:
            request = self._request(pod)
        except HamidError as e:
            return self._refuse(str(e))
        if request is None:
            return self._refuse(f"pod {ns}/{name} asks for no GPU of hamid's: kube-scheduler binds it itself")
        if not self._filtered_onto(uid, node):
            return self._refuse(f"pod {ns}/{name} was not filtered onto node {node} by this extender "
                                f"(in the last {FILTERED_TTL_S:.0f} s); kube-scheduler filters it again")
        m = self.cluster.members().get(node)
        if m is None or not m.peer:
            return {"Error": f"hamid: no hamid daemon reachable on node {node}"}
        got = fit_node(request, m.view)
        if not isinstance(got, Decision):
            return {"Error": f"hamid: the pod no longer fits on {node}: " + "; ".join(got)}
        # no await from the quota check to book(): binds of one namespace cannot pass on the same quota
        try:
            quota = self._quota(pod)
        except QuotaUnknown as e:
            return {"Error": f"hamid: {e}"}
        over = quota.check(got) if quota is not None else None
        if over is not None:
            return self._refuse(f"pod {ns}/{name} on {node}: {over}")
        book = self.quotas() if self.quotas is not None else None
        if book is not None:
            book.book(uid, ns, got)
        owner = Owner("pod", uid, name=f"{ns}/{name}")
        try:
            done = await commit(self.peer, self.cluster, m.peer, owner, got, request=request.to_dict(),
                                placed_by="extender")
        except HamidError as e:
            if book is not None:
                book.unbook(uid)
            if isinstance(e, Unreachable):  # the node's daemon, not this leader's standing ("not the leader")
                self.commit_failed(node, str(e))
            return {"Error": f"hamid: node {node} refused the placement: {e}"}
        try:  # the allocation the node holds (an earlier call's, when there is one) is what the pod records
            await self._record_and_bind(self.kube, ns, name, uid, node, done.decision)
        except Exception as e:
            if book is not None and done.ours:
                book.unbook(uid)
            await undo(self.peer, self.cluster, done)  # only this call's commit: never a running pod's
            return {"Error": f"hamid: binding {ns}/{name} to {node} failed: {e}"}
        self._forget(uid)
        # the webhook lowered gpucores to 100: say so where kubectl describe shows it, as gate mode does
        await announce_clamp(self.kube, pod)
        self.bound += 1
        log.info("bound", pod=f"{ns}/{name}", node=node)
        return {"Error": ""}

    @staticmethod
    async def _record_and_bind(kube: AsyncKube, ns: str, name: str, uid: str, node: str,
                               decision: Decision | None) -> None:
        pod = f"/api/v1/namespaces/{ns}/pods/{name}"
        if decision is not None:
            await kube.request("PATCH", pod, {"metadata": {"annotations": hamiannotations.allocation(decision)}},
                               content_type="application/merge-patch+json")
        await kube.request("POST", f"{pod}/binding",
                           {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": ns, "uid": uid},
                            "target": {"apiVersion": "v1", "kind": "Node", "name": node}})

    def _work(self, args: dict[str, Any], snap: Snapshot) -> int:
        """Node verdicts the engine must compute to answer ``args`` (0 for a pod that asks for no GPU
        or cannot be read: those are answered without the engine)."""
        pod = (args.get("Pod") or {}) if isinstance(args, dict) else {}
        try:
            request = self._request(pod)
            quota = self._quota(pod) if request is not None else None
        except HamidError:  # QuotaUnknown included: answered at once
            return 0
        return 0 if request is None else self.verdicts.work(request, snap, usage=quota is not None)

    # --- HTTP ---------------------------------------------------------------------------------

    async def _forward(self, verb: str, body: bytes, forwarded: bool):
        if self.is_leader() or forwarded:  # a forwarded call is never forwarded again: no loops
            return None
        url = self.leader_url()
        if not url:
            return None  # no leader known: answer here (every commit is re-checked by its node)
        try:
            r = await self._http.post(f"{url}/{verb}", content=body,
                                      headers={"content-type": "application/json", FORWARDED: "1"})
            return JSONResponse(r.json(), status_code=r.status_code)
        except (httpx.HTTPError, ValueError) as e:
            log.warning("could not forward to the leader; answering here", verb=verb, leader=url, error=str(e))
            return None

    def app(self) -> Starlette:
        import json

        async def handle(req: HttpRequest):
            verb = req.path_params["verb"]
            if verb not in ("filter", "prioritize", "bind"):
                return JSONResponse({"Error": f"unknown verb {verb!r}; accepted: filter, prioritize, bind"}, 404)
            try:
                body = await read_body(req, MAX_BODY)
            except BodyTooLarge as e:
                return JSONResponse({"Error": str(e)}, 413)
            fwd = await self._forward(verb, body, req.headers.get(FORWARDED) is not None)
            if fwd is not None:
                return fwd
            try:
                args = json.loads(body)
            except ValueError:
                return JSONResponse({"Error": "request body is not JSON"}, 400)
            if verb in ("filter", "prioritize"):
                snap = self.cluster.snapshot()  # here, in the trio thread (O(changes))
                fn = self.filter if verb == "filter" else self.prioritize
                if self._work(args, snap) <= INLINE_WORK:  # a few verdicts: cheaper than the thread hop
                    return JSONResponse(fn(args, snap))
                return JSONResponse(await trio.to_thread.run_sync(fn, args, snap))
            return JSONResponse(await self.bind(args))

        return Starlette(routes=[Route("/{verb}", handle, methods=["POST"])])
