"""Events hamid writes on pods: why a pod could not be tied to its GPUs, why it stays gated, a clamped request.

:func:`event_body` is the one shape of an Event (core/v1, from component ``hamid``); the trio side
posts it through :class:`hamid.kube.rest.AsyncKube` (:func:`pod_event`), the kubelet face's blocking
gRPC handlers through the official client (:meth:`hamid.kubelet.pods.PodDirectory.event`). Both are
best effort: a failure is logged, not raised.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from ..logs import get_logger
from .rest import AsyncKube

log = get_logger("kube")

MESSAGE_MAX = 1024  # the API server keeps longer messages, kubectl describe shows them badly


def event_body(pod: dict[str, Any], reason: str, message: str, *, kind: str = "Warning",
               host: str | None = None) -> dict[str, Any]:
    """The core/v1 Event on ``pod``, as JSON."""
    meta = pod.get("metadata") or {}
    ns, name = meta.get("namespace"), meta.get("name")
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    source: dict[str, Any] = {"component": "hamid"}
    if host:
        source["host"] = host
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{name}.hamid-{uuid.uuid4().hex[:10]}", "namespace": ns},
            "involvedObject": {"kind": "Pod", "namespace": ns, "name": name, "uid": meta.get("uid"),
                               "apiVersion": "v1"},
            "reason": reason, "message": message[:MESSAGE_MAX], "type": kind, "firstTimestamp": now,
            "lastTimestamp": now, "count": 1, "source": source}


def event_failed(pod: dict[str, Any], reason: str, e: Exception) -> None:
    meta = pod.get("metadata") or {}
    log.warning("could not record an event on the pod", pod=f"{meta.get('namespace')}/{meta.get('name')}",
                reason=reason, error=str(e))


async def pod_event(kube: AsyncKube, pod: dict[str, Any], reason: str, message: str, *, kind: str = "Warning",
                    host: str | None = None) -> None:
    """Post :func:`event_body` on the trio loop; best effort."""
    body = event_body(pod, reason, message, kind=kind, host=host)
    try:
        await kube.request("POST", f"/api/v1/namespaces/{body['metadata']['namespace']}/events", body)
    except Exception as e:  # the API server refused or did not answer: the Event is lost, the work goes on
        event_failed(pod, reason, e)


async def announce_clamp(kube: AsyncKube, pod: dict[str, Any]) -> bool:
    """The Warning Event ``GPUCoresClamped`` on a pod just placed whose ``gpucores`` the webhook lowered to
    100 (its annotation ``hamid.io/gpucores-clamped`` says from what), so ``kubectl describe`` shows it;
    the same in gate mode (the leader opens the gate) and extender mode (the extender binds). True when
    there was one to announce. Best effort, as :func:`pod_event`."""
    from ..request.kube import CORES_CLAMPED

    said = ((pod.get("metadata") or {}).get("annotations") or {}).get(CORES_CLAMPED)
    if not said:
        return False
    await pod_event(kube, pod, "GPUCoresClamped", said)
    return True
