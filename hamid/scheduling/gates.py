"""Gate mode: the leader places pods that carry hamid's scheduling gate.

The webhook adds the gate ``hamid.io/placement`` to every GPU pod at
creation, so kube-scheduler leaves it alone. The leader (and only while it
leads) takes each gated pod and:

1. chooses a node and GPUs with the one placement engine on the cluster view
   (:mod:`.placer`), among the nodes kube-scheduler would also take it to,
   within its namespace's GPU quota (:mod:`.quota`);
2. commits the choice on that node's ledger through the peer API (the node
   re-checks it: two leaders for a moment cannot double-book), the pass's
   commits for one node in one request (:mod:`.batches`);
3. in one update carrying the pod's ``resourceVersion``: writes HAMi's
   allocation annotations, narrows the pod's required node affinity to that
   node and removes the gate; kube-scheduler then binds it as any pod.

A commit whose pod update fails (the pod changed, was deleted) is released.
When no node fits, the pod stays gated with an Event and a condition
(``hamid.io/Placed`` False) giving the reasons per node in kube-scheduler's
style, and is tried again whenever pods, nodes or the cluster's capacity
change.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import trio

from ..errors import HamidError, Unreachable
from ..logs import get_logger
from ..node.identity import Owner
from ..placement import Decision
from ..request import parse_pod
from ..request.model import Defaults
from ..kube.events import announce_clamp, pod_event
from ..placement import hamiannotations
from .batches import NodeBatches
from .commit import commit, undo
from ..kube.informer import Informer, key_of
from ..kube.rest import AsyncKube, KubeApiError
from ..request.kube import CORES_CLAMPED, GATE
from .placer import ClusterView, choose
from .kubefit import NodeLoad
from .quota import QuotaBook
from .ranking import RankedView, choose_ranked

log = get_logger("control")

CONDITION = "hamid.io/Placed"
ATTEMPTS = 3


def gated(pod: dict) -> bool:
    return any(g.get("name") == GATE for g in (pod.get("spec") or {}).get("schedulingGates") or ())


def placed_on(pod: dict) -> str | None:
    """The node a pod is bound to, or placed on by hamid and not bound yet."""
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    return spec.get("nodeName") or (meta.get("annotations") or {}).get(hamiannotations.VGPU_NODE)


class PodsByNode:
    """The pods on each node as kube-scheduler counts them (bound there, or placed there by hamid and
    not bound yet; not Succeeded or Failed) and their :class:`~.kubefit.NodeLoad`, kept from the pod
    informer's changed keys (O(changes) per pass, not O(pods) per placement), with this leader's
    placements whose pod update the informer has not shown yet counted too (so pods placed in one
    pass count against the node's resources for the next)."""

    def __init__(self) -> None:
        self._at: dict[str, tuple[str, dict]] = {}  # pod key -> (node, the pod as counted)
        self._by: dict[str, dict[str, dict]] = {}  # node -> pod key -> pod
        self._load: dict[str, NodeLoad] = {}
        self._placing: set[str] = set()  # keys counted from this leader's placement, not the informer yet

    def rebuild(self, pods: list[dict]) -> None:
        placing = {k: self._at[k] for k in self._placing if k in self._at}
        self._at, self._by, self._load, self._placing = {}, {}, {}, set()
        for p in pods:
            self.update(key_of(p), p)
        for k, (n, p) in placing.items():
            if k not in self._at:
                self.placing(k, n, p)

    def update(self, key: str, pod: dict | None) -> None:
        """The informer's pod of ``key`` (None: gone)."""
        n = placed_on(pod) if pod is not None else None
        if n and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            self._placing.discard(key)
            self._count(key, n, pod)
        elif key not in self._placing:  # a placement of ours in flight stays counted until the informer shows it
            self._uncount(key)

    def placing(self, key: str, node: str, pod: dict) -> None:
        """A placement of this leader's, counted on ``node`` until the informer shows it (or :meth:`unplace`)."""
        self._placing.add(key)
        self._count(key, node, pod)

    def unplace(self, key: str) -> None:
        if key in self._placing:
            self._placing.discard(key)
            self._uncount(key)

    def _count(self, key: str, node: str, pod: dict) -> None:
        self._uncount(key)
        self._at[key] = (node, pod)
        self._by.setdefault(node, {})[key] = pod
        load = self._load.get(node)
        if load is None:
            load = self._load[node] = NodeLoad()
        load.add(pod)

    def _uncount(self, key: str) -> None:
        held = self._at.pop(key, None)
        if held is not None:
            node, pod = held
            del self._by[node][key]
            self._load[node].add(pod, -1)

    def get(self, node: str) -> list[dict]:
        return list((self._by.get(node) or {}).values())

    def load(self, node: str, pod: dict) -> NodeLoad:
        """The load ``pod`` is judged against on ``node`` (``pod`` itself left out)."""
        base = self._load.get(node) or NodeLoad()
        me = (self._by.get(node) or {}).get(key_of(pod))
        return base if me is None else base.plus((), [me])

    def as_dict(self) -> dict[str, list[dict]]:
        return {n: list(at.values()) for n, at in self._by.items()}


def refusal_reason(e: HamidError) -> str:
    """What a node's refusal of a commit says happened, as the pod's reason shows it: its ledger
    changed, it does not take commits from this daemon (a leader change it has not seen yet), or
    no answer. Read off the peer client's errors by what they carry (a face never imports
    another): ``reasons`` (the ledger's), ``kind`` (the peer API's error kind)."""
    reasons = getattr(e, "reasons", None)
    if reasons is not None:
        detail = "; ".join(list(reasons)[:3]) or str(e)
        return f"the node's ledger refused the placement moments ago (its GPUs changed since the view): {detail}"
    if getattr(e, "kind", None) == "forbidden":
        return ("the node did not take the commit from this daemon: it does not see it as the leader yet "
                f"(a leader change settling): {e}")
    if isinstance(e, Unreachable):
        return f"the node's daemon did not answer: {e}"
    return f"the node refused the commit: {e}"


class GateController:
    def __init__(self, api, peer, cluster: ClusterView, *, defaults: Defaults, node_policy: str,
                 ignored: set[str], commits: int = 32, per_node: int = 8, updates: int = 8,
                 retry_s: float = 2.0, kube: AsyncKube | None = None) -> None:
        """``commits``: peer requests in flight at once (32: a commit waits on a node's ledger, and a
        node starved of CPU answers slowly, so commits to many nodes are kept going); the commits
        for one node go together, as one request in flight per node (:mod:`.batches`);
        ``per_node``: single commits in flight to one node that lacks the batch verb (8: binpack
        sends a burst's pods to one node after another, and a commit is mostly waiting on that
        node; its ledger serialises them itself); ``updates``: pod updates in flight
        at once (8: the API server answers in a millisecond or two when it is not starved, and
        httpcore's pool looks at every connection it holds for each request, so more connections cost
        the leader CPU per pod without placing faster); ``kube``: the async API client (made from ``api`` when not given)."""
        self.api = api
        self.kube = kube or AsyncKube.of(api)
        self.peer = peer
        self.cluster = cluster
        self.defaults = defaults
        self.node_policy = node_policy
        self.ignored = ignored
        self.commits = commits
        self.per_node = per_node
        self._batches: NodeBatches | None = None  # made with the commits-in-flight limiter, in run()
        self.updates = updates
        self._commits_in_flight: trio.CapacityLimiter | None = None
        self._updates_in_flight: trio.CapacityLimiter | None = None
        self.retry_s = retry_s
        self.pods = Informer(self.kube, "/api/v1/pods", name="pods")
        self.nodes = Informer(self.kube, "/api/v1/nodes", name="nodes")
        self.quotas = QuotaBook(api, self.pods, names=defaults.names, memory_factor=defaults.memory_factor,
                                kube=self.kube)
        self.placed = 0  # pods placed since this controller started (metrics, bench)
        self.passes = 0  # placement passes run (tests: pods that arrive together share one)
        self._inflight: set[str] = set()
        self._opened: dict[str, float] = {}  # pod uid -> when its gate was removed (the cache lags behind)
        self._last_reason: dict[str, str] = {}
        # pod uid -> (nodes whose ledgers refused its commit, when last): left out of its next choices,
        # for retry_s (a stale view is fresh again by then; a node that did not see the leader sees it)
        self._refused: dict[str, tuple[dict[str, str], float]] = {}  # pod uid -> (node -> what it said, when)
        self._again: set[str] = set()  # pod keys to look at in the next pass (a refused commit)
        self._wake = trio.Event()
        self._ranked = RankedView()
        self._on_node = PodsByNode()

    # --- the loop --------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._commits_in_flight = trio.CapacityLimiter(self.commits)
        self._updates_in_flight = trio.CapacityLimiter(self.updates)
        self._batches = NodeBatches(self.peer, in_flight=self._commits_in_flight, singles=self.per_node)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.pods.run)
                await nursery.start(self.nodes.run)
                await nursery.start(self.quotas.run)
                task_status.started()
                await self.pods.synced.wait()
                await self.nodes.synced.wait()
                await self.quotas.quotas.synced.wait()
                await self._loop(nursery)
        finally:
            with trio.CancelScope(shield=True):
                await self.kube.aclose()

    async def _loop(self, nursery) -> None:
        full = True  # the first pass, and every retry_s: capacity may free without a pod event (gossip)
        last_full = time.monotonic()
        while True:
            wake = (self.pods.next_change(), self.nodes.next_change(),  # before looking: no change is missed
                    self.quotas.quotas.next_change(), self._wake)
            now = time.monotonic()
            self._opened = {u: t for u, t in self._opened.items() if now - t < 30}
            changed = self.pods.take_changed()
            nodes_changed = self.nodes.take_changed()
            quotas_changed = self.quotas.quotas.take_changed()
            if changed is None:
                self._on_node.rebuild(self.pods.snapshot())
                pods = None
            else:
                changed |= self._again
                pods = []
                for k in changed:
                    p = self.pods.get(k)
                    self._on_node.update(k, p)
                    pods.append(p)
            self._again = set()
            # a node's or a ResourceQuota's change, or a pod gone or no longer gated (it may free room or
            # quota; not one whose gate this leader opened: that took room), may let any gated pod fit
            if full or pods is None or nodes_changed is None or nodes_changed or quotas_changed is None or \
                    quotas_changed or any(p is None or (not gated(p) and _uid(p) not in self._opened) for p in pods):
                pods = self.pods.snapshot()
                last_full = now
            batch = []
            for pod in pods:
                uid = (pod.get("metadata") or {}).get("uid")
                if gated(pod) and uid not in self._inflight and uid not in self._opened:
                    self._inflight.add(uid)
                    batch.append(pod)
            if batch:
                self._pass(batch, nursery)
            full = False
            with trio.move_on_at(trio.current_time() + max(0.0, self.retry_s - (time.monotonic() - last_full))):
                await _first_of(*wake)
                continue
            full = True

    def _pass(self, batch: list[dict], nursery) -> None:
        """Place the gated pods that arrived together: one snapshot of the cluster view, decisions
        in sequence against it (each booked in the view and the quota before the next is made: no
        await in between), then every commit and pod update at once (as many in flight as ``commits`` and ``updates`` allow)."""
        self.passes += 1
        nodes = {(n.get("metadata") or {}).get("name"): n for n in self.nodes.snapshot()}
        for pod in batch:
            uid = pod["metadata"]["uid"]
            try:
                got = self._decide(pod, nodes)
            except Exception as e:  # one pod's trouble must not stop the others
                log.exception("placing a gated pod failed", pod=_name(pod), error=str(e))
                self._inflight.discard(uid)
                continue
            if isinstance(got, str):  # stays gated: say why (an API write, off this pass)
                nursery.start_soon(self._stays_gated, pod, got)
            else:
                nursery.start_soon(self._finish, pod, got)

    def _decide(self, pod: dict, nodes: dict[str, dict]):
        """The pod's (request, choice), booked in the cluster view and its namespace's quota; or the
        message saying why it stays gated."""
        meta = pod["metadata"]
        try:
            request = parse_pod(pod, self.defaults)
        except HamidError as e:  # the webhook refuses these; one created before hamid was installed may not be
            return f"the pod's GPU request cannot be read: {e}"
        ns = meta.get("namespace") or "default"
        quota = self.quotas.of(ns, meta["uid"])
        excluded, at = self._refused.get(meta["uid"], ({}, 0.0))
        if excluded and time.monotonic() - at >= self.retry_s:
            del self._refused[meta["uid"]]
            excluded = {}
        snap = self.cluster.snapshot()
        choice = choose_ranked(request, pod, snap, self._ranked, nodes, self._on_node.load, node_policy=self.node_policy,
                               ignored=self.ignored, exclude=excluded, quota=quota)
        if choice is None:  # nothing fits: every node's reasons, the slow way (only for a pod that stays gated)
            choice = choose(request, pod, snap.members, nodes, self._on_node.as_dict(),
                            node_policy=self.node_policy, ignored=self.ignored, exclude=excluded, quota=quota)
        if choice.decision is None:
            from ..placement.elsewhere import hint
            from .fitsummary import summarize

            # kube-scheduler's summary, then where the same GPU request has room now (the
            # nodes the pod may not use included: its selector or a taint may be what to change;
            # not those that just refused its commit: their reason says why, "fits now" would not)
            room = hint(request, [m.view for n, m in snap.members.items() if n not in excluded])
            return f"{summarize(choice.reasons, len(nodes))} GPU room: {room}."
        self.quotas.book(meta["uid"], ns, choice.decision)
        self.cluster.committed(choice.decision)  # at once: the next decision of this pass chooses around it
        placed = copy.copy(pod)
        placed["metadata"] = dict(meta, annotations={**(meta.get("annotations") or {}),
                                                     hamiannotations.VGPU_NODE: choice.decision.node})
        self._on_node.placing(key_of(pod), choice.decision.node, placed)
        return request, choice

    async def _stays_gated(self, pod: dict, message: str) -> None:
        try:
            await self._unschedulable(pod, message)
        finally:
            self._inflight.discard(pod["metadata"]["uid"])

    async def _finish(self, pod: dict, decided) -> None:
        """Commit a decision on its node and open the pod's gate; undo what failed."""
        request, choice = decided
        meta = pod["metadata"]
        uid, key = meta["uid"], key_of(pod)
        owner = Owner("pod", uid, name=_name(pod))
        decision = choice.decision
        placed = False
        try:
            if self._commits_in_flight is None:  # place() outside run()
                self._commits_in_flight, self._updates_in_flight = trio.CapacityLimiter(1), trio.CapacityLimiter(1)
            try:
                if self._batches is None:
                    self._batches = NodeBatches(self.peer, in_flight=self._commits_in_flight, singles=self.per_node)
                # no await before the commit is queued: the pass's commits for one node go in one request
                done = await commit(self.peer, self.cluster, choice.peer, owner, decision,
                                    request=request.to_dict(), placed_by="gate", booked=True,
                                    send=self._batches.commit)
            except HamidError as e:  # refused by the node's ledger (a stale view), not taken from us, or unreachable
                why = refusal_reason(e)
                log.info("commit refused; choosing again", pod=owner.name, node=decision.node, reason=why,
                         error=str(e))
                refused = {**self._refused.get(uid, ({}, 0.0))[0], decision.node: why}
                self._refused[uid] = (refused, time.monotonic())
                if len(refused) >= ATTEMPTS:
                    del self._refused[uid]
                    said = "; ".join(f"{n}: {w}" for n, w in refused.items())
                    await self._unschedulable(pod, f"{len(refused)} nodes refused the placement ({said}); "
                                                   "trying again")
                else:
                    self._again.add(key)
                    self._wake.set()
                    self._wake = trio.Event()
                return
            if not done.ours:  # an earlier placement of this pod (another leader's, or ours) holds it:
                # the pod still gated, that is where it goes (never undone here: it is not ours)
                log.info("pod already placed there; opening its gate on that placement", pod=owner.name,
                         node=done.decision.node)
                self.quotas.unbook(uid)  # the pod's own annotations count it once opened
                if await self._open_gate(pod, done.decision):
                    placed = True
                    self._opened[uid] = time.monotonic()
                    self.placed += 1
                    self._refused.pop(uid, None)
                return
            if await self._open_gate(pod, decision):
                placed = True
                self._opened[uid] = time.monotonic()
                self.placed += 1
                self._last_reason.pop(uid, None)
                self._refused.pop(uid, None)
                log.info("placed", pod=owner.name, node=decision.node,
                         gpus=[d.uuid for c in decision.containers for d in c.devices])
            else:
                await undo(self.peer, self.cluster, done)
            if placed and ((meta.get("annotations") or {}).get(CORES_CLAMPED)):
                # the webhook lowered gpucores to 100: say so where kubectl describe shows it
                await announce_clamp(self.kube, pod)
        except Exception as e:  # one pod's trouble must not stop the others
            log.exception("placing a gated pod failed", pod=_name(pod), error=str(e))
        finally:
            if not placed:
                self.quotas.unbook(uid)
                self._on_node.unplace(key)
            self._inflight.discard(uid)

    async def place(self, pod: dict) -> bool:
        """Place one gated pod now, in a pass of its own; True if it was placed."""
        nodes = {(n.get("metadata") or {}).get("name"): n for n in self.nodes.snapshot()}
        uid = pod["metadata"]["uid"]
        self._inflight.add(uid)
        try:
            got = self._decide(pod, nodes)
        except BaseException:
            self._inflight.discard(uid)
            raise
        if isinstance(got, str):
            await self._stays_gated(pod, got)
            return False
        before = self.placed
        await self._finish(pod, got)
        return self.placed > before

    async def _open_gate(self, pod: dict, decision: Decision) -> bool:
        """One update (with the pod's resourceVersion): annotations, narrowed affinity, gate removed."""
        async with self._updates_in_flight:
            return await self._opening(pod, decision)

    async def _opening(self, pod: dict, decision: Decision) -> bool:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        path = f"/api/v1/namespaces/{ns}/pods/{name}"
        current = pod
        for _ in range(5):
            if not gated(current):
                return False  # someone else opened it: ours is not the placement that counts
            new = copy.deepcopy(current)
            new["metadata"].setdefault("annotations", {}).update(hamiannotations.allocation(decision))
            new["spec"]["schedulingGates"] = [g for g in new["spec"].get("schedulingGates") or ()
                                              if g.get("name") != GATE]
            if not new["spec"]["schedulingGates"]:
                del new["spec"]["schedulingGates"]
            new["spec"] = narrowed_spec(new["spec"], decision.node)
            try:
                await self.kube.request("PUT", path, new)
                return True
            except KubeApiError as e:
                if e.status == 404:
                    return False
                if e.status != 409:
                    log.warning("the placed pod could not be updated", pod=f"{ns}/{name}", status=e.status,
                                error=str(e))
                    return False
            try:  # 409: the pod changed; read it again and retry if it is still gated and ours to open
                current = await self.kube.request("GET", path)
            except KubeApiError:
                return False
            if current["metadata"]["uid"] != pod["metadata"]["uid"]:
                return False
            if not gated(current) and _carries(current, decision):
                return True  # our own update, applied before a dropped answer (the PUT was asked again)
        return False

    async def _unschedulable(self, pod: dict, message: str) -> None:
        """The condition and an Event saying why the pod stays gated (only when the reason changes)."""
        uid = pod["metadata"]["uid"]
        if self._last_reason.get(uid) == message:
            return
        self._last_reason[uid] = message
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cond = {"type": CONDITION, "status": "False", "reason": "Unschedulable", "message": message,
                "lastTransitionTime": now, "lastProbeTime": None}

        log.info("pod stays gated", pod=f"{ns}/{name}", why=message)
        try:  # a strategic merge: the conditions list merges by type, the pod's others are kept
            await self.kube.request("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status",
                                    {"status": {"conditions": [cond]}},
                                    content_type="application/strategic-merge-patch+json")
        except KubeApiError as e:
            log.warning("could not set the pod's placement condition", pod=f"{ns}/{name}", error=str(e))
        await pod_event(self.kube, {"metadata": {"namespace": ns, "name": name, "uid": uid}}, "FailedScheduling",
                        message)


def narrowed_spec(spec: dict[str, Any], node: str) -> dict[str, Any]:
    """``spec`` with its required node affinity narrowed to ``node``
    (:func:`hamid.scheduling.narrow.narrow_to_node`: ``metadata.name In [node]``
    ANDed into every term, a term added where there is none), which is all a
    gated pod's update may do (KEP-3838)."""
    import jsonpatch

    from .narrow import narrow_to_node

    return jsonpatch.apply_patch({"spec": spec}, narrow_to_node({"spec": spec}, node))["spec"]


def _carries(pod: dict, decision: Decision) -> bool:
    """The pod's annotations hold exactly ``decision``'s allocation."""
    have = (pod.get("metadata") or {}).get("annotations") or {}
    return all(have.get(k) == v for k, v in hamiannotations.allocation(decision).items())


def _uid(pod: dict) -> str | None:
    return (pod.get("metadata") or {}).get("uid")


def _name(pod: dict) -> str:
    m = pod.get("metadata") or {}
    return f"{m.get('namespace')}/{m.get('name')}"


async def _first_of(*events: trio.Event) -> None:
    """Return once any of ``events`` is set."""
    async with trio.open_nursery() as nursery:
        for ev in events:
            async def wait(ev=ev):
                await ev.wait()
                nursery.cancel_scope.cancel()
            nursery.start_soon(wait)
