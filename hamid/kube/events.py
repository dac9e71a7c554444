"""Events hamid writes on pods: why a pod could not be tied to its GPUs, why it stays gated, a clamped request."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from ..logs import get_logger

log = get_logger("kube")

MESSAGE_MAX = 1024  # the API server keeps longer messages, kubectl describe shows them badly


def pod_event(core: Any, pod: dict[str, Any], reason: str, message: str, *, kind: str = "Warning",
              host: str | None = None) -> None:
    """A core/v1 Event on ``pod`` through ``core`` (a ``CoreV1Api``), from component ``hamid``.
    Blocking; best effort: a failure is logged, not raised."""
    from kubernetes import client

    meta = pod.get("metadata") or {}
    now = datetime.datetime.now(datetime.UTC)
    body = client.CoreV1Event(
        metadata=client.V1ObjectMeta(name=f"{meta.get('name')}.hamid-{uuid.uuid4().hex[:10]}",
                                     namespace=meta.get("namespace")),
        involved_object=client.V1ObjectReference(kind="Pod", namespace=meta.get("namespace"), name=meta.get("name"),
                                                 uid=meta.get("uid"), api_version="v1"),
        reason=reason, message=message[:MESSAGE_MAX], type=kind, first_timestamp=now, last_timestamp=now, count=1,
        source=client.V1EventSource(component="hamid", host=host))
    try:
        core.create_namespaced_event(meta.get("namespace"), body, _request_timeout=10)
    except Exception as e:
        log.warning("could not record an event on the pod", pod=f"{meta.get('namespace')}/{meta.get('name')}",
                    reason=reason, error=str(e))


def announce_clamp(core: Any, pod: dict[str, Any]) -> bool:
    """The Warning Event ``GPUCoresClamped`` on a pod just placed whose ``gpucores`` the webhook lowered to
    100 (its annotation ``hamid.io/gpucores-clamped`` says from what), so ``kubectl describe`` shows it;
    the same in gate mode (the leader opens the gate) and extender mode (the extender binds). True when
    there was one to announce. Blocking; best effort, as :func:`pod_event`."""
    from ..request.kube import CORES_CLAMPED

    said = ((pod.get("metadata") or {}).get("annotations") or {}).get(CORES_CLAMPED)
    if not said:
        return False
    pod_event(core, pod, "GPUCoresClamped", said)
    return True
