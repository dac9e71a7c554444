"""The mutating admission webhook: ``admission.k8s.io/v1`` AdmissionReview for pods.

Every daemon serves it over HTTPS (:class:`WebhookFace`, ``webhookListen``),
so it survives the leader's death. What it does to a pod:

CREATE
  - a pod that asks for no GPU resource (the configured names:
    ``resourceCountName``...) and carries no hamid/HAMi request annotation
    passes untouched (allowed, no patch);
  - a pod created with an allocation annotation (:data:`ALLOCATION_ANNOTATIONS`,
    HAMi's ``hami.io/vgpu-node``...) is refused (403), as HAMi's PR #3042
    does: those record a placement, which only hamid makes; no node reads
    them anyway (the ledger is the truth);
  - a GPU pod is parsed with the one request parser (``parse_pod``) and the
    config's defaults; a malformed request or annotation (including GPU
    UUID lists that are not GPU UUIDs) is refused (400) with the parser's
    message, which names the field and what is accepted, so ``kubectl``
    shows why;
  - defaults, where HAMi's webhook applies them: a container that asks for
    GPU memory or cores but no GPU count gets ``<count>: defaultGPUNum``
    (HAMi does the same; without it kubelet would never call the device
    plugin for the container), and one that asks for whole cards without
    naming cores gets ``<cores>: 100`` (exclusive, as HAMi). ``defaultMemory``
    and ``defaultCores`` are not written into the pod: HAMi applies them at
    placement, and hamid's parser applies them the same way wherever the
    pod is read (leader, extender, node), so writing them would only freeze
    a copy;
  - ``gpucores`` above 100 is taken as 100 (the whole GPU, exclusive), as
    HAMi does: the pod's value is replaced by 100, the response carries a
    warning ``kubectl`` prints, and the annotation ``hamid.io/gpucores-clamped``
    says so, which becomes a Warning Event (``GPUCoresClamped``) once the pod
    is placed (by the leader in gate mode, the extender's bind in extender mode);
  - ``spec.schedulerName: hami-scheduler`` (``adoptSchedulerNames``: what
    HAMi's webhook sets) is reset to ``default-scheduler``, with a warning and
    the annotation ``hamid.io/scheduler-name`` keeping the old name: there is
    no hami-scheduler, and hamid places through kube-scheduler;
  - gate mode: the scheduling gate ``hamid.io/placement`` is added (once;
    idempotent when present), unless the pod already names its node
    (``spec.nodeName``: the API server refuses gates on such a pod, and the
    node admits it itself). Extender mode: no gate.

UPDATE (HAMi's webhook sees CREATE only, so its annotations can be PATCHed
later: hami issue #3041)
  - an update that adds, changes or removes an allocation annotation is
    refused unless it comes from one of the allocation writers (the
    daemons' own service account: the leader writes them when it places);
  - an update that changes a request annotation to a malformed value is
    refused as at CREATE. Nothing is patched on UPDATE (gates cannot be
    added after creation).

Every response carries the request's ``uid``. The ``hami.io/webhook:
ignore`` label HAMi's chart honours is a selector of the webhook
configuration, not of this server: nothing here skips a pod for a label.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from typing import Any

import trio

from ..errors import HamidError
from ..logs import get_logger
from ..serving import BodyTooLarge, read_body
from ..request import RequestError, parse_pod
from ..request.kube import CORES_CLAMPED, LEGACY_COUNT, clamp_message, cores_clamped
from ..request.kube import (ANN_GPU_POLICY, ANN_MODE, ANN_NODE_POLICY, ANN_NOUSE_TYPE, ANN_NOUSE_UUID, ANN_NUMA_BIND,
                            ANN_SCORING_WEIGHTS, ANN_USE_TYPE, ANN_USE_UUID, parse_device_cordon)
from ..request.model import Defaults
from ..placement import hamiannotations
from ..request.kube import GATE

log = get_logger("webhook")

DEFAULT_SCHEDULER = "default-scheduler"  # kube-scheduler's default profile, where hamid's placement happens
SCHEDULER_NAME_ANNOTATION = "hamid.io/scheduler-name"  # the schedulerName the pod was created with, when reset

API_VERSION = "admission.k8s.io/v1"

#: Annotations that record a placement (HAMi's, which hamid writes for the
#: tools that read them). Refused on a pod being created; changed on UPDATE
#: only by the allocation writers.
ALLOCATION_ANNOTATIONS = (hamiannotations.VGPU_NODE, hamiannotations.VGPU_TIME, hamiannotations.DEVICES_ALLOCATED,
                          hamiannotations.DEVICES_TO_ALLOCATE, hamiannotations.BIND_PHASE, hamiannotations.BIND_TIME)

#: Annotations that shape a GPU request (HAMi's): a pod carrying one is checked.
REQUEST_ANNOTATIONS = (ANN_USE_TYPE, ANN_NOUSE_TYPE, ANN_USE_UUID, ANN_NOUSE_UUID, ANN_MODE, ANN_NUMA_BIND,
                       ANN_NODE_POLICY, ANN_GPU_POLICY, ANN_SCORING_WEIGHTS)

#: Largest AdmissionReview read. The API server caps an object at 1.5 MiB
#: (etcd's request limit) and an UPDATE review carries two; 8 MiB leaves
#: room for the envelope while bounding what a caller can make us buffer.
MAX_BODY = 8 << 20

SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class ReviewError(HamidError):
    """The body is not an ``admission.k8s.io/v1`` AdmissionReview (HTTP 400)."""


class Denied(Exception):
    """A pod refused: ``code`` (HTTP status in the response's Status) and ``message``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _ptr(key: str) -> str:
    """One JSON Pointer (RFC 6901) token."""
    return key.replace("~", "~0").replace("/", "~1")


def _map(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def _annotations(obj: Any) -> dict:
    return _map(_map(_map(obj).get("metadata")).get("annotations"))


def service_account_user(token_path: str = SA_TOKEN) -> str | None:
    """``system:serviceaccount:NS:NAME`` from the pod's mounted token (the
    JWT's ``sub`` claim, which the API server reports as the username), or
    ``None`` outside a pod. The signature is not checked: it is our own
    token, read to learn our own name."""
    try:
        with open(token_path, "rb") as f:
            token = f.read().strip()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise HamidError(f"cannot read the service account token {token_path}: {e.strerror or e}") from None
    try:
        payload = token.split(b".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + b"=" * (-len(payload) % 4)))
        sub = claims["sub"]
    except (IndexError, ValueError, KeyError, TypeError, binascii.Error):
        raise HamidError(f"the service account token {token_path} is not a JWT with a 'sub' claim") from None
    if not isinstance(sub, str) or not sub.startswith("system:serviceaccount:"):
        raise HamidError(f"the service account token {token_path} names {sub!r}, not a service account")
    return sub


class Webhook:
    """The admission logic (pure: one review in, one response out) and its ASGI app."""

    def __init__(self, *, defaults: Defaults = Defaults(), gate: bool = True,
                 writers: frozenset[str] | None = None, adopt: frozenset[str] = frozenset({"hami-scheduler"})) -> None:
        self.defaults = defaults
        self.adopt = adopt  # schedulerName values reset to default-scheduler (adoptSchedulerNames)
        self.gate = gate
        self.writers = writers  # None: allocation annotations not checked on UPDATE
        names = defaults.names
        self.resources = (names.count, names.memory, names.memory_percentage, names.cores, names.priority)
        self.counts = {"allowed": 0, "patched": 0, "denied": 0, "invalid": 0}
        self._warnings: list[str] = []

    # --- the review ----------------------------------------------------------------------

    def review(self, body: Any) -> dict:
        """An AdmissionReview (decoded JSON) to its response AdmissionReview."""
        if not isinstance(body, dict) or body.get("kind") != "AdmissionReview":
            raise ReviewError("expected an AdmissionReview object")
        if body.get("apiVersion") != API_VERSION:
            raise ReviewError(f"apiVersion {body.get('apiVersion')!r}: accepted: {API_VERSION} "
                              "(set admissionReviewVersions: [v1])")
        req = body.get("request")
        if not isinstance(req, dict) or not isinstance(req.get("uid"), str) or not req["uid"]:
            raise ReviewError("request.uid: an AdmissionReview request needs a uid")
        resp: dict[str, Any] = {"uid": req["uid"], "allowed": True}
        self._warnings: list[str] = []  # kubectl prints these ("Warning: ..."); set by _create
        try:
            patch = self._admit(req)
        except Denied as d:
            self.counts["denied"] += 1
            meta = _map(_map(req.get("object")).get("metadata"))
            log.info("pod refused", uid=req["uid"], namespace=req.get("namespace"),
                     name=req.get("name") or meta.get("name") or meta.get("generateName"),
                     operation=req.get("operation"), code=d.code, reason=d.message)
            resp["allowed"] = False
            resp["status"] = {"code": d.code, "message": d.message,
                              "reason": "Forbidden" if d.code == 403 else "BadRequest"}
        else:
            if patch:
                self.counts["patched"] += 1
                resp["patchType"] = "JSONPatch"
                resp["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
            else:
                self.counts["allowed"] += 1
            if self._warnings:
                resp["warnings"] = list(self._warnings)
        return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": resp}

    def _admit(self, req: dict) -> list[dict]:
        res = _map(req.get("resource"))
        kind = _map(req.get("kind"))
        if (res.get("resource"), res.get("group", "")) != ("pods", "") and kind.get("kind") != "Pod":
            return []  # configured for other objects by mistake: not ours to judge
        if req.get("subResource"):
            return []  # pods/status, pods/binding...: not the pod's spec
        op = req.get("operation")
        if op == "CREATE":
            return self._create(req)
        if op == "UPDATE":
            self._update(req)
        return []

    def is_gpu_pod(self, pod: dict) -> bool:
        """Whether ``pod`` asks for a GPU resource or carries a request annotation."""
        if any(k in REQUEST_ANNOTATIONS for k in _annotations(pod)):
            return True
        return any(self._written(c) for _key, _i, c in self._containers(pod))

    @staticmethod
    def _containers(pod: dict):
        spec = _map(pod.get("spec"))
        for key in ("initContainers", "containers"):
            items = spec.get(key)
            if isinstance(items, list):
                for i, c in enumerate(items):
                    yield key, i, c

    def _written(self, c: Any) -> set[str]:
        """The GPU resources a container writes (with HAMi's old count name, which the parser refuses)."""
        res = _map(_map(c).get("resources"))
        return {k for k in (*self.resources, LEGACY_COUNT)
                if k in _map(res.get("limits")) or k in _map(res.get("requests"))}

    def _check_annotations(self, ann: dict) -> None:
        """The request annotations, checked with the parser's own rules and messages
        (on a one-container stand-in pod, so a pod whose containers ask no GPU is
        checked too), and the UUID lists, which must hold GPU UUIDs."""
        present = {k: v for k, v in ann.items() if k in REQUEST_ANNOTATIONS}
        if not present:
            return
        probe = {"metadata": {"name": "annotations", "annotations": present},
                 "spec": {"containers": [{"name": "annotations",
                                          "resources": {"limits": {self.defaults.names.count: "1"}}}]}}
        parse_pod(probe, self.defaults)
        for key in (ANN_USE_UUID, ANN_NOUSE_UUID):
            if key in present:
                parse_device_cordon(present[key], f"annotation {key}")

    def _create(self, req: dict) -> list[dict]:
        pod = req.get("object")
        if not isinstance(pod, dict):
            raise Denied(400, "request.object: a pod CREATE review carries the pod")
        ann = _annotations(pod)
        forged = [k for k in ALLOCATION_ANNOTATIONS if k in ann]
        if forged:
            raise Denied(403, f"metadata.annotations[{forged[0]}]: a pod cannot be created with "
                              f"{', '.join(forged)}: they record a GPU placement, which only hamid makes; "
                              "remove them (accepted: none of " + ", ".join(ALLOCATION_ANNOTATIONS) + ")")
        if not self.is_gpu_pod(pod):
            return []
        try:
            self._check_annotations(ann)
            parsed = parse_pod(self._named(pod, req), self.defaults)
        except RequestError as e:
            raise Denied(400, str(e)) from None
        notes: dict[str, str] = {}  # annotations saying what was changed, added in one go below
        ops = self._clamp(pod, notes) + self._adopt(pod, notes) + self._patch(pod, parsed)
        if notes:
            if not isinstance(_map(pod.get("metadata")).get("annotations"), dict):
                ops.append({"op": "add", "path": "/metadata/annotations", "value": notes})
            else:
                ops.extend({"op": "add", "path": f"/metadata/annotations/{_ptr(k)}", "value": v}
                           for k, v in notes.items())
        return ops

    def _adopt(self, pod: dict, notes: dict[str, str]) -> list[dict]:
        """HAMi's ``schedulerName`` (``adoptSchedulerNames``) back to kube-scheduler's default profile."""
        name = _map(pod.get("spec")).get("schedulerName")
        if name not in self.adopt:
            return []
        note = (f"spec.schedulerName {name} reset to {DEFAULT_SCHEDULER}: hamid places GPU pods through "
                "kube-scheduler (adoptSchedulerNames)")
        self._warnings.append(note)
        notes[SCHEDULER_NAME_ANNOTATION] = name
        return [{"op": "replace", "path": "/spec/schedulerName", "value": DEFAULT_SCHEDULER}]

    def _clamp(self, pod: dict, notes: dict[str, str]) -> list[dict]:
        """gpucores over 100 becomes 100 (HAMi's reading) in the pod itself, so
        kube-scheduler and kubelet count what is booked; said in a warning
        kubectl prints and in an annotation the leader turns into a Warning
        Event once the pod exists."""
        cores = self.defaults.names.cores
        ops: list[dict] = []
        said = []
        for key, i, name, asked in cores_clamped(pod, self.defaults):
            said.append(clamp_message(key, i, name, asked, cores))
            res = _map(_map(_map(pod.get("spec")).get(key)[i]).get("resources"))
            for part in ("limits", "requests"):
                if cores in _map(res.get(part)):
                    ops.append({"op": "replace", "path": f"/spec/{key}/{i}/resources/{part}/{_ptr(cores)}",
                                "value": "100"})
        if said:
            self._warnings.extend(said)
            notes[CORES_CLAMPED] = "; ".join(said)
        return ops

    @staticmethod
    def _named(pod: dict, req: dict) -> dict:
        """``pod`` with the name and namespace the parser needs: a CREATE with
        ``generateName`` has no name yet, and the namespace may be the request's."""
        meta = _map(pod.get("metadata"))
        if meta.get("name") and meta.get("namespace"):
            return pod
        out = dict(pod)
        m = dict(meta)
        m["name"] = meta.get("name") or req.get("name") or (str(meta.get("generateName") or "") + "(generated)")
        m["namespace"] = meta.get("namespace") or req.get("namespace") or "default"
        out["metadata"] = m
        return out

    def _patch(self, pod: dict, parsed) -> list[dict]:
        names = self.defaults.names
        ops: list[dict] = []
        asked = iter(parsed.containers)  # the parser's order: initContainers, then containers
        for key, i, c in self._containers(pod):
            cr = next(asked)
            if cr.gpu is None:
                continue
            written = self._written(c)
            add: dict[str, str] = {}
            if names.count not in written:
                add[names.count] = str(cr.gpu.count)
            if names.cores not in written and cr.gpu.cores == 100:
                add[names.cores] = "100"
            if not add:
                continue
            base = f"/spec/{key}/{i}/resources"
            res = _map(_map(c).get("resources"))
            targets = ["limits"] + (["requests"] if any(k in _map(res.get("requests")) for k in written) else [])
            if not isinstance(_map(c).get("resources"), dict):
                ops.append({"op": "add", "path": base, "value": {t: dict(add) for t in targets}})
                continue
            for t in targets:
                if not isinstance(res.get(t), dict):
                    ops.append({"op": "add", "path": f"{base}/{t}", "value": dict(add)})
                else:
                    ops.extend({"op": "add", "path": f"{base}/{t}/{_ptr(k)}", "value": v} for k, v in add.items())
        spec = _map(pod.get("spec"))
        wants_gpu = any(c.gpu is not None for c in parsed.containers)
        if self.gate and wants_gpu and not spec.get("nodeName"):
            gates = spec.get("schedulingGates")
            if not isinstance(gates, list) or not gates:
                ops.append({"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]})
            elif not any(isinstance(g, dict) and g.get("name") == GATE for g in gates):
                ops.append({"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}})
        return ops

    def _update(self, req: dict) -> None:
        new, old = req.get("object"), req.get("oldObject")
        if not isinstance(new, dict) or not isinstance(old, dict):
            raise Denied(400, "request.object, request.oldObject: a pod UPDATE review carries both")
        ann, old_ann = _annotations(new), _annotations(old)
        changed = [k for k in ALLOCATION_ANNOTATIONS if ann.get(k) != old_ann.get(k)]
        user = _map(req.get("userInfo")).get("username")
        if changed and self.writers is not None and user not in self.writers:
            raise Denied(403, f"metadata.annotations[{changed[0]}]: {', '.join(changed)} record a GPU placement, "
                              f"which only hamid writes (users {', '.join(sorted(self.writers)) or '(none)'}); "
                              f"{user or 'this user'} may not add, change or remove them")
        if any(ann.get(k) != old_ann.get(k) for k in REQUEST_ANNOTATIONS):
            try:
                self._check_annotations(ann)
            except RequestError as e:
                raise Denied(400, str(e)) from None

    # --- HTTP ----------------------------------------------------------------------------

    def app(self):
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, PlainTextResponse
        from starlette.routing import Route

        async def mutate(request: Request):
            try:
                body = await read_body(request, MAX_BODY)
            except BodyTooLarge:
                return PlainTextResponse(f"body larger than {MAX_BODY} bytes", status_code=413)
            try:  # parsing a large review takes CPU: off the event loop, so no other face waits for it
                out = await trio.to_thread.run_sync(lambda: self.review(json.loads(body)))
            except (ValueError, ReviewError, RecursionError) as e:  # JSONDecodeError is a ValueError
                self.counts["invalid"] += 1
                msg = str(e) if isinstance(e, ReviewError) else f"body is not JSON: {str(e)[:200]}"
                return PlainTextResponse(msg, status_code=400)
            return JSONResponse(out)

        async def healthz(request: Request):
            return PlainTextResponse("ok")

        return Starlette(routes=[Route("/mutate", mutate, methods=["POST"]),
                                 Route("/healthz", healthz, methods=["GET"])])


class WebhookFace:
    """The webhook's HTTPS server, on every daemon (``webhookListen``)."""

    name = "webhook"

    def __init__(self, webhook: Webhook, listen: str, *, certfile: str | None = None, keyfile: str | None = None,
                 tls_dir: str | None = None, names: tuple[str, ...] = ()) -> None:
        if (certfile is None) != (keyfile is None):
            raise HamidError("the webhook needs both webhookCertFile and webhookKeyFile, or neither")
        if certfile is None and tls_dir is None:
            raise HamidError("the webhook needs webhookCertFile and webhookKeyFile, or a directory for a CA of its own")
        self.webhook = webhook
        self.listen = listen
        self.certfile, self.keyfile = certfile, keyfile
        self.tls_dir = tls_dir
        self.names = names
        self.ca_file: str | None = None  # the self-made CA, once run() made it
        self.bound: list[str] | None = None  # the addresses listened on, once serving

    @classmethod
    def from_config(cls, c, *, defaults: Defaults) -> "WebhookFace":
        if c.webhookAllocationWriters is not None:
            writers = frozenset(c.webhookAllocationWriters)
        else:
            me = service_account_user()
            writers = frozenset({me}) if me else None
            if writers is None:
                log.warning("not in a pod and webhookAllocationWriters unset: pod updates that change allocation "
                            "annotations are not checked (no node trusts them; set webhookAllocationWriters)")
        return cls(Webhook(defaults=defaults, gate=c.controlMode == "gate", writers=writers,
                           adopt=frozenset(c.adoptSchedulerNames)), c.webhookListen,
                   certfile=c.webhookCertFile, keyfile=c.webhookKeyFile,
                   tls_dir=os.path.join(c.stateDir, "webhook-tls"), names=tuple(c.webhookNames))

    def cert_names(self) -> list[str]:
        host = self.listen.rsplit(":", 1)[0].strip("[]")
        extra = [] if host in ("", "0.0.0.0", "::") else [host]
        return list(dict.fromkeys([*self.names, *extra, "localhost", "127.0.0.1"]))

    def collector(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        counts = self.webhook.counts

        class _Collector:
            def collect(self):
                m = CounterMetricFamily("hamid_webhook_reviews", "AdmissionReviews answered, by result",
                                        labels=["result"])
                for k, v in counts.items():
                    m.add_metric([k], v)
                yield m

        return _Collector()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        from ..serving import serve_asgi

        certfile, keyfile = self.certfile, self.keyfile
        if certfile is None:
            from .certs import ensure

            files = await trio.to_thread.run_sync(ensure, self.tls_dir, self.cert_names())
            certfile, keyfile, self.ca_file = str(files.cert), str(files.key), str(files.ca)
            log.warning("webhook serving a certificate of its own CA (no webhookCertFile): the webhook "
                        "configuration's caBundle must be this CA; several daemons behind one Service need "
                        "one shared certificate (webhookCertFile, webhookKeyFile)",
                        ca_file=self.ca_file, names=self.cert_names(), issued=files.issued,
                        caBundle=base64.b64encode(files.ca.read_bytes()).decode())
        async with trio.open_nursery() as nursery:
            self.bound = await nursery.start(
                lambda task_status: serve_asgi(self.webhook.app(), self.listen, what="webhookListen",
                                               certfile=certfile, keyfile=keyfile, task_status=task_status))
            log.info("webhook serving", listen=self.listen, bound=self.bound, gate=self.webhook.gate)
            task_status.started()
