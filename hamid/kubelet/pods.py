"""Who holds which devices, and the pods bound to this node: kubelet and the API server.

Blocking calls, made from worker threads. Kubelet's pod-resources API
(``List`` on ``<kubelet dir>/pod-resources/kubelet.sock``) says which pod and
container hold which device IDs once kubelet has allocated them; the API
server (the official Kubernetes Python client) gives the pod itself: its UID,
its spec, its phase. Together they tie a ``PreStartContainer`` call, which
carries only device IDs, to exactly one pod by UID: never a guess.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import grpc

from ..errors import HamidError
from ..kube.events import event_body, event_failed
from ..logs import get_logger
from .api import POD_RESOURCES_DIR, KUBELET_SOCKET
from .api import podresources_pb2 as pr
from .api import podresources_pb2_grpc as pr_grpc

log = get_logger("kubelet")

TERMINAL = ("Succeeded", "Failed")


class PodLookupError(HamidError):
    """A pod could not be found or read; the message says where it failed."""


def body_json(resp) -> Any:
    """The JSON body of a Kubernetes client call made with ``_preload_content=False`` (a urllib3
    response; the client has already raised ``ApiException`` for a status that is not 2xx), its
    connection given back to the pool. Such a call does not turn the answer into the client's model
    objects (a Pod is dozens of them, their modules imported on first use), which hamid only ever
    turned back into the dict the API server sent: the pod as the node's pod watch holds it."""
    try:
        data = resp.data
    finally:
        resp.release_conn()
    try:
        return json.loads(data)
    except ValueError as e:
        raise PodLookupError(f"the API server's answer is not JSON: {e}") from None


class PodDirectory:
    def __init__(self, node: str, kubelet_dir: str, resource: str, api) -> None:
        self.node = node
        self.resource = resource
        self.api = api  # kubernetes.client.ApiClient, or None when the daemon has no API server
        self.socket = os.path.join(kubelet_dir, POD_RESOURCES_DIR, KUBELET_SOCKET)
        # one channel kept open (a channel per List cost its connection setup on every PreStartContainer);
        # gRPC reconnects it when kubelet restarts and serves a new socket at the same path
        self._channel: grpc.Channel | None = None
        self._channel_lock = threading.Lock()

    def _stub(self) -> pr_grpc.PodResourcesListerStub:
        with self._channel_lock:
            if self._channel is None:
                self._channel = grpc.insecure_channel(f"unix:{self.socket}")
            return pr_grpc.PodResourcesListerStub(self._channel)

    def close(self) -> None:
        with self._channel_lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None

    # --- kubelet -----------------------------------------------------------------

    def allocations(self) -> dict[tuple[str, str], dict[str, tuple[str, ...]]]:
        """Every pod kubelet holds our devices for: (namespace, name) -> container -> device IDs."""
        import time

        delay = 0.02
        stub = self._stub()
        for attempt in range(8):
            try:
                got = stub.List(pr.ListPodResourcesRequest(), timeout=5)
                break
            except grpc.RpcError as e:
                # kubelet rate-limits this API (100 qps, burst 10): wait and ask again
                if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and attempt < 7:
                    time.sleep(delay)
                    delay *= 2
                    continue
                if e.code() == grpc.StatusCode.UNAVAILABLE and attempt == 0:
                    self.close()  # kubelet restarting: a fresh channel for the one more try
                    stub = self._stub()
                    continue
                raise PodLookupError(f"kubelet's pod-resources API at {self.socket} did not answer: "
                                     f"{e.code().name} {e.details()}") from None
        out: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {}
        for p in got.pod_resources:
            for c in p.containers:
                ids = tuple(i for d in c.devices if d.resource_name == self.resource for i in d.device_ids)
                if ids:
                    out.setdefault((p.namespace, p.name), {})[c.name] = ids
        return out

    def holder(self, device_ids: tuple[str, ...]) -> tuple[str, str, dict[str, tuple[str, ...]]]:
        """The pod that holds ``device_ids``: (namespace, name, its listed containers' devices).

        Exactly: a listed container holds exactly these IDs. Kubelet's List
        leaves out plain init containers, whose devices a later container of
        the same pod takes over first: then the one pod whose containers hold
        any of these IDs (kubelet never gives one device to two live pods).
        Nothing else is guessed: no pod, or several, is an error."""
        want = set(device_ids)
        allocs = self.allocations()
        exact = [(ns, n, c) for (ns, n), c in allocs.items() if any(set(i) == want for i in c.values())]
        found = exact or [(ns, n, c) for (ns, n), c in allocs.items() if any(want & set(i) for i in c.values())]
        if not found:
            raise PodLookupError(f"kubelet reports no pod on this node holding devices {sorted(want)} of "
                                 f"{self.resource} (pod-resources List; an init container whose devices no "
                                 "later container takes over is not listed by kubelet)")
        if len(found) > 1:
            raise PodLookupError(f"kubelet reports devices {sorted(want)} held by several pods: "
                                 + ", ".join(f"{ns}/{n}" for ns, n, _ in found))
        return found[0]

    # --- the API server ------------------------------------------------------------

    def _core(self):
        if self.api is None:
            raise PodLookupError("no API server configured (hamid run --kubernetes, or --kubeconfig FILE)")
        from kubernetes import client

        return client.CoreV1Api(self.api)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod as a plain dict (the API server's JSON as it came, as the pod watch holds it), or
        None if the API server has none of that name."""
        from kubernetes.client.exceptions import ApiException

        core = self._core()
        try:
            pod = body_json(core.read_namespaced_pod(name, namespace, _request_timeout=10, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                return None
            raise PodLookupError(f"the API server refused to read pod {namespace}/{name}: {e.status} {e.reason}") \
                from None
        except Exception as e:  # connection errors come in several types
            raise PodLookupError(f"the API server could not be reached to read pod {namespace}/{name}: {e}") \
                from None
        if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod":
            raise PodLookupError(f"the API server answered the read of pod {namespace}/{name} with something "
                                 "that is not a Pod")
        return pod

    def mark_allocated(self, pod: dict[str, Any]) -> None:
        """HAMi's ``bind-phase: success`` on a pod the leader placed (:mod:`hamid.kube.bindphase`),
        once its GPU containers are all allocated here. Best effort: a failure is logged (the
        containers run either way) and the next start of one of them writes it again."""
        from ..kube.bindphase import success_patch

        meta = pod.get("metadata") or {}
        patch = success_patch(meta.get("annotations") or {})
        if patch is None:
            return
        ns, name = meta.get("namespace"), meta.get("name")
        body = {"metadata": {"annotations": patch, "uid": meta.get("uid")}}  # the uid: never another pod's
        try:
            self._core().patch_namespaced_pod(name, ns, body, _request_timeout=10)
            log.info("bind phase: success", pod=f"{ns}/{name}")
        except Exception as e:
            log.warning("could not write the pod's bind phase", pod=f"{ns}/{name}", error=str(e))

    def event(self, pod: dict[str, Any], reason: str, message: str, kind: str = "Warning") -> None:
        """A core/v1 Event on the pod (best effort: a failure is logged, not raised)."""
        # blocking, from kubelet's gRPC threads: through the official client (the Event's shape is event_body's)
        body = event_body(pod, reason, message, kind=kind, host=self.node)
        try:
            self._core().create_namespaced_event(body["metadata"]["namespace"], body, _request_timeout=10)
        except Exception as e:
            event_failed(pod, reason, e)
