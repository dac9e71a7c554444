"""Gate mode: the leader places pods that carry hamid's scheduling gate.

The webhook adds the gate ``hamid.io/placement`` to every GPU pod at
creation, so kube-scheduler leaves it alone. The leader (and only while it
leads) takes each gated pod and:

1. chooses a node and GPUs with the one placement engine on the cluster view
   (:mod:`.placer`), among the nodes kube-scheduler would also take it to,
   within its namespace's GPU quota (:mod:`.quota`);
2. commits the choice on that node's ledger through the peer API (the node
   re-checks it: two leaders for a moment cannot double-book);
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

from ..errors import HamidError
from ..logs import get_logger
from ..node.identity import Owner
from ..placement import Decision
from ..request import parse_pod
from ..request.model import Defaults
from ..kube.events import announce_clamp, pod_event
from . import annotations
from .commit import commit, undo
from ..kube.informer import Informer
from .placer import ClusterView, choose
from .quota import QuotaBook

log = get_logger("control")

GATE = "hamid.io/placement"
CONDITION = "hamid.io/Placed"
ATTEMPTS = 3


def gated(pod: dict) -> bool:
    return any(g.get("name") == GATE for g in (pod.get("spec") or {}).get("schedulingGates") or ())


def placed_on(pod: dict) -> str | None:
    """The node a pod is bound to, or placed on by hamid and not bound yet."""
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    return spec.get("nodeName") or (meta.get("annotations") or {}).get(annotations.VGPU_NODE)


class GateController:
    def __init__(self, api, peer, cluster: ClusterView, *, defaults: Defaults, node_policy: str,
                 ignored: set[str], workers: int = 16, retry_s: float = 2.0) -> None:
        from kubernetes import client

        self.api = api
        self.core = client.CoreV1Api(api)
        self.peer = peer
        self.cluster = cluster
        self.defaults = defaults
        self.node_policy = node_policy
        self.ignored = ignored
        self.workers = workers
        self.retry_s = retry_s
        self.pods = Informer(api, self.core.list_pod_for_all_namespaces, name="pods")
        self.nodes = Informer(api, self.core.list_node, name="nodes")
        self.quotas = QuotaBook(api, self.pods, names=defaults.names, memory_factor=defaults.memory_factor)
        self.placed = 0  # pods placed since this controller started (metrics, bench)
        self._inflight: set[str] = set()
        self._opened: dict[str, float] = {}  # pod uid -> when its gate was removed (the cache lags behind)
        self._last_reason: dict[str, str] = {}

    # --- the loop --------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        send, receive = trio.open_memory_channel(0)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.pods.run)
            await nursery.start(self.nodes.run)
            await nursery.start(self.quotas.run)
            for _ in range(self.workers):
                nursery.start_soon(self._worker, receive.clone())
            task_status.started()
            await self.pods.synced.wait()
            await self.nodes.synced.wait()
            await self.quotas.quotas.synced.wait()
            full = True  # the first pass, and every retry_s: capacity may free without a pod event (gossip)
            last_full = time.monotonic()
            while True:
                wake = (self.pods.next_change(), self.nodes.next_change(),  # before looking: no change is missed
                        self.quotas.quotas.next_change())
                now = time.monotonic()
                self._opened = {u: t for u, t in self._opened.items() if now - t < 30}
                changed = self.pods.take_changed()
                nodes_changed = self.nodes.take_changed()
                quotas_changed = self.quotas.quotas.take_changed()
                pods = [] if changed is None else [self.pods.get(k) for k in changed]
                # a node's or a ResourceQuota's change, or a pod gone or no longer gated (it may free room or
                # quota), may let any gated pod fit
                if full or changed is None or nodes_changed is None or nodes_changed or quotas_changed is None or \
                        quotas_changed or \
                        any(p is None or not gated(p) for p in pods):
                    pods = self.pods.snapshot()
                    last_full = now
                for pod in pods:
                    uid = (pod.get("metadata") or {}).get("uid")
                    if gated(pod) and uid not in self._inflight and uid not in self._opened:
                        self._inflight.add(uid)
                        await send.send(pod)
                full = False
                with trio.move_on_at(trio.current_time() + max(0.0, self.retry_s - (time.monotonic() - last_full))):
                    await _first_of(*wake)
                    continue
                full = True

    async def _worker(self, receive) -> None:
        async for pod in receive:
            uid = pod["metadata"]["uid"]
            try:
                await self.place(pod)
            except Exception as e:  # one pod's trouble must not stop the others
                log.exception("placing a gated pod failed", pod=_name(pod), error=str(e))
            finally:
                self._inflight.discard(uid)

    # --- one pod ----------------------------------------------------------------------------

    def _pods_by_node(self) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for p in self.pods.snapshot():
            n = placed_on(p)
            if n and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                out.setdefault(n, []).append(p)
        return out

    async def place(self, pod: dict) -> bool:
        """Place one gated pod; True if it was placed."""
        meta = pod["metadata"]
        try:
            request = parse_pod(pod, self.defaults)
        except HamidError as e:  # the webhook refuses these; one created before hamid was installed may not be
            await self._unschedulable(pod, f"the pod's GPU request cannot be read: {e}")
            return False
        owner = Owner("pod", meta["uid"], name=_name(pod))
        nodes = {(n.get("metadata") or {}).get("name"): n for n in self.nodes.snapshot()}
        excluded: list[str] = []
        for _ in range(ATTEMPTS):
            members = self.cluster.members()
            # no await from here to book(): pods of one namespace placed at once cannot pass on the same quota
            choice = choose(request, pod, members, nodes, self._pods_by_node(), node_policy=self.node_policy,
                            ignored=self.ignored, exclude=excluded,
                            quota=self.quotas.of(meta.get("namespace") or "default", meta["uid"]))
            if choice.decision is None:
                from ..placement.elsewhere import hint
                from .nodefit import summarize

                # kube-scheduler's summary, then where the same GPU request has room now (the
                # nodes the pod may not use included: its selector or a taint may be what to change)
                room = hint(request, [m.view for m in members.values()])
                await self._unschedulable(pod, f"{summarize(choice.reasons, len(nodes))} GPU room: {room}.")
                return False
            self.quotas.book(meta["uid"], meta.get("namespace") or "default", choice.decision)
            try:
                done = await commit(self.peer, self.cluster, choice.peer, owner, choice.decision,
                                    request=request.to_dict(), placed_by="gate")
            except HamidError as e:  # refused by the node's ledger (a stale view), or unreachable
                self.quotas.unbook(meta["uid"])
                log.info("commit refused; choosing again", pod=owner.name, node=choice.decision.node, error=str(e))
                excluded.append(choice.decision.node)
                continue
            if not done.ours:  # an earlier placement of this pod (another leader's, or ours) holds it
                self.quotas.unbook(meta["uid"])
                log.info("pod already placed there", pod=owner.name, node=choice.decision.node)
                return False
            if await self._open_gate(pod, choice.decision):
                # the webhook lowered gpucores to 100: say so where kubectl describe shows it
                await trio.to_thread.run_sync(announce_clamp, self.core, pod)
                self._opened[meta["uid"]] = time.monotonic()
                self.placed += 1
                self._last_reason.pop(meta["uid"], None)
                log.info("placed", pod=owner.name, node=choice.decision.node,
                         gpus=[d.uuid for c in choice.decision.containers for d in c.devices])
                return True
            self.quotas.unbook(meta["uid"])
            await undo(self.peer, self.cluster, done)
            return False
        await self._unschedulable(pod, "nodes kept refusing the placement (their ledgers changed); trying again")
        return False

    async def _open_gate(self, pod: dict, decision: Decision) -> bool:
        """One update (with the pod's resourceVersion): annotations, narrowed affinity, gate removed."""
        from kubernetes.client.exceptions import ApiException

        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        current = pod
        for _ in range(5):
            if not gated(current):
                return False  # someone else opened it: ours is not the placement that counts
            new = copy.deepcopy(current)
            new["metadata"].setdefault("annotations", {}).update(annotations.allocation(decision))
            new["spec"]["schedulingGates"] = [g for g in new["spec"].get("schedulingGates") or ()
                                              if g.get("name") != GATE]
            if not new["spec"]["schedulingGates"]:
                del new["spec"]["schedulingGates"]
            new["spec"] = narrowed_spec(new["spec"], decision.node)
            try:
                await trio.to_thread.run_sync(
                    lambda: self.core.replace_namespaced_pod(name, ns, new, _request_timeout=10))
                return True
            except ApiException as e:
                if e.status == 404:
                    return False
                if e.status != 409:
                    log.warning("the placed pod could not be updated", pod=f"{ns}/{name}", status=e.status,
                                error=e.reason)
                    return False
            try:  # 409: the pod changed; read it again and retry if it is still gated and ours to open
                fresh = await trio.to_thread.run_sync(lambda: self.core.read_namespaced_pod(name, ns,
                                                                                            _request_timeout=10))
            except ApiException:
                return False
            current = self.api.sanitize_for_serialization(fresh)
            if current["metadata"]["uid"] != pod["metadata"]["uid"]:
                return False
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

        def write() -> None:
            try:
                self.core.patch_namespaced_pod_status(name, ns, {"status": {"conditions": [cond]}},
                                                      _request_timeout=10)
            except Exception as e:
                log.warning("could not set the pod's placement condition", pod=f"{ns}/{name}", error=str(e))
            pod_event(self.core, {"metadata": {"namespace": ns, "name": name, "uid": uid}}, "FailedScheduling",
                      message)

        log.info("pod stays gated", pod=f"{ns}/{name}", why=message)
        await trio.to_thread.run_sync(write)


def narrowed_spec(spec: dict[str, Any], node: str) -> dict[str, Any]:
    """``spec`` with its required node affinity narrowed to ``node``
    (:func:`hamid.control.nodefit.narrow_to_node`: ``metadata.name In [node]``
    ANDed into every term, a term added where there is none), which is all a
    gated pod's update may do (KEP-3838)."""
    import jsonpatch

    from .nodefit import narrow_to_node

    return jsonpatch.apply_patch({"spec": spec}, narrow_to_node({"spec": spec}, node))["spec"]


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
