"""Extender mode: kube-scheduler's HTTP extender, for clusters whose scheduler can be configured.

kube-scheduler (configured by ``contrib/kubelet/``) calls ``filter``,
``prioritize`` and ``bind`` for pods that ask for hamid's resources
(``managedResources``, ``nodeCacheCapable: true``). Wire format: kube-scheduler's
``extender/v1`` types, whose JSON keys are the Go field names.

- ``filter``: every node whose GPUs can take the pod (the placement engine on
  the cluster view) in ``NodeNames``, every other in ``FailedNodes`` with its
  reason. Nothing is booked: kube-scheduler may filter many pods before it
  binds any.
- ``prioritize``: 0..10 per feasible node, by the node policy (binpack: the
  fuller the node after placing, the higher).
- ``bind``: the placement on the chosen node is committed on that node's
  ledger through the peer API (re-checked there; no node-wide lock), the
  allocation is recorded on the pod, and the Binding is created; a Binding
  that fails releases the commit, and kube-scheduler retries the pod.

Every daemon serves it; a daemon that does not lead forwards each call to
the leader (``leader_url``), and answers itself when no leader is known, which
is safe since every commit is re-checked by the node's ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import trio
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..errors import HamidError
from ..logs import get_logger
from ..node.identity import Owner
from ..placement import Decision
from ..placement.engine import feasible, fit_node
from ..request import parse_pod
from ..request.model import Defaults, Request
from . import annotations
from .placer import ClusterView

log = get_logger("extender")

MAX_BODY = 8 * 1024 * 1024
FORWARDED = "x-hamid-forwarded"  # a NodeList of thousands of nodes when not node-cache capable


class Extender:
    def __init__(self, api, peer, cluster: ClusterView, *, defaults: Defaults, node_policy: str,
                 is_leader: Callable[[], bool], leader_url: Callable[[], str | None]) -> None:
        from kubernetes import client

        self.api = api
        self.core = client.CoreV1Api(api) if api is not None else None
        self.peer = peer
        self.cluster = cluster
        self.defaults = defaults
        self.node_policy = node_policy
        self.is_leader = is_leader
        self.leader_url = leader_url
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(30.0), trust_env=False)
        self.bound = 0  # pods bound through this daemon (metrics)

    def _request(self, pod: dict) -> Request | None:
        """The pod's GPU request, or None when it asks for no GPU (then every node will do)."""
        req = parse_pod(pod, self.defaults)
        return req if req.wants_gpu else None

    # --- the verbs (pure over the cluster view, except bind) -----------------------------

    def filter(self, args: dict[str, Any], members: dict | None = None) -> dict[str, Any]:
        pod = args.get("Pod") or {}
        by_names = args.get("NodeNames") is not None
        names = list(args.get("NodeNames") or []) if by_names else [
            (n.get("metadata") or {}).get("name") for n in ((args.get("Nodes") or {}).get("items") or [])]
        try:
            request = self._request(pod)
        except HamidError as e:
            return {"Error": f"hamid: {e}"}
        ok, failed = [], {}
        if request is None:
            ok = names
        else:
            members = self.cluster.members() if members is None else members
            for name in names:
                m = members.get(name)
                if m is None:
                    failed[name] = "hamid: no hamid daemon publishes this node's GPUs"
                    continue
                why = feasible(request, m.view)
                if not why:
                    ok.append(name)
                else:
                    failed[name] = "hamid: " + "; ".join(why)
        out: dict[str, Any] = {"FailedNodes": failed, "FailedAndUnresolvableNodes": {}, "Error": ""}
        if by_names:
            out["NodeNames"] = ok
        else:
            keep = set(ok)
            out["Nodes"] = {**(args.get("Nodes") or {}),
                            "items": [n for n in (args.get("Nodes") or {}).get("items") or []
                                      if (n.get("metadata") or {}).get("name") in keep]}
        return out

    def prioritize(self, args: dict[str, Any], members: dict | None = None) -> list[dict[str, Any]]:
        pod = args.get("Pod") or {}
        names = list(args.get("NodeNames") or []) or [
            (n.get("metadata") or {}).get("name") for n in ((args.get("Nodes") or {}).get("items") or [])]
        try:
            request = self._request(pod)
        except HamidError:
            request = None
        if members is None:
            members = self.cluster.members() if request is not None else {}
        out = []
        for name in names:
            score = 0
            m = members.get(name)
            if request is not None and m is not None and not feasible(request, m.view):
                total = sum(g.mem_total for g in m.view.gpus) or 1
                used = sum(g.mem_used for g in m.view.gpus) / total
                score = round(10 * (used if self.node_policy == "binpack" else 1 - used))
            out.append({"Host": name, "Score": score})
        return out

    async def bind(self, args: dict[str, Any]) -> dict[str, Any]:
        ns, name, uid, node = args.get("PodNamespace"), args.get("PodName"), args.get("PodUID"), args.get("Node")
        if not all(isinstance(x, str) and x for x in (ns, name, uid, node)):
            return {"Error": "hamid: PodName, PodNamespace, PodUID and Node are required"}
        try:
            pod = self.api.sanitize_for_serialization(
                await trio.to_thread.run_sync(lambda: self.core.read_namespaced_pod(name, ns, _request_timeout=10)))
        except Exception as e:
            return {"Error": f"hamid: cannot read pod {ns}/{name}: {e}"}
        if pod["metadata"]["uid"] != uid:
            return {"Error": f"hamid: pod {ns}/{name} is now another pod (uid {pod['metadata']['uid']})"}
        try:
            request = self._request(pod)
        except HamidError as e:
            return {"Error": f"hamid: {e}"}
        placed = None
        if request is not None:
            members = self.cluster.members()
            m = members.get(node)
            if m is None or not m.peer:
                return {"Error": f"hamid: no hamid daemon reachable on node {node}"}
            got = fit_node(request, m.view)
            if not isinstance(got, Decision):
                return {"Error": f"hamid: the pod no longer fits on {node}: " + "; ".join(got)}
            owner = Owner("pod", uid, name=f"{ns}/{name}")
            try:
                await self.peer.commit(m.peer, owner, got, request=request.to_dict(),
                                       details={"placed_by": "extender"})
            except HamidError as e:
                return {"Error": f"hamid: node {node} refused the placement: {e}"}
            self.cluster.committed(got)
            placed = (owner, got, m.peer)
        try:
            await trio.to_thread.run_sync(self._record_and_bind, ns, name, uid, node,
                                          placed[1] if placed else None)
        except Exception as e:
            if placed is not None:
                owner, got, peer = placed
                try:
                    await self.peer.release(peer, owner.key, node=node)
                except HamidError as err:
                    log.warning("could not release after a failed binding", owner=owner.key, error=str(err))
                self.cluster.forget(got)
            return {"Error": f"hamid: binding {ns}/{name} to {node} failed: {e}"}
        self.bound += 1
        log.info("bound", pod=f"{ns}/{name}", node=node)
        return {"Error": ""}

    def _record_and_bind(self, ns: str, name: str, uid: str, node: str, decision: Decision | None) -> None:
        if decision is not None:
            self.core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": annotations.allocation(decision)}},
                                           _request_timeout=10)
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": ns, "uid": uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        # the client cannot parse the Status the server answers a binding with: read it raw
        self.core.create_namespaced_pod_binding(name, ns, body, _preload_content=False, _request_timeout=10)

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
            body = await req.body()
            if len(body) > MAX_BODY:
                return JSONResponse({"Error": f"request body over {MAX_BODY} bytes"}, 413)
            fwd = await self._forward(verb, body, req.headers.get(FORWARDED) is not None)
            if fwd is not None:
                return fwd
            try:
                args = json.loads(body)
            except ValueError:
                return JSONResponse({"Error": "request body is not JSON"}, 400)
            if verb in ("filter", "prioritize"):
                members = self.cluster.members()  # here, in the trio thread; the fitting in a worker
                fn = self.filter if verb == "filter" else self.prioritize
                return JSONResponse(await trio.to_thread.run_sync(fn, args, members))
            return JSONResponse(await self.bind(args))

        return Starlette(routes=[Route("/{verb}", handle, methods=["POST"])])
