"""A STAND-IN for kube-apiserver, for tests: no real API server can be
installed on these machines, so this module serves the real REST paths and
JSON of the kinds hamid uses, over real HTTP, or HTTPS with a CA of its own,
on 127.0.0.1 or the address given (a thread, an ephemeral port unless given),
so that the official Kubernetes Python client (its in-cluster loader
included) and ``kubectl`` work against it unchanged. The same server, with
``authorize=True``, authenticates every request and authorizes it with RBAC,
as a cluster does for a DaemonSet's pods.

What it does, as the real server does:

* discovery: ``/api``, ``/api/v1``, ``/apis``, ``/apis/<group>[/<version>]``,
  ``/version``, health (``/healthz``, ``/livez``, ``/readyz``), and
  ``/openapi/v2`` (see "does not" below); ``/openapi/v3`` is 404 so that
  newer kubectl falls back to v2 as it does against an older server.
* kinds (see :data:`BUILTIN_TYPES`; :meth:`ApiServer.register` adds more):
  namespaces; pods with ``binding`` and ``status``; nodes with ``status``;
  core ``events`` and the same objects as ``events.k8s.io/v1`` events (one
  storage, converted as the real server does); ``coordination.k8s.io/v1``
  leases; configmaps; secrets (``stringData`` folded into ``data``);
  resourcequotas with ``status`` (``spec.hard`` validated: names qualified
  or a standard quota resource, values quantities >= 0; status cleared at
  create; no quota controller fills ``status``, see "does not");
  serviceaccounts; services (below); ``apps/v1`` daemonsets with ``status``
  (below); ``rbac.authorization.k8s.io/v1`` clusterroles, clusterrolebindings,
  roles, rolebindings (below); ``admissionregistration.k8s.io/v1`` mutating
  and validating webhook configurations (defaulted and validated as the real
  server does); ``authorization.k8s.io/v1`` selfsubjectaccessreviews,
  subjectaccessreviews and selfsubjectrulesreviews (answered by the
  authorizer, never stored: ``kubectl auth can-i [--list]``). Discovery lists
  every group, version and resource, with short names (``sa``, ``ds``,
  ``svc``...) and the ``all`` category.
* services: defaults (``type: ClusterIP``, ``sessionAffinity``, port
  ``protocol``/``targetPort``, ``internalTrafficPolicy``, and for NodePort
  ``externalTrafficPolicy: Cluster``); a ClusterIP allocated from
  10.96.0.0/16 into ``clusterIP``/``clusterIPs`` (``ipFamilies`` IPv4,
  SingleStack), ``clusterIP: None`` kept (headless); ``type: NodePort``: a
  given ``nodePort`` kept if inside 30000-32767 and free (else the real 422s
  ``provided port is not in the valid range. The range of valid ports is
  30000-32767`` and ``provided port is already allocated``), a missing one
  allocated; an update that leaves out the clusterIP or a nodePort keeps the
  allocated one (node ports matched by port name, as patchAllocatedValues),
  a changed clusterIP is ``may not change once set``; validated: name
  (DNS-1035), type, ports (number, names when several, duplicates), and a
  nodePort on a ClusterIP service is ``Forbidden``.
* daemonsets: apps/v1 defaults (``updateStrategy`` RollingUpdate with
  maxUnavailable 1 and maxSurge 0, ``revisionHistoryLimit`` 10, the pod
  template's defaults), ``status`` zeroed at create and its own subresource,
  ``generation`` (+1 on any spec change), the template generation (annotation
  ``deprecated.daemonset.template.generation``: 1, +1 when the template
  changes); validation with the real messages: the selector's requirements,
  the template's labels against the selector (``selector` does not match
  template `labels``; a missing selector selects nothing), an empty selector
  (``empty selector is invalid for daemonset``), the template's containers,
  ``restartPolicy: Always``, no ``activeDeadlineSeconds``; the selector is
  immutable (``field is immutable``).
* RBAC objects: names any path segment (``system:discovery``); roles'
  rules validated (verbs required; apiGroups and resources for resource
  rules; no nonResourceURLs in a Role or beside resources); bindings
  defaulted (``roleRef.apiGroup``, User/Group subjects' apiGroup) and
  validated (roleRef apiGroup, kind Role/ClusterRole, or ClusterRole only for
  a ClusterRoleBinding, name; subjects' kind, name, apiGroup, a
  ServiceAccount's namespace in a ClusterRoleBinding); ``roleRef`` is
  immutable (``cannot change roleRef``). The bootstrap policy that decides
  what every user may do is created at start, as the real server does:
  ClusterRoles and ClusterRoleBindings ``cluster-admin`` (group
  system:masters), ``system:discovery`` and ``system:basic-user`` (group
  system:authenticated), ``system:public-info-viewer`` (system:authenticated
  and system:unauthenticated), labelled ``kubernetes.io/bootstrapping:
  rbac-defaults``.
* HTTPS (``tls=True``): a CA of its own (ECDSA P-256, made with
  :mod:`hamid.control.certs`), its PEM in :attr:`ApiServer.ca_pem` (a pod's
  ``ca.crt``) and in :meth:`ApiServer.write_kubeconfig`'s
  ``certificate-authority-data``; the serving certificate names
  ``kubernetes``, ``kubernetes.default``, ``kubernetes.default.svc``,
  ``kubernetes.default.svc.cluster.local``, 10.96.0.1, localhost,
  127.0.0.1, ::1, the listen address, ``tls_names``, and the local address
  each connection arrived on (so a server on ``0.0.0.0`` verifies on a
  bridge made after it started); HTTP/1.1 only (ALPN), the handshake in the
  connection's own thread.
* authentication (``authorize=True``; off, every request is system:admin
  but for known tokens, as before): a bearer token of :attr:`ApiServer.tokens`
  (the admin kubeconfig's ``standin``: system:admin in system:masters;
  :meth:`ApiServer.add_token`'s) or a service-account token from
  :meth:`ApiServer.issue_token` (an RS256 JWT with the projected token's
  claims ``iss``, ``sub``, ``aud``, ``exp``, ``iat``, ``nbf``, ``jti``,
  ``kubernetes.io`` namespace/serviceaccount/pod/node; verified: signature,
  expiry, audience and issuer ``https://kubernetes.default.svc.cluster.local``,
  the ServiceAccount existing with the claimed uid, a bound pod existing with
  its uid) is that user (a service account's groups
  ``system:serviceaccounts``, ``system:serviceaccounts:<ns>``,
  ``system:authenticated``, its uid, and the ``extra`` of credential id and
  bound pod/node); any other bearer token is 401 ``Unauthorized``; no token
  (or another scheme) is ``system:anonymous`` in ``system:unauthenticated``.
  ``Impersonate-User``/``-Group`` (``kubectl --as``) act as that user once
  the requester is allowed ``impersonate`` on users (or serviceaccounts) and
  groups, each check authorized like a request.
* authorization (``authorize=True``): the request's attributes as the real
  RequestInfo resolves them (:func:`request_attributes`: verb from the method,
  ``list``/``watch`` (``watch=1`` or ``/watch/``) for a GET of a collection,
  ``deletecollection``; group, resource, subresource (``pods/binding``,
  ``pods/status``...), namespace (a namespace's own name for
  ``namespaces/<name>``), name (from a list's or watch's
  ``metadata.name=`` field selector too); non-resource paths with their
  path); system:masters allowed everything; else the RBAC authorizer over the
  stored roles and bindings: ClusterRoleBindings grant everywhere,
  RoleBindings their Role or a ClusterRole's rules in their namespace only;
  subjects User, Group, ServiceAccount (without a namespace in a
  RoleBinding: the binding's); rules match verbs, apiGroups, resources
  (``*``, ``res/sub``, ``*/sub``; a subresource is its own resource),
  resourceNames (never matching a request without a name: a create, or a
  list/watch without that field selector) and nonResourceURLs (exact, ``*``
  or ``prefix*``). A denial is 403 ``Forbidden`` with the real message and
  details: ``pods "x" is forbidden: User "..." cannot patch resource "pods"
  in API group "" in the namespace "default"`` (``... at the cluster
  scope``; ``forbidden: User "..." cannot get path "/api"``), and the
  authorizer's reason when a binding names a missing role (``: RBAC:
  role.rbac.authorization.k8s.io "x" not found``). Every request, its
  watches, binding and status subresources included, is checked before
  anything else, and each decision is appended to :attr:`ApiServer.audit`
  (user, groups, verb, apiGroup, resource, subresource, namespace, name,
  path, allowed, and the binding that allowed it).
* metadata: ``uid`` (uuid4), ``creationTimestamp``, ``generation`` (kinds
  with ``generation=True``: 1 at create, +1 when anything outside metadata
  and status changes), one global ``resourceVersion`` counter (a string)
  bumped on every write; a write that changes nothing is not a write (no new
  resourceVersion, no watch event).
* errors are ``Status`` objects with the real reasons and messages:
  ``NotFound`` 404, ``AlreadyExists`` 409, ``Conflict`` 409 (a PUT or PATCH
  carrying a stale ``metadata.resourceVersion``; a PUT without one is an
  unconditional update, as for every built-in kind), ``Invalid`` 422 (names,
  pod containers, pod spec immutability), ``BadRequest`` 400,
  ``MethodNotAllowed`` 405, ``UnsupportedMediaType`` 415, ``Expired``/``Gone``
  410, ``InternalError`` 500 (a create that carries a resourceVersion),
  ``Unauthorized`` 401 and ``Forbidden`` 403 (above). A refused request's
  body is read and dropped, so its keep-alive connection stays usable.
* PATCH: ``application/merge-patch+json`` (RFC 7386),
  ``application/json-patch+json`` (RFC 6902, ``test`` included, through the
  ``jsonpatch`` library) and ``application/strategic-merge-patch+json`` with
  the directives ``$patch`` (merge/replace/delete), ``$setElementOrder/``,
  ``$deleteFromPrimitiveList/`` and ``$retainKeys``, and the merge keys of
  :data:`POD_MERGE_KEYS`, :data:`NODE_MERGE_KEYS`, :data:`SERVICE_MERGE_KEYS`
  and :data:`META_MERGE_KEYS` (from the ``patchMergeKey`` tags of
  k8s.io/api: containers, initContainers, ephemeralContainers, volumes,
  imagePullSecrets, schedulingGates by ``name``; env by ``name``; ports by
  ``containerPort``; volumeMounts by ``mountPath``; conditions and node
  addresses by ``type``; service ports by ``port``; ownerReferences by
  ``uid``; finalizers merged as a set). Lists without a merge key
  (tolerations, node taints, containerStatuses...) are replaced whole, as
  the real server does.
* list: ``labelSelector`` (``=``, ``==``, ``!=``, ``in``, ``notin``,
  exists, ``!``key, ``>``, ``<``), ``fieldSelector`` (``=``, ``==``, ``!=``;
  ``metadata.name`` and ``metadata.namespace`` on every kind plus each kind's
  own labels, e.g. pods' ``spec.nodeName`` and ``status.phase``; any other
  label is 400 ``field label not supported``), ``limit``/``continue`` paging
  over a consistent snapshot (a continue token older than ``compact()`` is
  410 ``Expired``), ``resourceVersion`` newer than the server's waits up to
  3 s, then 504 ``Timeout``.
* watch (``?watch=1`` or the old ``/watch/`` paths): chunked JSON lines
  ``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": ...}``; no
  ``resourceVersion`` or ``"0"`` sends the current objects as ``ADDED``
  first; a given one replays the events after it from a bounded history
  (``history`` events); older than that (or than :meth:`ApiServer.compact`)
  gives one ``ERROR`` event with a 410 ``Expired`` Status, as the watch cache
  does; selectors apply to the old and new object, so an object leaving the
  selection is a ``DELETED`` event and one entering it an ``ADDED`` event;
  ``allowWatchBookmarks=true`` sends a ``BOOKMARK`` (only kind, apiVersion and
  ``metadata.resourceVersion``) every ``bookmark_interval`` seconds (the real
  server: about a minute); ``sendInitialEvents=true`` ends the initial
  ``ADDED`` events with a bookmark annotated ``k8s.io/initial-events-end``;
  ``timeoutSeconds`` ends the stream.
* DELETE: ``DeleteOptions`` (body or query) ``gracePeriodSeconds`` and
  ``preconditions``. A pod is deleted at once when the grace period is 0,
  when it is not bound to a node, or when its phase is Succeeded or Failed
  (the pod strategy's rule); otherwise (default grace: the pod's
  ``terminationGracePeriodSeconds``, 30) it gets ``deletionTimestamp`` and
  ``deletionGracePeriodSeconds`` and stays until a DELETE with grace 0 (what
  kubelet sends once the containers stopped) or :meth:`ApiServer.finish_deletion`
  removes it; no timer removes it, as none does in the real server.
  ``metadata.finalizers`` hold any object until they are emptied. Pods and
  services answer a DELETE with the object, other kinds with a ``Status``.
* pods: defaults at create (``status.phase: Pending``, ``restartPolicy``,
  ``terminationGracePeriodSeconds``, ``dnsPolicy``, ``schedulerName``,
  container ``imagePullPolicy``/``terminationMessagePath``/``…Policy``,
  requests copied from limits where missing); an update may change only what
  the real pod validation allows (container images, ``activeDeadlineSeconds``,
  added tolerations, removed ``schedulingGates``; node selector and affinity
  only while gated, the narrowing rules left to :attr:`ApiServer.pod_update_hooks`);
  ``binding`` sets ``spec.nodeName`` and the ``PodScheduled`` condition and is
  409 when the pod is bound, being deleted or gated; the main resource ignores
  ``status`` and ``status`` ignores everything but status, labels and annotations.
* scheduling gates (KEP-3521/3838, GA 1.30): gates only at creation (with
  ``spec.nodeName`` forbidden beside them), then only removed, in any order;
  while the old pod is gated ``nodeSelector`` may only gain entries and the
  required node affinity may only be narrowed (set when it had no terms;
  otherwise the same number of ORed terms, each keeping its
  ``matchExpressions``/``matchFields`` as a prefix and appending); preferred
  terms are free; one update may narrow and remove the last gate; a gated pod
  has ``PodScheduled=False`` reason ``SchedulingGated`` and cannot be bound.
* writes are optimistic (etcd's GuaranteedUpdate): no lock is held while an
  update's patch, admission and validation run; if the object changed
  meanwhile they run again on the new one, so of racing writers carrying the
  same ``resourceVersion`` (two daemons renewing one Lease) exactly one wins.
* admission webhooks (:class:`WebhookDispatcher`), as kube-apiserver calls
  them: on CREATE/UPDATE/DELETE of any kind but the webhook configurations
  themselves (``pods/status`` as UPDATE of that subresource, ``pods/binding``
  as CREATE of a ``Binding``); ``rules`` (operations, apiGroups, apiVersions,
  resources with ``*``, ``pods/*``, ``*/*``, scope), ``namespaceSelector``
  (the namespace's labels; cluster-scoped objects always match),
  ``objectSelector`` (the object's or the old object's labels); HTTPS only,
  the certificate verified against ``caBundle`` (else the system roots) and
  the URL's host, or ``<name>.<namespace>.svc`` for a ``service`` reference
  (reached through ``webhooks.service_resolver``: there is no cluster network);
  ``?timeout=<timeoutSeconds>s`` on the URL and that deadline on the call;
  an AdmissionReview v1 with uid, kind, resource, subResource, requestKind,
  requestResource, name (empty for generateName), namespace, operation,
  userInfo (the authenticated user, as above: username, uid, groups,
  extra), object, oldObject,
  dryRun and options. Mutating webhooks run one after the other, configurations
  by name, each seeing the last one's JSONPatch applied (then the defaults
  again); validating ones in parallel after validation. A call that fails
  (connection, TLS, deadline, non-200, bad review, uid mismatch) is
  ``failurePolicy``'s: Fail is 500 ``Internal error occurred: failed calling
  webhook "<name>": ...``, Ignore admits; a denial is the webhook's status
  code (400 when under 400) with ``admission webhook "<name>" denied the
  request: <message>``, which kubectl prints; a patch that does not apply is a
  500 whatever the policy. Not done, refused when configured:
  ``reinvocationPolicy: IfNeeded``, ``matchConditions`` (CEL), reviews other
  than v1. A response's ``warnings`` reach the client as ``Warning: 299 -``
  headers (kubectl prints them). ``matchPolicy: Equivalent`` is treated as
  Exact (each kind is served in one version), ``sideEffects`` only validated
  (no dry runs), ``auditAnnotations`` dropped.

What it does NOT do (tests must not rely on these): other authentication
(client certificates, OIDC, webhook token review, legacy token Secrets;
``Impersonate-Uid``/``-Extra-`` are refused; a service-account token whose
account did not exist when it was issued carries an empty uid and is
accepted by any later account of that name, where the real server would
refuse it), other authorizers (Node, webhook) and RBAC's escalation checks (a
user allowed to create roles or bindings may grant anything: the real server
asks for ``escalate``/``bind`` or the permissions themselves), aggregated
ClusterRoles (``aggregationRule`` is stored and never acted on; the
aggregated ``admin``, ``edit``, ``view`` roles do not exist), the service
account issuer discovery (``/.well-known/openid-configuration``), the
controllers that make objects (no DaemonSet pods, no ``default``
ServiceAccount, no ``kube-root-ca.crt``: tests/k8s/podrunner.py plays those;
no Endpoints or EndpointSlices, no ``kubernetes`` Service), LoadBalancer
addresses, the DaemonSet ``updateStrategy`` and status validation, admission
plugins (no ServiceAccount token volume, no default tolerations, no
LimitRange/ResourceQuota; :attr:`ApiServer.admission_hooks` are in-process
stand-ins for them, run before the webhooks), server-side apply
(``application/apply-patch+yaml`` is 415) and ``managedFields``, protobuf
(JSON only; a request accepting only protobuf is 406), Table output (kubectl
prints from the JSON itself), ``dryRun``, ``deletecollection``, the
namespace controller (deleting a namespace deletes its objects at once), the
garbage collector (``ownerReferences`` are stored, never acted on), full field
validation (only what is listed above is checked) and OpenAPI schemas: ``/openapi/v2`` is a valid document with no definitions,
so kubectl's client-side validation finds no schema and accepts the object,
as it does for a kind it has no schema for.
"""

from __future__ import annotations

import base64
import contextlib
import collections
import copy
import datetime as _dt
import ipaddress
import itertools
import json
import re
import socket
import ssl
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import httpx
import jsonpatch
import yaml

from hamid.logs import get_logger

log = get_logger("tests.k8s.apiserver")

SERVER_VERSION = {
    "major": "1",
    "minor": "30",
    "gitVersion": "v1.30.0-hamid-standin",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-04-17T00:00:00Z",
    "goVersion": "go1.22.2",
    "compiler": "gc",
    "platform": "linux/amd64",
}

# ---------------------------------------------------------------------------
# errors


class ApiError(Exception):
    """An API error answered as a ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict:
        out = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": self.message, "reason": self.reason, "code": self.code}
        if self.details is not None:
            out["details"] = self.details
        return out


def _details(rt: ResourceType | None, name: str, resource: str | None = None) -> dict:
    out: dict = {"name": name}
    if rt is not None:
        if rt.group:
            out["group"] = rt.group
        out["kind"] = resource or rt.plural
    elif resource:
        out["kind"] = resource
    return out


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.qualified} "{name}" not found', _details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{rt.qualified} "{name}" already exists', _details(rt, name))


def conflict(rt: ResourceType, name: str, why: str, resource: str | None = None) -> ApiError:
    qualified = resource or rt.qualified
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {qualified} "{name}": {why}',
                    _details(rt, name, resource))


def stale(rt: ResourceType, name: str) -> ApiError:
    return conflict(rt, name, "the object has been modified; please apply your changes to the latest "
                              "version and try again")


def invalid(rt: ResourceType, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """``causes``: (reason, field, message) as Go's field.Error prints them."""
    text = ", ".join(f"{f}: {m}" for _r, f, m in causes)
    details = _details(rt, name)
    details["kind"] = rt.kind
    details["causes"] = [{"reason": r, "message": m, "field": f} for r, f, m in causes]
    msg = f'{rt.kind} "{name}" is invalid: {text}' if len(causes) == 1 else f'{rt.kind} "{name}" is invalid: [{text}]'
    return ApiError(422, "Invalid", msg, details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


# ---------------------------------------------------------------------------
# resource types


def _get(obj: Mapping, dotted: str):
    cur = obj
    for part in dotted.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def _field_str(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass
class ResourceType:
    """One REST resource: where it is served and how it behaves.

    ``field_labels``: the field selector labels beyond ``metadata.name`` and
    ``metadata.namespace``, each a dotted path into the object (or a function).
    ``merge_keys``: strategic merge patch keys by path (``spec.containers`` ->
    ``name``; ``""`` marks a list of scalars merged as a set; a path missing
    here is replaced whole). ``prepare_create(server, obj)``,
    ``validate(obj) -> [(reason, field, message)]`` and
    ``validate_update(new, old) -> [...]`` are the kind's strategy.
    """

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    field_labels: Mapping[str, str | Callable[[dict], object]] = field(default_factory=dict)
    merge_keys: Mapping[str, str] = field(default_factory=dict)
    generation: bool = False
    graceful: bool = False
    return_deleted_object: bool = False
    status_reset_on_create: bool = False
    name_rule: str = "subdomain"  # or "label", or "path" (RBAC names: any path segment)
    defaults: Callable[[dict], None] | None = None  # at create and update, and after each webhook patch
    prepare_create: Callable[[ApiServer, dict], None] | None = None  # after admission
    prepare_update: Callable[[ApiServer, dict, dict], None] | None = None  # (new, old): after mutating admission
    validate: Callable[[dict], list] | None = None
    validate_update: Callable[[ApiServer, dict, dict], list] | None = None
    storage: str | None = None  # another type's key whose objects this one shows (converted)
    to_storage: Callable[[dict], dict] | None = None
    from_storage: Callable[[dict], dict] | None = None
    # a create-only kind answered, never stored (access reviews): (server, body, requester) -> answer
    review: Callable[[ApiServer, dict, dict], dict] | None = None

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified(self) -> str:
        return self.key

    @property
    def storage_key(self) -> str:
        return self.storage or self.key

    def field_value(self, obj: dict, label: str) -> str | None:
        if label == "metadata.name":
            return _field_str(_get(obj, "metadata.name"))
        if label == "metadata.namespace" and self.namespaced:
            return _field_str(_get(obj, "metadata.namespace"))
        how = self.field_labels.get(label)
        if how is None:
            return None
        return _field_str(how(obj) if callable(how) else _get(obj, how))


META_MERGE_KEYS = {"metadata.finalizers": "", "metadata.ownerReferences": "uid"}

_CONTAINER_KEYS = {"env": "name", "ports": "containerPort", "volumeMounts": "mountPath",
                   "volumeDevices": "devicePath"}


def _container_keys(prefix: str) -> dict:
    out = {prefix: "name"}
    out.update({f"{prefix}[].{k}": v for k, v in _CONTAINER_KEYS.items()})
    return out


POD_MERGE_KEYS = {
    **META_MERGE_KEYS,
    **_container_keys("spec.containers"),
    **_container_keys("spec.initContainers"),
    **_container_keys("spec.ephemeralContainers"),
    "spec.volumes": "name",
    "spec.imagePullSecrets": "name",
    "spec.hostAliases": "ip",
    "spec.schedulingGates": "name",
    "spec.resourceClaims": "name",
    "spec.topologySpreadConstraints": "topologyKey",
    "status.conditions": "type",
    "status.podIPs": "ip",
    "status.hostIPs": "ip",
    "status.resourceClaimStatuses": "name",
}
NODE_MERGE_KEYS = {**META_MERGE_KEYS, "spec.podCIDRs": "", "status.conditions": "type",
                   "status.addresses": "type"}
SERVICE_MERGE_KEYS = {**META_MERGE_KEYS, "spec.ports": "port"}
WEBHOOK_MERGE_KEYS = {**META_MERGE_KEYS, "webhooks": "name"}

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN_FMT = _LABEL_FMT + r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"


def _name_errors(name: str, rule: str, path: str = "metadata.name") -> list[tuple[str, str, str]]:
    """k8s.io/apimachinery's name validation messages (validation.IsDNS1123Label,
    IsDNS1123Subdomain; path.IsValidPathSegmentName for RBAC names)."""
    if rule == "path":
        if name in (".", ".."):
            return [("FieldValueInvalid", path, f'Invalid value: "{name}": may not be \'{name}\'')]
        return [("FieldValueInvalid", path, f'Invalid value: "{name}": may not contain \'{bad}\'')
                for bad in ("/", "%") if bad in name]
    if rule == "dns1035":  # Service names
        causes = []
        if len(name) > 63:
            causes.append(("FieldValueInvalid", path, f'Invalid value: "{name}": must be no more than 63 characters'))
        if not _DNS1035.match(name):
            causes.append(("FieldValueInvalid", path,
                           f'Invalid value: "{name}": a DNS-1035 label must consist of lower case alphanumeric '
                           "characters or '-', start with an alphabetic character, and end with an alphanumeric "
                           "character (e.g. 'my-name', or 'abc-123', regex used for validation is "
                           "'[a-z]([-a-z0-9]*[a-z0-9])?')"))
        return causes
    if rule == "label":
        causes = []
        if len(name) > 63:
            causes.append(("FieldValueInvalid", path, f'Invalid value: "{name}": must be no more than 63 characters'))
        if not _LABEL.match(name):
            causes.append(("FieldValueInvalid", path,
                           f'Invalid value: "{name}": a lowercase RFC 1123 label must consist of lower case '
                           "alphanumeric characters or '-', and must start and end with an alphanumeric character "
                           f"(e.g. 'my-name', or '123-abc', regex used for validation is '{_LABEL_FMT}')"))
        return causes
    causes = []
    if len(name) > 253:
        causes.append(("FieldValueInvalid", path, f'Invalid value: "{name}": must be no more than 253 characters'))
    if not _SUBDOMAIN.match(name):
        causes.append(("FieldValueInvalid", path,
                       f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case '
                       "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character "
                       f"(e.g. 'example.com', regex used for validation is '{_SUBDOMAIN_FMT}')"))
    return causes


# -- pods ---------------------------------------------------------------------


def _pod_defaults(pod: dict) -> None:
    """The scheme's defaults (applied at decode, and again to what a mutating
    webhook's patch returns)."""
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    for group in ("initContainers", "containers"):
        for c in spec.get(group) or []:
            image = c.get("image", "")
            tag = image.rsplit("/", 1)[-1]
            latest = "@" not in image and (":" not in tag or tag.endswith(":latest"))
            c.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            res = c.setdefault("resources", {})
            limits = res.get("limits") or {}
            if limits:
                requests = res.setdefault("requests", {})
                for k, v in limits.items():
                    requests.setdefault(k, v)


def _pod_prepare_create(server: ApiServer, pod: dict) -> None:
    """The pod strategy's PrepareForCreate: after admission."""
    spec = pod.setdefault("spec", {})
    pod["status"] = {"phase": "Pending", "qosClass": _qos_class(spec)}
    if spec.get("schedulingGates"):
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                                        "message": "Scheduling is blocked due to non-empty scheduling gates",
                                        "lastProbeTime": None, "lastTransitionTime": _now()}]


def _qos_class(spec: dict) -> str:
    containers = (spec.get("containers") or []) + (spec.get("initContainers") or [])
    any_set, guaranteed = False, True
    for c in containers:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if req or lim:
            any_set = True
        for r in ("cpu", "memory"):
            if r not in lim or req.get(r, lim.get(r)) != lim.get(r):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _pod_validate(pod: dict) -> list:
    spec = pod.get("spec") or {}
    causes = []
    containers = spec.get("containers") or []
    if not containers:
        causes.append(("FieldValueRequired", "spec.containers", "Required value"))
    seen = set()
    for group in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(group) or []):
            name = c.get("name") or ""
            if not name:
                causes.append(("FieldValueRequired", f"spec.{group}[{i}].name", "Required value"))
            elif name in seen:
                causes.append(("FieldValueDuplicate", f"spec.{group}[{i}].name", f'Duplicate value: "{name}"'))
            seen.add(name)
            if not c.get("image"):
                causes.append(("FieldValueRequired", f"spec.{group}[{i}].image", "Required value"))
    if spec.get("schedulingGates") and spec.get("nodeName"):
        causes.append(("FieldValueForbidden", "spec.nodeName",
                       "Forbidden: cannot be set until all schedulingGates have been cleared"))
    return causes


_POD_MUTABLE = ("spec.containers[*].image, spec.initContainers[*].image, spec.activeDeadlineSeconds, "
                "spec.tolerations (only additions to existing tolerations), "
                "spec.terminationGracePeriodSeconds (allow it to be set to 1 if it was previously negative)")


def _pod_validate_update(server: ApiServer, new: dict, old: dict) -> list:
    causes = []
    ns, os_ = copy.deepcopy(new.get("spec") or {}), copy.deepcopy(old.get("spec") or {})
    old_gates = [g.get("name") for g in os_.get("schedulingGates") or []]
    new_gates = [g.get("name") for g in ns.get("schedulingGates") or []]
    for g in new_gates:
        if g not in old_gates:
            causes.append(("FieldValueForbidden", "spec.schedulingGates",
                           f"Forbidden: only deletion is allowed, but found new scheduling gate '{g}'"))
    gated = bool(old_gates)
    # what may change is set equal, then the rest must be identical
    for group in ("containers", "initContainers"):
        nl, ol = ns.get(group) or [], os_.get(group) or []
        if len(nl) == len(ol):
            for nc, oc in zip(nl, ol, strict=True):
                nc["image"] = oc.get("image")
    for k in ("activeDeadlineSeconds", "schedulingGates"):
        ns.pop(k, None)
        os_.pop(k, None)
    old_tol = os_.get("tolerations") or []
    new_tol = ns.get("tolerations") or []
    if all(t in new_tol for t in old_tol):
        ns.pop("tolerations", None)
        os_.pop("tolerations", None)
    if gated:  # KEP-3838: while gated, placement may only be narrowed
        causes.extend(_gated_narrowing_errors(ns, os_))
        ns.pop("nodeSelector", None)
        os_.pop("nodeSelector", None)
        for spec in (ns, os_):
            aff = spec.get("affinity")
            if isinstance(aff, dict):
                aff = {k: v for k, v in aff.items() if k != "nodeAffinity" and v}
                if aff:
                    spec["affinity"] = aff
                else:
                    spec.pop("affinity")
    if ns != os_:
        causes.append(("FieldValueForbidden", "spec",
                       f"Forbidden: pod updates may not change fields other than {_POD_MUTABLE}"))
    for hook in server.pod_update_hooks:
        causes.extend(hook(new, old))
    return causes


def _gated_narrowing_errors(new: dict, old: dict) -> list:
    """The real pod validation's rules (KEP-3838, GA 1.30) for a pod whose old
    version has scheduling gates: ``nodeSelector`` only gains entries; a nil
    ``nodeAffinity`` or one with no required terms may be set to anything;
    otherwise the required ``nodeSelectorTerms`` (ORed) keep their number and
    each term keeps its ``matchExpressions``/``matchFields`` (ANDed) as a
    prefix, new requirements appended; preferred terms are free."""
    causes = []
    old_sel, new_sel = old.get("nodeSelector") or {}, new.get("nodeSelector") or {}
    if any(k not in new_sel or new_sel[k] != v for k, v in old_sel.items()):
        causes.append(("FieldValueInvalid", "spec.nodeSelector",
                       f"Invalid value: {json.dumps(new_sel, sort_keys=True)}: only additions to spec.nodeSelector "
                       f"are allowed (no mutations or deletions)"))

    def terms(spec: dict) -> list | None:
        req = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
        return None if req is None else (req.get("nodeSelectorTerms") or [])

    old_terms, new_terms = terms(old), terms(new) or []
    if not old_terms:  # nil affinity, nil required, or no terms: anything may be set
        return causes
    path = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    if len(old_terms) != len(new_terms):
        causes.append(("FieldValueInvalid", path, f"Invalid value: {json.dumps(new_terms)}: no additions/deletions to "
                                                  f"non-empty NodeSelectorTerms list are allowed while pod is gated"))
        return causes
    for i, (o, n) in enumerate(zip(old_terms, new_terms, strict=True)):
        ok = True
        for k in ("matchExpressions", "matchFields"):
            ol, nl = o.get(k) or [], n.get(k) or []
            if len(nl) < len(ol) or nl[:len(ol)] != ol:
                ok = False
        if not ok:
            causes.append(("FieldValueInvalid", f"{path}[{i}]",
                           f"Invalid value: {json.dumps(n)}: only additions are allowed (no mutations or deletions) "
                           f"while pod is gated"))
    return causes


# -- other kinds --------------------------------------------------------------


# core/v1 IsStandardQuotaResourceName: the names without a "/" a ResourceQuota may limit
_STANDARD_QUOTA = frozenset({
    "pods", "services", "replicationcontrollers", "resourcequotas", "secrets", "configmaps",
    "persistentvolumeclaims", "services.nodeports", "services.loadbalancers", "cpu", "memory",
    "ephemeral-storage", "requests.cpu", "requests.memory", "requests.storage", "requests.ephemeral-storage",
    "limits.cpu", "limits.memory", "limits.ephemeral-storage"})


def _resource_quota_validate(obj: dict) -> list:
    """ValidateResourceQuota's ``spec.hard``: each name a qualified name (``limits.nvidia.com/gpumem``)
    or a standard quota resource, each value a quantity >= 0 (the real server refuses a malformed
    quantity while decoding; here it is the same field's 422)."""
    from hamid.request.quantity import quantity

    causes = []
    hard = (obj.get("spec") or {}).get("hard") or {}
    if not isinstance(hard, dict):
        return [("FieldValueInvalid", "spec.hard", "Invalid value: a map of resource names to quantities")]
    for k, v in hard.items():
        where = f"spec.hard[{k}]"
        if "/" not in k and k not in _STANDARD_QUOTA:
            causes.append(("FieldValueInvalid", where, f'Invalid value: "{k}": must be a standard resource for quota'))
        elif "/" in k and not re.fullmatch(r"[a-z0-9.-]+/[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", k):
            causes.append(("FieldValueInvalid", where, f'Invalid value: "{k}": must be a qualified name'))
        try:
            q = quantity(v)
        except ValueError:
            causes.append(("FieldValueInvalid", where, f"Invalid value: {_go_quote(str(v))}: quantities must match "
                           "the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"))
            continue
        if q < 0:
            causes.append(("FieldValueInvalid", where,
                           f"Invalid value: {_go_quote(str(v))}: must be greater than or equal to 0"))
    return causes


def _secret_prepare_create(server: ApiServer, obj: dict) -> None:
    _fold_string_data(obj)
    obj.setdefault("type", "Opaque")


def _fold_string_data(obj: dict) -> None:
    string_data = obj.pop("stringData", None) or {}
    if string_data:
        data = obj.setdefault("data", {})
        for k, v in string_data.items():
            data[k] = base64.b64encode(v.encode()).decode()


NODE_PORT_RANGE = (30000, 32767)  # kube-apiserver's default --service-node-port-range
_NODE_PORT_TYPES = ("NodePort", "LoadBalancer")


def _service_defaults(obj: dict) -> None:
    """core/v1 SetDefaults_Service (and the strategy's traffic policies)."""
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    for p in spec.get("ports") or []:
        if isinstance(p, dict):
            p.setdefault("protocol", "TCP")
            p.setdefault("targetPort", p.get("port"))
    if spec["type"] in _NODE_PORT_TYPES:
        spec.setdefault("externalTrafficPolicy", "Cluster")
    if spec["type"] != "ExternalName":
        spec.setdefault("internalTrafficPolicy", "Cluster")


def _node_ports_in_use(server: ApiServer, skip: tuple[str, str] | None) -> set[int]:
    with server._cond:
        return {int(p["nodePort"]) for (sk, ns, name), o in server._objects.items()
                if sk == "services" and (ns, name) != skip
                for p in (o.get("spec") or {}).get("ports") or [] if p.get("nodePort")}


def _allocate_node_ports(server: ApiServer, obj: dict, keep: set[int]) -> None:
    """The service REST's node port allocator: a given ``nodePort`` must lie
    in :data:`NODE_PORT_RANGE` and be free (ports in ``keep``, the old
    object's, are this service's own); a missing one is allocated (random,
    as the real allocator)."""
    import random
    meta, spec = obj["metadata"], obj["spec"]
    name = meta.get("name") or meta.get("generateName") or ""
    used = _node_ports_in_use(server, (meta.get("namespace", ""), meta.get("name") or ""))
    lo, hi = NODE_PORT_RANGE
    rt = server.types[("", "v1", "services")]
    for i, p in enumerate(spec.get("ports") or []):
        port = p.get("nodePort")
        if port:
            if port in keep:
                continue
            why = None
            if not isinstance(port, int) or not lo <= port <= hi:
                why = f"provided port is not in the valid range. The range of valid ports is {lo}-{hi}"
            elif port in used:
                why = "provided port is already allocated"
            if why:
                raise invalid(rt, name, [("FieldValueInvalid", f"spec.ports[{i}].nodePort",
                                          f"Invalid value: {json.dumps(port)}: {why}")])
            used.add(port)
        else:
            free = [n for n in range(lo, hi + 1) if n not in used]
            if not free:
                raise ApiError(500, "InternalError", "Internal error occurred: failed to allocate a nodePort: "
                                                     "range is full")
            p["nodePort"] = random.choice(free)
            used.add(p["nodePort"])


def _service_prepare_create(server: ApiServer, obj: dict) -> None:
    spec = obj.setdefault("spec", {})
    _service_defaults(obj)
    if spec["type"] != "ExternalName":
        if spec.get("clusterIP") in (None, "") and spec.get("clusterIPs"):
            spec["clusterIP"] = spec["clusterIPs"][0]
        if spec.get("clusterIP") in (None, ""):
            spec["clusterIP"] = server._allocate_cluster_ip()
        spec["clusterIPs"] = [spec["clusterIP"]]
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
    if spec["type"] in _NODE_PORT_TYPES:
        _allocate_node_ports(server, obj, set())
    obj["status"] = {"loadBalancer": {}}


def _service_prepare_update(server: ApiServer, new: dict, old: dict) -> None:
    """The service REST's patchAllocatedValues and node port update: an
    update that leaves out the clusterIP or a port's nodePort keeps the
    allocated one (node ports matched by port name); new node ports are
    checked and allocated, as at create."""
    ns, os_ = new.setdefault("spec", {}), old.get("spec") or {}
    if ns.get("type") != "ExternalName" and os_.get("type") != "ExternalName":
        if ns.get("clusterIP") in (None, ""):
            ns["clusterIP"] = os_.get("clusterIP")
        if not ns.get("clusterIPs"):
            ns["clusterIPs"] = list(os_.get("clusterIPs") or [ns["clusterIP"]])
        for k in ("ipFamilies", "ipFamilyPolicy"):
            if k in os_:
                ns.setdefault(k, copy.deepcopy(os_[k]))
    if ns.get("type") in _NODE_PORT_TYPES:
        old_ports = {p.get("nodePort") for p in os_.get("ports") or [] if p.get("nodePort")} \
            if os_.get("type") in _NODE_PORT_TYPES else set()
        new_ports = {p.get("nodePort") for p in ns.get("ports") or [] if p.get("nodePort")}
        by_name = {p.get("name", ""): p.get("nodePort") for p in os_.get("ports") or []}
        for p in ns.get("ports") or []:
            if not p.get("nodePort") and by_name.get(p.get("name", "")) in old_ports - new_ports:
                p["nodePort"] = by_name[p.get("name", "")]
        _allocate_node_ports(server, new, old_ports)


def _go_strings(values) -> str:
    if values is None:
        return "[]string(nil)"
    return "[]string{" + ", ".join(json.dumps(v) for v in values) + "}"


def _service_validate(obj: dict) -> list:
    """The cheap parts of ValidateService."""
    spec = obj.get("spec") or {}
    causes = []
    types = ("ClusterIP", "ExternalName", "LoadBalancer", "NodePort")
    if spec.get("type") not in types:
        causes.append(("FieldValueNotSupported", "spec.type", f'Unsupported value: "{spec.get("type")}": supported '
                                                               f'values: {", ".join(json.dumps(t) for t in types)}'))
    ports = spec.get("ports") or []
    if not ports and spec.get("type") != "ExternalName" and spec.get("clusterIP") != "None":
        causes.append(("FieldValueRequired", "spec.ports", "Required value"))
    seen = set()
    for i, p in enumerate(ports):
        port = p.get("port")
        if not isinstance(port, int) or not 1 <= port <= 65535:
            causes.append(("FieldValueInvalid", f"spec.ports[{i}].port",
                           f"Invalid value: {json.dumps(port)}: must be between 1 and 65535, inclusive"))
        if len(ports) > 1 and not p.get("name"):
            causes.append(("FieldValueRequired", f"spec.ports[{i}].name", "Required value"))
        if p.get("name"):
            if p["name"] in seen:
                causes.append(("FieldValueDuplicate", f"spec.ports[{i}].name", f'Duplicate value: "{p["name"]}"'))
            seen.add(p["name"])
        if p.get("nodePort") and spec.get("type") == "ClusterIP":
            causes.append(("FieldValueForbidden", f"spec.ports[{i}].nodePort",
                           "Forbidden: may not be used when `type` is 'ClusterIP'"))
    return causes


def _service_validate_update(server: ApiServer, new: dict, old: dict) -> list:
    ns, os_ = new.get("spec") or {}, old.get("spec") or {}
    causes = []
    if "ExternalName" not in (ns.get("type"), os_.get("type")):
        new_ips, old_ips = ns.get("clusterIPs") or [], os_.get("clusterIPs") or []
        for i, ip in enumerate(new_ips[:len(old_ips)]):
            if ip != old_ips[i]:
                causes.append(("FieldValueInvalid", f"spec.clusterIPs[{i}]",
                               f"Invalid value: {_go_strings(new_ips)}: may not change once set"))
    return causes


def _namespace_prepare_create(server: ApiServer, obj: dict) -> None:
    obj.setdefault("spec", {"finalizers": ["kubernetes"]})
    obj["status"] = {"phase": "Active"}
    obj.setdefault("metadata", {}).setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]


def _node_prepare_create(server: ApiServer, obj: dict) -> None:
    labels = obj.setdefault("metadata", {}).setdefault("labels", {})
    labels.setdefault("kubernetes.io/hostname", obj["metadata"]["name"])


# events: the core Event is the storage shape; events.k8s.io/v1 is converted.
_EVENT_RENAMES = [  # (events.k8s.io/v1 field, core v1 field)
    ("note", "message"), ("regarding", "involvedObject"), ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"), ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"), ("deprecatedCount", "count"),
]
_EVENT_SAME = ("metadata", "related", "reportingInstance", "action", "reason", "type", "eventTime", "series")


def _event_from_storage(core: dict) -> dict:
    out = {"kind": "Event", "apiVersion": "events.k8s.io/v1"}
    for k in _EVENT_SAME:
        if k in core:
            out[k] = copy.deepcopy(core[k])
    for new, old in _EVENT_RENAMES:
        if core.get(old) not in (None, "", 0, {}):
            out[new] = copy.deepcopy(core[old])
    return out


def _event_to_storage(ev: dict) -> dict:
    out = {"kind": "Event", "apiVersion": "v1"}
    for k in _EVENT_SAME:
        if k in ev:
            out[k] = copy.deepcopy(ev[k])
    for new, old in _EVENT_RENAMES:
        if new in ev:
            out[old] = copy.deepcopy(ev[new])
    return out


_EVENT_FIELDS = {
    "involvedObject.kind": "involvedObject.kind", "involvedObject.namespace": "involvedObject.namespace",
    "involvedObject.name": "involvedObject.name", "involvedObject.uid": "involvedObject.uid",
    "involvedObject.apiVersion": "involvedObject.apiVersion",
    "involvedObject.resourceVersion": "involvedObject.resourceVersion",
    "involvedObject.fieldPath": "involvedObject.fieldPath", "reason": "reason",
    "reportingComponent": "reportingComponent", "source": "source.component", "type": "type",
}
_EVENT_V1_FIELDS = {
    "regarding.kind": "involvedObject.kind", "regarding.namespace": "involvedObject.namespace",
    "regarding.name": "involvedObject.name", "regarding.uid": "involvedObject.uid",
    "regarding.apiVersion": "involvedObject.apiVersion",
    "regarding.resourceVersion": "involvedObject.resourceVersion",
    "regarding.fieldPath": "involvedObject.fieldPath", "reason": "reason",
    "reportingController": "reportingComponent", "type": "type",
}
# -- admission webhook configurations -----------------------------------------

_WEBHOOK_OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT", "*")


def _webhook_defaults(obj: dict) -> None:
    """admissionregistration.k8s.io/v1 defaulting, as the real server stores it."""
    mutating = obj.get("kind") == "MutatingWebhookConfiguration"
    for wh in obj.get("webhooks") or []:
        if not isinstance(wh, dict):
            continue
        wh.setdefault("failurePolicy", "Fail")
        wh.setdefault("matchPolicy", "Equivalent")
        wh.setdefault("namespaceSelector", {})
        wh.setdefault("objectSelector", {})
        wh.setdefault("timeoutSeconds", 10)
        if mutating:
            wh.setdefault("reinvocationPolicy", "Never")
        for rule in wh.get("rules") or []:
            if isinstance(rule, dict):
                rule.setdefault("scope", "*")
        svc = (wh.get("clientConfig") or {}).get("service")
        if isinstance(svc, dict):
            svc.setdefault("port", 443)


def _webhook_config_prepare(server: ApiServer, obj: dict) -> None:
    _webhook_defaults(obj)


def _webhook_config_validate(obj: dict) -> list:
    """The real validation's checks and messages, plus the stand-in's own
    limits (v1 reviews only, reinvocationPolicy Never, no matchConditions),
    refused rather than ignored."""
    _webhook_defaults(obj)  # updates are defaulted too
    causes: list[tuple[str, str, str]] = []
    mutating = obj.get("kind") == "MutatingWebhookConfiguration"
    names: set[str] = set()
    for i, wh in enumerate(obj.get("webhooks") or []):
        p = f"webhooks[{i}]"
        if not isinstance(wh, dict):
            causes.append(("FieldValueInvalid", p, "Invalid value: a webhook must be an object"))
            continue
        name = wh.get("name") or ""
        if not name:
            causes.append(("FieldValueRequired", f"{p}.name", "Required value"))
        elif name.count(".") < 2 or not _SUBDOMAIN.match(name):
            causes.append(("FieldValueInvalid", f"{p}.name",
                           f'Invalid value: "{name}": should be a domain with at least three segments separated '
                           f"by dots"))
        elif name in names:
            causes.append(("FieldValueDuplicate", f"{p}.name", f'Duplicate value: "{name}"'))
        names.add(name)
        versions = wh.get("admissionReviewVersions") or []
        if not versions:
            causes.append(("FieldValueRequired", f"{p}.admissionReviewVersions",
                           "Required value: must specify one of v1, v1beta1"))
        elif "v1" not in versions:
            causes.append(("FieldValueInvalid", f"{p}.admissionReviewVersions",
                           f"Invalid value: {json.dumps(versions)}: the API-server stand-in sends "
                           f"admission.k8s.io/v1 reviews only: include v1"))
        side = wh.get("sideEffects")
        if not side:
            causes.append(("FieldValueRequired", f"{p}.sideEffects",
                           "Required value: must specify one of None, NoneOnDryRun"))
        elif side not in ("None", "NoneOnDryRun"):
            causes.append(("FieldValueNotSupported", f"{p}.sideEffects",
                           f'Unsupported value: "{side}": supported values: "None", "NoneOnDryRun"'))
        timeout = wh.get("timeoutSeconds")
        if not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= 30:
            causes.append(("FieldValueInvalid", f"{p}.timeoutSeconds",
                           f"Invalid value: {json.dumps(timeout)}: the timeout value must be between 1 and 30 "
                           f"seconds"))
        if wh.get("failurePolicy") not in ("Fail", "Ignore"):
            causes.append(("FieldValueNotSupported", f"{p}.failurePolicy",
                           f'Unsupported value: "{wh.get("failurePolicy")}": supported values: "Fail", "Ignore"'))
        if wh.get("matchPolicy") not in ("Exact", "Equivalent"):
            causes.append(("FieldValueNotSupported", f"{p}.matchPolicy",
                           f'Unsupported value: "{wh.get("matchPolicy")}": supported values: "Equivalent", '
                           f'"Exact"'))
        if mutating and wh.get("reinvocationPolicy") != "Never":
            causes.append(("FieldValueNotSupported", f"{p}.reinvocationPolicy",
                           f'Unsupported value: "{wh.get("reinvocationPolicy")}": the API-server stand-in '
                           f'implements "Never" only'))
        if wh.get("matchConditions"):
            causes.append(("FieldValueForbidden", f"{p}.matchConditions",
                           "Forbidden: the API-server stand-in has no CEL: leave matchConditions out"))
        cc = wh.get("clientConfig") or {}
        if bool(cc.get("url")) == bool(cc.get("service")):
            causes.append(("FieldValueRequired", f"{p}.clientConfig",
                           "Required value: exactly one of url or service is required"))
        elif cc.get("url"):
            u = urlsplit(cc["url"])
            if u.scheme != "https":
                causes.append(("FieldValueInvalid", f"{p}.clientConfig.url",
                               f"Invalid value: \"{cc['url']}\": 'https' is the only allowed URL scheme"))
            elif u.username or u.password or u.query or u.fragment or not u.hostname:
                causes.append(("FieldValueInvalid", f"{p}.clientConfig.url",
                               f"Invalid value: \"{cc['url']}\": a host is required and user info, query "
                               f"parameters and fragments are not allowed"))
        else:
            svc = cc["service"]
            for k in ("namespace", "name"):
                if not svc.get(k):
                    causes.append(("FieldValueRequired", f"{p}.clientConfig.service.{k}", "Required value"))
            port = svc.get("port")
            if not isinstance(port, int) or not 1 <= port <= 65535:
                causes.append(("FieldValueInvalid", f"{p}.clientConfig.service.port",
                               f"Invalid value: {json.dumps(port)}: port is not valid: must be between 1 and 65535"))
            if svc.get("path") and not str(svc["path"]).startswith("/"):
                causes.append(("FieldValueInvalid", f"{p}.clientConfig.service.path",
                               f"Invalid value: \"{svc['path']}\": must start with a '/'"))
        if cc.get("caBundle"):
            try:
                base64.b64decode(cc["caBundle"], validate=True)
            except (ValueError, TypeError):
                causes.append(("FieldValueInvalid", f"{p}.clientConfig.caBundle",
                               "Invalid value: a caBundle is base64-encoded PEM (JSON []byte)"))
        for j, rule in enumerate(wh.get("rules") or []):
            rp = f"{p}.rules[{j}]"
            for k in ("operations", "apiGroups", "apiVersions", "resources"):
                if not rule.get(k):
                    causes.append(("FieldValueRequired", f"{rp}.{k}", "Required value"))
            for op in rule.get("operations") or []:
                if op not in _WEBHOOK_OPERATIONS:
                    causes.append(("FieldValueNotSupported", f"{rp}.operations",
                                   f'Unsupported value: "{op}": supported values: "*", "CONNECT", "CREATE", '
                                   f'"DELETE", "UPDATE"'))
            if rule.get("scope") not in ("*", "Cluster", "Namespaced"):
                causes.append(("FieldValueNotSupported", f"{rp}.scope",
                               f'Unsupported value: "{rule.get("scope")}": supported values: "*", "Cluster", '
                               f'"Namespaced"'))
    return causes


# -- service accounts, RBAC, daemon sets ------------------------------------------

RBAC_GROUP = "rbac.authorization.k8s.io"


def _go_quote(v) -> str:
    return json.dumps("" if v is None else str(v))


def _go_map(m) -> str:
    """A map[string]string as Go's %#v prints it (keys sorted)."""
    if m is None:
        return "map[string]string(nil)"
    return "map[string]string{" + ", ".join(f"{_go_quote(k)}:{_go_quote(v)}" for k, v in sorted(m.items())) + "}"


def _go_label_selector(sel: dict) -> str:
    """A metav1.LabelSelector as Go's %#v prints it (field.Invalid's value)."""
    exprs = sel.get("matchExpressions")
    if exprs is None:
        shown = "[]v1.LabelSelectorRequirement(nil)"
    else:
        shown = "[]v1.LabelSelectorRequirement{" + ", ".join(
            f"v1.LabelSelectorRequirement{{Key:{_go_quote(e.get('key'))}, Operator:{_go_quote(e.get('operator'))}, "
            f"Values:{_go_strings(e.get('values'))}}}" for e in exprs) + "}"
    return f"v1.LabelSelector{{MatchLabels:{_go_map(sel.get('matchLabels'))}, MatchExpressions:{shown}}}"


def _selector_errors(sel: dict | None, path: str) -> list:
    """metav1validation.ValidateLabelSelector's requirement checks."""
    causes = []
    if not isinstance(sel, dict):
        return causes
    for i, e in enumerate(sel.get("matchExpressions") or []):
        p = f"{path}.matchExpressions[{i}]"
        op, values = e.get("operator"), e.get("values") or []
        if op in ("In", "NotIn"):
            if not values:
                causes.append(("FieldValueRequired", f"{p}.values",
                               "Required value: must be specified when `operator` is 'In' or 'NotIn'"))
        elif op in ("Exists", "DoesNotExist"):
            if values:
                causes.append(("FieldValueForbidden", f"{p}.values",
                               "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"))
        else:
            causes.append(("FieldValueInvalid", f"{p}.operator",
                           f"Invalid value: {_go_quote(op)}: not a valid selector operator"))
        if not e.get("key"):
            causes.append(("FieldValueInvalid", f"{p}.key", 'Invalid value: "": name part must be non-empty'))
    return causes


def _selector_selects(sel: dict | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelectorAsSelector(sel).Matches(labels): a nil selector
    selects nothing, an empty one everything."""
    if sel is None:
        return False
    return label_selector_matches(sel, labels) if sel else True


def _policy_rule_errors(rules, namespaced: bool) -> list:
    """ValidatePolicyRule for each of ``rules``."""
    causes = []
    for i, rule in enumerate(rules or []):
        p = f"rules[{i}]"
        if not isinstance(rule, dict):
            causes.append(("FieldValueInvalid", p, "Invalid value: a rule must be an object"))
            continue
        if not rule.get("verbs"):
            causes.append(("FieldValueRequired", f"{p}.verbs", "Required value: verbs must contain at least one value"))
        urls = rule.get("nonResourceURLs")
        if urls:
            if namespaced:
                causes.append(("FieldValueInvalid", f"{p}.nonResourceURLs",
                               f"Invalid value: {_go_strings(urls)}: namespaced rules cannot apply to non-resource "
                               f"URLs"))
            if rule.get("apiGroups") or rule.get("resources") or rule.get("resourceNames"):
                causes.append(("FieldValueInvalid", f"{p}.nonResourceURLs",
                               f"Invalid value: {_go_strings(urls)}: rules cannot apply to both regular resources "
                               f"and non-resource URLs"))
            continue
        if not rule.get("apiGroups"):
            causes.append(("FieldValueRequired", f"{p}.apiGroups",
                           "Required value: resource rules must supply at least one api group"))
        if not rule.get("resources"):
            causes.append(("FieldValueRequired", f"{p}.resources",
                           "Required value: resource rules must supply at least one resource"))
    return causes


def _role_validate(obj: dict) -> list:
    return _policy_rule_errors(obj.get("rules"), obj.get("kind") == "Role")


def _binding_defaults(obj: dict) -> None:
    """rbac/v1 SetDefaults_RoleBinding, _ClusterRoleBinding and _Subject."""
    ref = obj.get("roleRef")
    if isinstance(ref, dict) and not ref.get("apiGroup"):
        ref["apiGroup"] = RBAC_GROUP
    for sub in obj.get("subjects") or []:
        if isinstance(sub, dict) and not sub.get("apiGroup") and sub.get("kind") in ("User", "Group"):
            sub["apiGroup"] = RBAC_GROUP


def _binding_validate(obj: dict) -> list:
    """ValidateRoleBinding / ValidateClusterRoleBinding and ValidateRoleBindingSubject."""
    namespaced = obj.get("kind") == "RoleBinding"
    ref = obj.get("roleRef") or {}
    causes = []
    if ref.get("apiGroup") != RBAC_GROUP:
        causes.append(("FieldValueNotSupported", "roleRef.apiGroup",
                       f'Unsupported value: {_go_quote(ref.get("apiGroup"))}: supported values: "{RBAC_GROUP}"'))
    kinds = ("Role", "ClusterRole") if namespaced else ("ClusterRole",)
    if ref.get("kind") not in kinds:
        causes.append(("FieldValueNotSupported", "roleRef.kind",
                       f'Unsupported value: {_go_quote(ref.get("kind"))}: supported values: '
                       f'{", ".join(json.dumps(k) for k in kinds)}'))
    if not ref.get("name"):
        causes.append(("FieldValueRequired", "roleRef.name", "Required value"))
    else:
        causes.extend(_name_errors(str(ref["name"]), "path", "roleRef.name"))
    for i, sub in enumerate(obj.get("subjects") or []):
        p = f"subjects[{i}]"
        if not isinstance(sub, dict):
            causes.append(("FieldValueInvalid", p, "Invalid value: a subject must be an object"))
            continue
        if not sub.get("name"):
            causes.append(("FieldValueRequired", f"{p}.name", "Required value"))
        kind = sub.get("kind")
        if kind == "ServiceAccount":
            if sub.get("name"):
                causes.extend(_name_errors(str(sub["name"]), "subdomain", f"{p}.name"))
            if sub.get("apiGroup"):
                causes.append(("FieldValueNotSupported", f"{p}.apiGroup",
                               f'Unsupported value: {_go_quote(sub["apiGroup"])}: supported values: ""'))
            if not namespaced and not sub.get("namespace"):
                causes.append(("FieldValueRequired", f"{p}.namespace", "Required value"))
        elif kind in ("User", "Group"):
            if sub.get("apiGroup") != RBAC_GROUP:
                causes.append(("FieldValueNotSupported", f"{p}.apiGroup",
                               f'Unsupported value: {_go_quote(sub.get("apiGroup"))}: supported values: '
                               f'"{RBAC_GROUP}"'))
        else:
            causes.append(("FieldValueNotSupported", f"{p}.kind",
                           f'Unsupported value: {_go_quote(kind)}: supported values: "ServiceAccount", "User", '
                           f'"Group"'))
    return causes


def _binding_validate_update(server: ApiServer, new: dict, old: dict) -> list:
    ref, oref = new.get("roleRef") or {}, old.get("roleRef") or {}
    if any(ref.get(k) != oref.get(k) for k in ("apiGroup", "kind", "name")):
        shown = (f"rbac.RoleRef{{APIGroup:{_go_quote(ref.get('apiGroup'))}, Kind:{_go_quote(ref.get('kind'))}, "
                 f"Name:{_go_quote(ref.get('name'))}}}")
        return [("FieldValueInvalid", "roleRef", f"Invalid value: {shown}: cannot change roleRef")]
    return []


TEMPLATE_GENERATION = "deprecated.daemonset.template.generation"  # apps/v1's spec.templateGeneration


def _daemonset_defaults(obj: dict) -> None:
    """apps/v1 SetDefaults_DaemonSet and the pod template's defaults."""
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    strategy = spec.setdefault("updateStrategy", {})
    strategy.setdefault("type", "RollingUpdate")
    if strategy["type"] == "RollingUpdate":
        rolling = strategy.setdefault("rollingUpdate", {})
        rolling.setdefault("maxUnavailable", 1)
        rolling.setdefault("maxSurge", 0)
    spec.setdefault("revisionHistoryLimit", 10)
    template = spec.setdefault("template", {})
    if isinstance(template, dict):
        had_priority = "priority" in (template.get("spec") or {})
        _pod_defaults(template)
        if not had_priority:
            template["spec"].pop("priority", None)  # the Priority admission plugin's, for pods only


def _daemonset_prepare_create(server: ApiServer, obj: dict) -> None:
    obj["status"] = {"currentNumberScheduled": 0, "numberMisscheduled": 0, "desiredNumberScheduled": 0,
                     "numberReady": 0}
    annotations = obj["metadata"].setdefault("annotations", {})
    try:
        generation = int(annotations.get(TEMPLATE_GENERATION, "0"))
    except ValueError:
        generation = 0
    annotations[TEMPLATE_GENERATION] = str(max(generation, 1))


def _daemonset_prepare_update(server: ApiServer, new: dict, old: dict) -> None:
    """PrepareForUpdate: the template generation is the server's, +1 when the template changed."""
    try:
        generation = int((old["metadata"].get("annotations") or {}).get(TEMPLATE_GENERATION, "1"))
    except ValueError:
        generation = 1
    if (new.get("spec") or {}).get("template") != (old.get("spec") or {}).get("template"):
        generation += 1
    new["metadata"].setdefault("annotations", {})[TEMPLATE_GENERATION] = str(generation)


def _daemonset_validate(obj: dict) -> list:
    """ValidateDaemonSetSpec's checks: the selector, the template's labels
    against it, the pod template (containers), restartPolicy Always."""
    spec = obj.get("spec") or {}
    sel = spec.get("selector")
    template = spec.get("template") or {}
    labels = (template.get("metadata") or {}).get("labels")
    causes = _selector_errors(sel, "spec.selector")
    if not causes and not _selector_selects(sel, labels or {}):
        causes.append(("FieldValueInvalid", "spec.template.metadata.labels",
                       f"Invalid value: {_go_map(labels)}: `selector` does not match template `labels`"))
    if isinstance(sel, dict) and not (sel.get("matchLabels") or sel.get("matchExpressions")):
        causes.append(("FieldValueInvalid", "spec.selector",
                       f"Invalid value: {_go_label_selector(sel)}: empty selector is invalid for daemonset"))
    tspec = template.get("spec") or {}
    causes.extend((r, f"spec.template.{f}", m) for r, f, m in _pod_validate({"spec": tspec}))
    if tspec.get("restartPolicy", "Always") != "Always":
        causes.append(("FieldValueNotSupported", "spec.template.spec.restartPolicy",
                       f'Unsupported value: {_go_quote(tspec["restartPolicy"])}: supported values: "Always"'))
    if tspec.get("activeDeadlineSeconds") is not None:
        causes.append(("FieldValueForbidden", "spec.template.spec.activeDeadlineSeconds",
                       "Forbidden: activeDeadlineSeconds in DaemonSet is not Supported"))
    return causes


def _daemonset_validate_update(server: ApiServer, new: dict, old: dict) -> list:
    """apps/v1 forbids changing the selector."""
    sel, osel = (new.get("spec") or {}).get("selector"), (old.get("spec") or {}).get("selector")
    if sel != osel:
        shown = "null" if sel is None else _go_label_selector(sel)
        return [("FieldValueInvalid", "spec.selector", f"Invalid value: {shown}: field is immutable")]
    return []


def _with_template(keys: Mapping[str, str]) -> dict:
    return {f"spec.template.{k}": v for k, v in keys.items() if k.startswith("spec.")}


DAEMONSET_MERGE_KEYS = {**META_MERGE_KEYS, **_with_template(POD_MERGE_KEYS), "status.conditions": "type"}
SERVICE_ACCOUNT_MERGE_KEYS = {**META_MERGE_KEYS, "secrets": "name", "imagePullSecrets": "name"}


_ALL_VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")


BUILTIN_TYPES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "Namespace", "namespaces", False, ("ns",), (), ("status",),
                 {"status.phase": "status.phase"}, META_MERGE_KEYS, name_rule="label",
                 status_reset_on_create=True, prepare_create=_namespace_prepare_create, return_deleted_object=True),
    ResourceType("", "v1", "Pod", "pods", True, ("po",), ("all",), ("status", "binding"),
                 {"spec.nodeName": "spec.nodeName", "spec.restartPolicy": "spec.restartPolicy",
                  "spec.schedulerName": "spec.schedulerName", "spec.serviceAccountName": "spec.serviceAccountName",
                  "spec.hostNetwork": lambda o: bool(_get(o, "spec.hostNetwork")),
                  "status.phase": "status.phase", "status.podIP": "status.podIP",
                  "status.nominatedNodeName": "status.nominatedNodeName"},
                 POD_MERGE_KEYS, generation=True, graceful=True, return_deleted_object=True,
                 status_reset_on_create=True, defaults=_pod_defaults, prepare_create=_pod_prepare_create,
                 validate=_pod_validate,
                 validate_update=_pod_validate_update),
    ResourceType("", "v1", "Node", "nodes", False, ("no",), (), ("status",),
                 {"spec.unschedulable": lambda o: bool(_get(o, "spec.unschedulable"))},
                 NODE_MERGE_KEYS, prepare_create=_node_prepare_create, return_deleted_object=False),
    ResourceType("", "v1", "Event", "events", True, ("ev",), (), (), _EVENT_FIELDS, META_MERGE_KEYS),
    ResourceType("events.k8s.io", "v1", "Event", "events", True, ("ev",), (), (), _EVENT_V1_FIELDS,
                 META_MERGE_KEYS, storage="events", to_storage=_event_to_storage,
                 from_storage=_event_from_storage),
    ResourceType("coordination.k8s.io", "v1", "Lease", "leases", True, (), (), (), {}, META_MERGE_KEYS),
    ResourceType("", "v1", "ConfigMap", "configmaps", True, ("cm",), (), (), {}, META_MERGE_KEYS),
    ResourceType("", "v1", "ResourceQuota", "resourcequotas", True, ("quota",), (), ("status",), {},
                 META_MERGE_KEYS, status_reset_on_create=True, return_deleted_object=True,
                 validate=_resource_quota_validate),
    ResourceType("", "v1", "Secret", "secrets", True, (), (), (), {"type": "type"}, META_MERGE_KEYS,
                 prepare_create=_secret_prepare_create),
    ResourceType("", "v1", "Service", "services", True, ("svc",), ("all",), ("status",), {},
                 SERVICE_MERGE_KEYS, name_rule="dns1035", return_deleted_object=True,
                 status_reset_on_create=True, defaults=_service_defaults, prepare_create=_service_prepare_create,
                 prepare_update=_service_prepare_update, validate=_service_validate,
                 validate_update=_service_validate_update),
    ResourceType("", "v1", "ServiceAccount", "serviceaccounts", True, ("sa",), (), (), {},
                 SERVICE_ACCOUNT_MERGE_KEYS, return_deleted_object=True),
    ResourceType("apps", "v1", "DaemonSet", "daemonsets", True, ("ds",), ("all",), ("status",), {},
                 DAEMONSET_MERGE_KEYS, generation=True, status_reset_on_create=True, defaults=_daemonset_defaults,
                 prepare_create=_daemonset_prepare_create, prepare_update=_daemonset_prepare_update,
                 validate=_daemonset_validate, validate_update=_daemonset_validate_update),
    ResourceType(RBAC_GROUP, "v1", "ClusterRole", "clusterroles", False, (), (), (), {}, META_MERGE_KEYS,
                 name_rule="path", validate=_role_validate),
    ResourceType(RBAC_GROUP, "v1", "ClusterRoleBinding", "clusterrolebindings", False, (), (), (), {},
                 META_MERGE_KEYS, name_rule="path", defaults=_binding_defaults, validate=_binding_validate,
                 validate_update=_binding_validate_update),
    ResourceType(RBAC_GROUP, "v1", "Role", "roles", True, (), (), (), {}, META_MERGE_KEYS, name_rule="path",
                 validate=_role_validate),
    ResourceType(RBAC_GROUP, "v1", "RoleBinding", "rolebindings", True, (), (), (), {}, META_MERGE_KEYS,
                 name_rule="path", defaults=_binding_defaults, validate=_binding_validate,
                 validate_update=_binding_validate_update),
    ResourceType("admissionregistration.k8s.io", "v1", "MutatingWebhookConfiguration",
                 "mutatingwebhookconfigurations", False, (), ("api-extensions",), (), {}, WEBHOOK_MERGE_KEYS,
                 generation=True, prepare_create=_webhook_config_prepare, validate=_webhook_config_validate),
    ResourceType("admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration",
                 "validatingwebhookconfigurations", False, (), ("api-extensions",), (), {}, WEBHOOK_MERGE_KEYS,
                 generation=True, prepare_create=_webhook_config_prepare, validate=_webhook_config_validate),
    # stored and served as the chart applies them; neither enforced (no CNI, no CEL here: the chart's
    # tests evaluate the policy's CEL with cel-python)
    ResourceType("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", True, ("netpol",), (), (), {},
                 META_MERGE_KEYS, generation=True),
    ResourceType("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicy", "validatingadmissionpolicies",
                 False, (), ("api-extensions",), ("status",), {}, META_MERGE_KEYS, generation=True),
    ResourceType("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicyBinding",
                 "validatingadmissionpolicybindings", False, (), ("api-extensions",), (), {}, META_MERGE_KEYS,
                 generation=True),
)

# ---------------------------------------------------------------------------
# selectors

_LABEL_REQ = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9_./-]+)\s*"
    r"(?:(?P<op>==|=|!=|>|<)\s*(?P<value>[A-Za-z0-9_.-]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?\s*$")


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in (p.strip() for p in parts) if p]


def parse_label_selector(text: str) -> Callable[[Mapping[str, str]], bool]:
    """A ``labelSelector`` query parameter as a predicate over labels."""
    reqs = []
    for part in _split_top(text):
        m = _LABEL_REQ.match(part)
        if not m or (m.group("neg") and (m.group("op") or m.group("setop"))):
            raise bad_request(f"unable to parse requirement: invalid label selector: {part!r}")
        key = m.group("key")
        if m.group("neg"):
            reqs.append(lambda lb, k=key: k not in lb)
        elif m.group("setop"):
            values = {v.strip() for v in m.group("values").split(",") if v.strip()}
            if m.group("setop") == "in":
                reqs.append(lambda lb, k=key, vs=values: lb.get(k) in vs)
            else:
                reqs.append(lambda lb, k=key, vs=values: lb.get(k) not in vs)
        elif m.group("op"):
            op, value = m.group("op"), m.group("value")
            if op in ("=", "=="):
                reqs.append(lambda lb, k=key, v=value: lb.get(k) == v)
            elif op == "!=":
                reqs.append(lambda lb, k=key, v=value: lb.get(k) != v)
            else:
                try:
                    bound = int(value)
                except ValueError:
                    raise bad_request(f"unable to parse requirement: for 'Gt', 'Lt' operators, the value must "
                                      f"be an integer: {value!r}") from None
                def cmp(lb, k=key, b=bound, gt=(op == ">")):
                    try:
                        n = int(lb[k])
                    except (KeyError, ValueError):
                        return False
                    return n > b if gt else n < b
                reqs.append(cmp)
        else:
            reqs.append(lambda lb, k=key: k in lb)
    return lambda labels: all(r(labels) for r in reqs)


def parse_field_selector(rt: ResourceType, text: str) -> Callable[[dict], bool]:
    """A ``fieldSelector`` query parameter as a predicate over objects; an
    unknown label is the real server's 400."""
    reqs = []
    for part in _split_top(text):
        m = re.match(r"^([^=!]+?)\s*(==|=|!=)\s*(.*)$", part)
        if not m:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        label, op, value = m.group(1).strip(), m.group(2), m.group(3).strip()
        if label not in ("metadata.name", "metadata.namespace") and label not in rt.field_labels:
            raise bad_request(f'field label not supported: {label}')
        reqs.append((label, op == "!=", value))

    def match(obj: dict) -> bool:
        for label, negate, value in reqs:
            have = rt.field_value(obj, label)
            if (have == value) == negate:
                return False
        return True

    return match


# ---------------------------------------------------------------------------
# authentication and authorization (RBAC)

USER_INFO = {"username": "system:admin", "groups": ["system:masters", "system:authenticated"]}
ANONYMOUS = {"username": "system:anonymous", "groups": ["system:unauthenticated"]}
MASTERS = "system:masters"  # user.SystemPrivilegedGroup: allowed everything, whatever the bindings say
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"  # kubeadm's --service-account-issuer (and audience)
SA_PREFIX = "system:serviceaccount:"
ADMIN_TOKEN = "standin"  # the token of write_kubeconfig's default kubeconfig: system:admin


def service_account_groups(namespace: str) -> list[str]:
    """The groups of a service account's user, as the token authenticator gives them."""
    return ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]


@dataclass(frozen=True)
class RequestAttributes:
    """authorizer.Attributes of one request, as the real RequestInfoFactory
    resolves them (k8s.io/apiserver/pkg/endpoints/request/requestinfo.go)."""

    verb: str
    path: str
    resource_request: bool
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""


_SPECIAL_VERBS = ("proxy", "watch")
_NAMESPACE_SUBRESOURCES = ("status", "finalize")
_METHOD_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
                 "DELETE": "delete"}


def _path_segment_ok(name: str) -> bool:
    return name not in (".", "..") and "/" not in name and "%" not in name


def _exact_name(field_selector: str) -> str:
    """fields.Selector.RequiresExactMatch("metadata.name")."""
    for part in _split_top(field_selector):
        m = re.match(r"^\s*metadata\.name\s*(==|=)\s*(.*?)\s*$", part)
        if m:
            return m.group(2)
    return ""


def request_attributes(method: str, path: str, query: Mapping[str, str]) -> RequestAttributes:
    """What the authorizer sees of a request: ``/api/v1/...`` and
    ``/apis/<group>/<version>/...`` with a resource are resource requests
    (verb from the method: ``get`` on a collection is ``list``, or ``watch``
    with ``watch=1`` or under ``/watch/``; ``delete`` on a collection is
    ``deletecollection``; a list or watch with a ``metadata.name=`` field
    selector carries that name); anything else (discovery documents,
    ``/version``, health, ``/openapi``) is a non-resource request whose verb is
    the lower-cased method."""
    parts = [p for p in path.split("/") if p]
    nonresource = RequestAttributes(verb=method.lower(), path=path, resource_request=False)
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return nonresource
    prefix, rest = parts[0], parts[1:]
    group = ""
    if prefix == "apis":
        if len(rest) < 3:
            return nonresource
        group, rest = rest[0], rest[1:]
    version, rest = rest[0], rest[1:]
    special = rest[0] in _SPECIAL_VERBS
    if special:
        if len(rest) < 2:
            return nonresource  # the real server: an error, then a non-resource request
        verb, rest = rest[0], rest[1:]
    else:
        verb = _METHOD_VERBS.get(method, "")
    namespace = ""
    if rest[0] == "namespaces":
        if len(rest) > 1:
            namespace = rest[1]
            if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
                rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) >= 2 else ""
    sub = rest[2] if len(rest) >= 3 and not special else ""
    if not name and verb == "get":
        verb = "watch" if str(query.get("watch", "")).lower() not in ("", "false", "0") else "list"
        wanted = _exact_name(query.get("fieldSelector") or "")
        if wanted and _path_segment_ok(wanted):
            name = wanted
    if not name and verb == "delete":
        verb = "deletecollection"
    return RequestAttributes(verb=verb, path=path, resource_request=True, api_group=group, api_version=version,
                             resource=resource, subresource=sub, namespace=namespace, name=name)


def forbidden(username: str, attrs: RequestAttributes, reason: str = "") -> ApiError:
    """responsewriters.Forbidden: the real message and details."""
    if not attrs.resource_request:
        msg = f"User {_go_quote(username)} cannot {attrs.verb} path {_go_quote(attrs.path)}"
    else:
        resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        msg = (f"User {_go_quote(username)} cannot {attrs.verb} resource {_go_quote(resource)} in API group "
               f"{_go_quote(attrs.api_group)}")
        msg += f" in the namespace {_go_quote(attrs.namespace)}" if attrs.namespace else " at the cluster scope"
    if reason:
        msg = f"{msg}: {reason}"
    details: dict = {}
    if attrs.name:
        details["name"] = attrs.name
    if attrs.api_group:
        details["group"] = attrs.api_group
    if attrs.resource:
        details["kind"] = attrs.resource
    qualified = f"{attrs.resource}.{attrs.api_group}" if attrs.api_group else attrs.resource
    if not qualified:
        message = f"forbidden: {msg}"
    elif not attrs.name:
        message = f"{qualified} is forbidden: {msg}"
    else:
        message = f"{qualified} {_go_quote(attrs.name)} is forbidden: {msg}"
    return ApiError(403, "Forbidden", message, details)


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def rule_allows(rule: Mapping, attrs: RequestAttributes) -> bool:
    """rbac's RuleAllows: verbs, apiGroups, resources (``*``, ``res/sub``,
    ``*/sub``) and resourceNames for a resource request; verbs and
    nonResourceURLs (exact, ``*``, or a ``prefix*``) for any other."""
    verbs = rule.get("verbs") or []
    if "*" not in verbs and attrs.verb not in verbs:
        return False
    if not attrs.resource_request:
        for url in rule.get("nonResourceURLs") or []:
            if url == "*" or url == attrs.path or (url.endswith("*") and attrs.path.startswith(url.rstrip("*"))):
                return True
        return False
    groups = rule.get("apiGroups") or []
    if "*" not in groups and attrs.api_group not in groups:
        return False
    combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    if not any(r == "*" or r == combined or (attrs.subresource and r == f"*/{attrs.subresource}")
               for r in rule.get("resources") or []):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs.name in names


def _subject_applies(subject: Mapping, user: Mapping, namespace: str) -> bool:
    """rbac's appliesToUser: a ServiceAccount subject without a namespace is
    one of the RoleBinding's namespace."""
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return user.get("username") == name
    if kind == "Group":
        return name in (user.get("groups") or [])
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or namespace
        return bool(ns) and user.get("username") == f"{SA_PREFIX}{ns}:{name}"
    return False


def _describe_subject(subject: Mapping) -> str:
    if subject.get("namespace"):
        return f'{subject.get("kind")} "{subject["namespace"]}/{subject.get("name")}"'
    return f'{subject.get("kind")} "{subject.get("name")}"'


@dataclass
class _RbacIndex:
    cluster_roles: dict[str, dict]
    roles: dict[tuple[str, str], dict]
    cluster_role_bindings: list[dict]
    role_bindings: dict[str, list[dict]]


def rbac_decide(index: _RbacIndex, user: Mapping, attrs: RequestAttributes) -> tuple[bool, str]:
    """The RBAC authorizer: ClusterRoleBindings grant everywhere; a
    RoleBinding grants its Role, or a ClusterRole's rules, in its own
    namespace only. Returns (allowed, reason): on a denial the reason names
    the roles that bindings of this user refer to but that do not exist
    (``RBAC: clusterrole.rbac.authorization.k8s.io "x" not found``), as the
    real authorizer says; on an allow, which binding allowed it."""
    errors: list[str] = []

    def rules_of(ref: Mapping, namespace: str) -> list | None:
        if ref.get("kind") == "ClusterRole":
            role = index.cluster_roles.get(ref.get("name"))
            if role is None:
                errors.append(f'clusterrole.{RBAC_GROUP} "{ref.get("name")}" not found')
                return None
        else:
            role = index.roles.get((namespace, ref.get("name")))
            if role is None:
                errors.append(f'role.{RBAC_GROUP} "{ref.get("name")}" not found')
                return None
        return role.get("rules") or []

    for binding in index.cluster_role_bindings:
        subject = next((s for s in binding.get("subjects") or [] if _subject_applies(s, user, "")), None)
        if subject is None:
            continue
        ref = binding.get("roleRef") or {}
        rules = rules_of(ref, "")
        if rules and any(rule_allows(r, attrs) for r in rules):
            return True, (f'RBAC: allowed by ClusterRoleBinding "{binding["metadata"]["name"]}" of '
                          f'{ref.get("kind")} "{ref.get("name")}" to {_describe_subject(subject)}')
    if attrs.namespace:
        for binding in index.role_bindings.get(attrs.namespace, []):
            subject = next((s for s in binding.get("subjects") or []
                            if _subject_applies(s, user, attrs.namespace)), None)
            if subject is None:
                continue
            ref = binding.get("roleRef") or {}
            rules = rules_of(ref, attrs.namespace)
            if rules and any(rule_allows(r, attrs) for r in rules):
                return True, (f'RBAC: allowed by RoleBinding "{binding["metadata"]["name"]}/{attrs.namespace}" of '
                              f'{ref.get("kind")} "{ref.get("name")}" to {_describe_subject(subject)}')
    errors = list(dict.fromkeys(errors))
    if not errors:
        return False, ""
    return False, "RBAC: " + (errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]")


_BOOTSTRAP_META = {"labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
                   "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}}
_DISCOVERY_URLS = ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz",
                   "/version", "/version/"]
_PUBLIC_INFO_URLS = ["/healthz", "/livez", "/readyz", "/version", "/version/"]
# the real server's bootstrap policy, the part that decides what every user may do
# (plugin/pkg/auth/authorizer/rbac/bootstrappolicy): (name, rules, groups bound)
BOOTSTRAP_CLUSTER_ROLES = (
    ("cluster-admin", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                       {"nonResourceURLs": ["*"], "verbs": ["*"]}], ["system:masters"]),
    ("system:discovery", [{"nonResourceURLs": _DISCOVERY_URLS, "verbs": ["get"]}], ["system:authenticated"]),
    ("system:basic-user", [{"apiGroups": ["authorization.k8s.io"],
                            "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], "verbs": ["create"]},
                           {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"],
                            "verbs": ["create"]}], ["system:authenticated"]),
    ("system:public-info-viewer", [{"nonResourceURLs": _PUBLIC_INFO_URLS, "verbs": ["get"]}],
     ["system:authenticated", "system:unauthenticated"]),
)


# -- access reviews (authorization.k8s.io/v1): answered, never stored ---------------


def _review_attributes(spec: dict) -> RequestAttributes:
    res, non = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if res is not None:
        return RequestAttributes(verb=res.get("verb") or "", path="", resource_request=True,
                                 api_group=res.get("group") or "", api_version=res.get("version") or "",
                                 resource=res.get("resource") or "", subresource=res.get("subresource") or "",
                                 namespace=res.get("namespace") or "", name=res.get("name") or "")
    return RequestAttributes(verb=(non or {}).get("verb") or "", path=(non or {}).get("path") or "",
                             resource_request=False)


def _access_review(server: ApiServer, body: dict, user: dict | None) -> dict:
    """A SubjectAccessReview (``user`` None: the spec names the user) or a
    SelfSubjectAccessReview (the requester): the authorizer's answer in
    ``status``, validated as the real ValidateSubjectAccessReviewSpec."""
    rt_kind = body.get("kind") or ("SubjectAccessReview" if user is None else "SelfSubjectAccessReview")
    spec = body.get("spec") or {}
    causes = []
    if spec.get("resourceAttributes") is not None and spec.get("nonResourceAttributes") is not None:
        causes.append(("FieldValueInvalid", "spec.nonResourceAttributes",
                       "Invalid value: cannot be specified in combination with resourceAttributes"))
    if spec.get("resourceAttributes") is None and spec.get("nonResourceAttributes") is None:
        causes.append(("FieldValueInvalid", "spec.resourceAttributes", 'Invalid value: "null": exactly one of '
                                                                       "nonResourceAttributes or resourceAttributes "
                                                                       "must be specified"))
    if user is None:
        if not spec.get("user") and not spec.get("groups"):
            causes.append(("FieldValueInvalid", "spec.user",
                           'Invalid value: "": at least one of user or group must be specified'))
        user = {"username": spec.get("user") or "", "groups": list(spec.get("groups") or [])}
    if causes:
        text = ", ".join(f"{f}: {m}" for _r, f, m in causes)
        raise ApiError(422, "Invalid", f'{rt_kind}.authorization.k8s.io "" is invalid: '
                                       + (text if len(causes) == 1 else f"[{text}]"),
                       {"group": "authorization.k8s.io", "kind": rt_kind,
                        "causes": [{"reason": r, "message": m, "field": f} for r, f, m in causes]})
    allowed, reason = server.decide(user, _review_attributes(spec))
    status: dict = {"allowed": allowed}
    if reason:
        status["reason"] = reason
    meta = dict(body.get("metadata") or {})
    meta.setdefault("creationTimestamp", None)
    return {"kind": rt_kind, "apiVersion": "authorization.k8s.io/v1", "metadata": meta, "spec": spec,
            "status": status}


def rbac_rules(index: _RbacIndex, user: Mapping, namespace: str) -> tuple[list[dict], list[str]]:
    """RulesFor: every rule the user's ClusterRoleBindings, and the
    RoleBindings of ``namespace``, grant; and the roles that are missing."""
    rules, errors = [], []
    pairs = [(b, "") for b in index.cluster_role_bindings]
    pairs += [(b, namespace) for b in index.role_bindings.get(namespace, [])] if namespace else []
    for binding, ns in pairs:
        if not any(_subject_applies(s, user, ns) for s in binding.get("subjects") or []):
            continue
        ref = binding.get("roleRef") or {}
        role = index.cluster_roles.get(ref.get("name")) if ref.get("kind") == "ClusterRole" \
            else index.roles.get((ns, ref.get("name")))
        if role is None:
            errors.append(f'{ref.get("kind", "").lower()}.{RBAC_GROUP} "{ref.get("name")}" not found')
            continue
        rules.extend(role.get("rules") or [])
    return rules, errors


def _rules_review(server: ApiServer, body: dict, user: dict) -> dict:
    """SelfSubjectRulesReview: what ``kubectl auth can-i --list`` shows."""
    spec = body.get("spec") or {}
    rules, errors = rbac_rules(server._rbac(), user, spec.get("namespace") or "")
    resource_rules, nonresource_rules = [], []
    for r in rules:
        if r.get("nonResourceURLs"):
            nonresource_rules.append({"verbs": r.get("verbs") or [], "nonResourceURLs": r["nonResourceURLs"]})
        else:
            out = {"verbs": r.get("verbs") or [], "apiGroups": r.get("apiGroups") or [],
                   "resources": r.get("resources") or []}
            if r.get("resourceNames"):
                out["resourceNames"] = r["resourceNames"]
            resource_rules.append(out)
    status: dict = {"resourceRules": resource_rules, "nonResourceRules": nonresource_rules,
                    "incomplete": bool(errors)}
    if errors:
        status["evaluationError"] = "[" + ", ".join(errors) + "]"
    meta = dict(body.get("metadata") or {})
    meta.setdefault("creationTimestamp", None)
    return {"kind": "SelfSubjectRulesReview", "apiVersion": "authorization.k8s.io/v1", "metadata": meta,
            "spec": spec, "status": status}


REVIEW_TYPES: tuple[ResourceType, ...] = (
    ResourceType("authorization.k8s.io", "v1", "SelfSubjectAccessReview", "selfsubjectaccessreviews", False,
                 review=lambda server, body, user: _access_review(server, body, user)),
    ResourceType("authorization.k8s.io", "v1", "SubjectAccessReview", "subjectaccessreviews", False,
                 review=lambda server, body, user: _access_review(server, body, None)),
    ResourceType("authorization.k8s.io", "v1", "SelfSubjectRulesReview", "selfsubjectrulesreviews", False,
                 review=_rules_review),
)


# ---------------------------------------------------------------------------
# admission webhooks (admission.k8s.io/v1 AdmissionReview)


def label_selector_matches(selector: Mapping | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector (``matchLabels``, ``matchExpressions`` with In,
    NotIn, Exists, DoesNotExist) over labels; empty or missing matches all."""
    if not selector:
        return True
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        else:
            raise bad_request(f'"{op}" is not a valid label selector operator: accepted In, NotIn, Exists, '
                              f"DoesNotExist")
        if not ok:
            return False
    return True


_warnings = threading.local()  # the current HTTP request's warnings (Warning: 299 headers)


def _warn(text: str) -> None:
    items = getattr(_warnings, "items", None)
    if items is not None:
        items.append(text)


class _CallError(Exception):
    """webhookutil.ErrCallingWebhook: failurePolicy decides."""


_user = threading.local()  # the current HTTP request's userInfo (from its bearer token)


def _current_user() -> dict:
    return copy.deepcopy(getattr(_user, "info", None) or USER_INFO)


class WebhookDispatcher:
    """Calls the webhooks of the stored ``MutatingWebhookConfiguration`` and
    ``ValidatingWebhookConfiguration`` objects as kube-apiserver's admission
    does. Mutating: configurations by name, webhooks in order, one after the
    other, each seeing the previous one's patch (reinvocation ``Never``).
    Validating: all matching ones in parallel; any denial refuses.

    ``service_resolver``: there is no cluster network here, so a webhook with
    ``clientConfig.service`` is reached through this callable,
    ``(namespace, name, port) -> "host:port"``, which a test sets; the Service
    object must exist (as for the real server), and the certificate is still
    verified for ``<name>.<namespace>.svc``. Unset, such a call fails (and the
    webhook's failurePolicy decides), as one to an unreachable service does.
    """

    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self.service_resolver: Callable[[str, str, int], str] | None = None
        self._clients: dict[str, httpx.Client] = {}
        self._clients_lock = threading.Lock()
        self.calls = 0  # webhook HTTP calls made (for tests)

    def close(self) -> None:
        with self._clients_lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()

    def configured(self) -> bool:
        with self.server._cond:
            return any(k[0] in ("mutatingwebhookconfigurations.admissionregistration.k8s.io",
                                "validatingwebhookconfigurations.admissionregistration.k8s.io")
                       for k in self.server._objects)

    # -- matching ------------------------------------------------------------

    def _hooks(self, plural: str) -> list[dict]:
        skey = f"{plural}.admissionregistration.k8s.io"
        with self.server._cond:
            configs = sorted((k[2], v) for k, v in self.server._objects.items() if k[0] == skey)
            return [copy.deepcopy(wh) for _name, cfg in configs for wh in cfg.get("webhooks") or []]

    def _namespace_labels(self, rt: ResourceType, ns: str, obj: dict | None, old: dict | None) -> dict | None:
        """None: the object is cluster-scoped and not a namespace (every
        namespaceSelector matches)."""
        if rt.group == "" and rt.plural == "namespaces":
            return ((obj or old or {}).get("metadata") or {}).get("labels") or {}
        if not rt.namespaced:
            return None
        with self.server._cond:
            nsobj = self.server._objects.get(("namespaces", "", ns))
            if nsobj is None:
                raise ApiError(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})
            return dict((nsobj["metadata"].get("labels") or {}))

    @staticmethod
    def _rule_matches(rule: dict, rt: ResourceType, sub: str, operation: str) -> bool:
        if not any(o in ("*", operation) for o in rule.get("operations") or []):
            return False
        if not any(g in ("*", rt.group) for g in rule.get("apiGroups") or []):
            return False
        if not any(v in ("*", rt.version) for v in rule.get("apiVersions") or []):
            return False
        scope = rule.get("scope", "*")
        if scope == "Cluster" and rt.namespaced or scope == "Namespaced" and not rt.namespaced:
            return False
        for res in rule.get("resources") or []:
            r, _, s = res.partition("/")
            if r in ("*", rt.plural) and s in ("*", sub):
                return True
        return False

    def _matching(self, plural: str, rt: ResourceType, sub: str, operation: str, ns: str,
                  obj: dict | None, old: dict | None) -> list[dict]:
        if rt.group == "admissionregistration.k8s.io":
            return []  # never called for webhook configurations (no lock-out)
        hooks = self._hooks(plural)
        if not hooks:
            return []
        ns_labels = None
        out = []
        for wh in hooks:
            if not any(self._rule_matches(r, rt, sub, operation) for r in wh.get("rules") or []):
                continue
            if wh.get("namespaceSelector"):
                if ns_labels is None:
                    ns_labels = self._namespace_labels(rt, ns, obj, old)
                if ns_labels is not None and not label_selector_matches(wh["namespaceSelector"], ns_labels):
                    continue
            sel = wh.get("objectSelector")
            if sel and not any(o is not None and label_selector_matches(
                    sel, (o.get("metadata") or {}).get("labels") or {}) for o in (obj, old)):
                continue
            out.append(wh)
        return out

    # -- the call ------------------------------------------------------------

    def _review(self, rt: ResourceType, sub: str, operation: str, ns: str, obj: dict | None,
                old: dict | None, options: dict) -> dict:
        shown = obj if obj is not None else old
        kind = shown.get("kind") or rt.kind
        group, _, version = (shown.get("apiVersion") or rt.group_version).rpartition("/")
        gvk = {"group": group, "version": version, "kind": kind}
        gvr = {"group": rt.group, "version": rt.version, "resource": rt.plural}
        req = {"uid": str(uuid.uuid4()), "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
               "name": (shown.get("metadata") or {}).get("name") or "", "operation": operation,
               "userInfo": _current_user(), "object": obj, "oldObject": old, "dryRun": False,
               "options": options or {"kind": f"{operation.capitalize()}Options", "apiVersion": "meta.k8s.io/v1"}}
        if sub:
            req["subResource"] = req["requestSubResource"] = sub
        if ns:
            req["namespace"] = ns
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}

    def _client(self, ca_bundle: str) -> httpx.Client:
        with self._clients_lock:
            c = self._clients.get(ca_bundle)
            if c is None:
                if ca_bundle:
                    ctx = ssl.create_default_context(cadata=base64.b64decode(ca_bundle).decode())
                else:
                    ctx = ssl.create_default_context()  # the system roots, as the real server
                c = httpx.Client(verify=ctx)
                self._clients[ca_bundle] = c
            return c

    def _call(self, wh: dict, review: dict) -> dict:
        cc = wh.get("clientConfig") or {}
        timeout = int(wh.get("timeoutSeconds") or 10)
        headers = {"Content-Type": "application/json", "Accept": "application/json, */*"}
        extensions: dict = {}
        if cc.get("url"):
            shown = connect = cc["url"]
        else:
            svc = cc["service"]
            host = f"{svc['name']}.{svc['namespace']}.svc"
            port, path = int(svc.get("port") or 443), svc.get("path") or ""
            shown = f"https://{host}:{port}{path}"
            with self.server._cond:
                if ("services", svc["namespace"], svc["name"]) not in self.server._objects:
                    raise _CallError(f'failed to call webhook: service "{svc["name"]}" not found')
            if self.service_resolver is None:
                raise _CallError(f'failed to call webhook: Post "{shown}?timeout={timeout}s": the API-server '
                                 f"stand-in has no cluster network and no service_resolver was set to reach "
                                 f"service {svc['namespace']}/{svc['name']} port {port}")
            connect = f"https://{self.service_resolver(svc['namespace'], svc['name'], port)}{path}"
            headers["Host"] = f"{host}:{port}"
            extensions["sni_hostname"] = host
        sep = "&" if "?" in connect else "?"
        post = f'Post "{shown}?timeout={timeout}s"'
        self.calls += 1
        try:
            r = self._client(cc.get("caBundle") or "").post(
                f"{connect}{sep}timeout={timeout}s", content=json.dumps(review), headers=headers,
                timeout=timeout, extensions=extensions)
        except httpx.TimeoutException:
            raise _CallError(f"failed to call webhook: {post}: context deadline exceeded") from None
        except (httpx.HTTPError, ssl.SSLError, OSError) as e:
            cause: BaseException | None = e
            while cause is not None and not isinstance(cause, ssl.SSLCertVerificationError):
                cause = cause.__cause__ or cause.__context__
            if isinstance(cause, ssl.SSLCertVerificationError):
                why = f"tls: failed to verify certificate: {cause.verify_message}"
            elif "CERTIFICATE_VERIFY_FAILED" in str(e):  # httpcore re-raises without the chain
                why = f"tls: failed to verify certificate: {e}"
            else:
                why = f"{type(e).__name__}: {e}"
            raise _CallError(f"failed to call webhook: {post}: {why}") from None
        if r.status_code != 200:
            raise _CallError(f'failed to call webhook: an error on the server ("{r.text[:200]}") has prevented '
                             f"the request from succeeding (status {r.status_code})")
        try:
            answer = r.json()
        except ValueError as e:
            raise _CallError(f"received invalid webhook response: {e}") from None
        if not isinstance(answer, dict) or answer.get("apiVersion") != "admission.k8s.io/v1" \
                or answer.get("kind") != "AdmissionReview":
            got = answer if not isinstance(answer, dict) else f"{answer.get('apiVersion')}, Kind={answer.get('kind')}"
            raise _CallError(f"received invalid webhook response: expected webhook response of "
                             f"admission.k8s.io/v1, Kind=AdmissionReview, got {got}")
        resp = answer.get("response")
        if not isinstance(resp, dict):
            raise _CallError("received invalid webhook response: webhook response was absent")
        if resp.get("uid") != review["request"]["uid"]:
            raise _CallError(f'received invalid webhook response: expected response.uid="{review["request"]["uid"]}", '
                             f'got "{resp.get("uid")}"')
        if resp.get("patch") and resp.get("patchType") is None:
            raise _CallError("received invalid webhook response: webhook returned response.patch but not "
                             "response.patchType")
        if resp.get("patchType") not in (None, "JSONPatch"):
            raise _CallError(f'received invalid webhook response: webhook returned invalid response.patchType of '
                             f'"{resp["patchType"]}"')
        return resp

    @staticmethod
    def _denied(name: str, status: dict | None) -> ApiError:
        status = dict(status or {})
        code = int(status.get("code") or 0)
        if code < 400:
            code = 400
        denied = f'admission webhook "{name}" denied the request'
        if status.get("message"):
            message = f"{denied}: {status['message']}"
        elif status.get("reason"):
            message = f"{denied}: {status['reason']}"
        else:
            message = f"{denied} without explanation"
        return ApiError(code, status.get("reason") or "", message, status.get("details"))

    @staticmethod
    def _internal(text: str) -> ApiError:
        return ApiError(500, "InternalError", f"Internal error occurred: {text}", {"causes": [{"message": text}]})

    def _ask(self, wh: dict, review: dict) -> dict | None:
        """The webhook's response, or None when it could not be called and its
        failurePolicy is Ignore; raises the real server's errors."""
        name = wh.get("name")
        try:
            return self._call(wh, review)
        except _CallError as e:
            text = f'failed calling webhook "{name}": {e}'
            if wh.get("failurePolicy") == "Ignore":
                log.warning("apiserver_standin_webhook_failing_open", webhook=name, error=text)
                return None
            log.warning("apiserver_standin_webhook_failing_closed", webhook=name, error=text)
            raise self._internal(text) from None

    def mutate(self, rt: ResourceType, sub: str, operation: str, ns: str, obj: dict | None, old: dict | None,
               options: dict) -> dict | None:
        for wh in self._matching("mutatingwebhookconfigurations", rt, sub, operation, ns, obj, old):
            review = self._review(rt, sub, operation, ns, obj, old, options)
            resp = self._ask(wh, review)
            if resp is None:
                continue
            for w in resp.get("warnings") or []:
                _warn(str(w))
            if not resp.get("allowed"):
                raise self._denied(wh["name"], resp.get("status"))
            if not resp.get("patch"):
                continue
            try:
                ops = json.loads(base64.b64decode(resp["patch"], validate=True))
            except (ValueError, TypeError) as e:
                raise self._internal(f"webhook {wh['name']!r} returned a patch that is not base64 JSON: {e}") from None
            if not ops:
                continue
            if obj is None:
                raise self._internal(f'admission webhook "{wh["name"]}" attempted to modify the object, which is '
                                     f"not supported for this operation")
            try:
                obj = jsonpatch.apply_patch(obj, ops)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError) as e:
                raise self._internal(str(e)) from None
            if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
                raise self._internal(f'admission webhook "{wh["name"]}" patched the object into something that '
                                     f"is not an object with metadata")
            if rt.defaults and not sub:
                rt.defaults(obj)  # the patched object is decoded (and defaulted) again
        return obj

    def validate(self, rt: ResourceType, sub: str, operation: str, ns: str, obj: dict | None, old: dict | None,
                 options: dict) -> None:
        hooks = self._matching("validatingwebhookconfigurations", rt, sub, operation, ns, obj, old)
        if not hooks:
            return
        errors: list[ApiError | None] = [None] * len(hooks)
        warnings: list[list[str]] = [[] for _ in hooks]

        reviews = [self._review(rt, sub, operation, ns, obj, old, options) for _ in hooks]  # this thread's user

        def one(i: int, wh: dict) -> None:
            try:
                resp = self._ask(wh, reviews[i])
                if resp is not None:
                    warnings[i].extend(str(w) for w in resp.get("warnings") or [])
                if resp is not None and resp.get("patch"):
                    raise self._internal(f'failed calling webhook "{wh["name"]}": received invalid webhook '
                                         f"response: validating webhook may not return response.patch")
                if resp is not None and not resp.get("allowed"):
                    raise self._denied(wh["name"], resp.get("status"))
            except ApiError as e:
                errors[i] = e

        threads = [threading.Thread(target=one, args=(i, wh), daemon=True) for i, wh in enumerate(hooks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for ws in warnings:
            for w in ws:
                _warn(w)
        for e in errors:
            if e is not None:
                raise e


# ---------------------------------------------------------------------------
# patches


class _Delete:
    pass


_DELETE = _Delete()


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _strip_directives(value):
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items()
                if not k.startswith("$") and v is not None}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


def strategic_merge_patch(original: dict, patch: dict, keys: Mapping[str, str]) -> dict:
    """Kubernetes' strategic merge patch on ``original`` (not changed); see the
    module docstring for the directives and keys supported."""
    out = _smp_map(copy.deepcopy(original), patch, "", keys)
    if out is _DELETE:
        raise bad_request("a strategic merge patch may not delete the whole object")
    return out


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _smp_map(original, patch: dict, path: str, keys: Mapping[str, str]):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETE
    if directive == "replace":
        return _strip_directives(patch)
    if directive not in (None, "merge"):
        raise bad_request(f"Unknown patch type: {directive!r}, accepted: merge, replace, delete")
    out = dict(original) if isinstance(original, dict) else {}
    orders = {}
    for k, v in patch.items():
        if k in ("$patch", "$retainKeys"):
            continue
        if k.startswith("$setElementOrder/"):
            orders[k.split("/", 1)[1]] = v
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            name = k.split("/", 1)[1]
            out[name] = [x for x in out.get(name) or [] if x not in (v or [])]
            continue
        if k.startswith("$"):
            raise bad_request(f"unknown strategic merge patch directive {k!r}")
        sub = _join(path, k)
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict):
            merged = _smp_map(out.get(k), v, sub, keys)
            if merged is _DELETE:
                out.pop(k, None)
            else:
                out[k] = merged
        elif isinstance(v, list):
            out[k] = _smp_list(out.get(k), v, sub, keys)
        else:
            out[k] = v
    for name, order in orders.items():
        if isinstance(out.get(name), list):
            out[name] = _apply_order(out[name], order, keys.get(_join(path, name)))
    retain = patch.get("$retainKeys")
    if retain is not None:
        out = {k: v for k, v in out.items() if k in retain}
    return out


def _apply_order(items: list, order: list, key: str | None) -> list:
    def ident(x):
        return x.get(key) if key and isinstance(x, dict) else x
    wanted = [ident(o) for o in order]
    listed = sorted((x for x in items if ident(x) in wanted), key=lambda x: wanted.index(ident(x)))
    return listed + [x for x in items if ident(x) not in wanted]


def _smp_list(original, patch: list, path: str, keys: Mapping[str, str]) -> list:
    key = keys.get(path)
    if key is None:
        return _strip_directives(patch)
    items = list(original) if isinstance(original, list) else []
    if key == "":  # a set of scalars
        return items + [x for x in patch if x not in items]
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [_strip_directives(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    for p in patch:
        if not isinstance(p, dict) or key not in p:
            raise bad_request(f"map: {p!r} does not contain declared merge key: {key}")
        idx = next((i for i, x in enumerate(items) if isinstance(x, dict) and x.get(key) == p[key]), None)
        if p.get("$patch") == "delete":
            if idx is not None:
                del items[idx]
            continue
        if idx is None:
            items.append(_strip_directives(p))
        else:
            items[idx] = _smp_map(items[idx], p, path + "[]", keys)
    return items


# ---------------------------------------------------------------------------
# the store


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _at(seconds: int) -> str:
    return (_dt.datetime.now(_dt.UTC) + _dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Event:
    rv: int
    type: str
    skey: str  # storage key of the type
    obj: dict
    prev: dict | None


@dataclass
class _Snapshot:
    rv: int
    items: list


_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


class ApiServer:
    """The stand-in; ``with ApiServer() as api:`` or :meth:`start`/:meth:`stop`.

    ``url`` is its base address. Test helpers (direct, not over HTTP, but
    through the same admission, webhooks included):
    :meth:`create`, :meth:`get`, :meth:`list`, :meth:`update`, :meth:`delete`,
    :meth:`set_status`, :meth:`finish_deletion`, :meth:`compact`,
    :meth:`write_kubeconfig`, :meth:`add_token`, :meth:`register`, :meth:`close_watches`,
    :meth:`hold_watches`; :meth:`issue_token` (a service-account JWT),
    :attr:`ca_pem` (with ``tls=True``), :attr:`audit` and :meth:`decide` (with
    ``authorize=True``: the decisions made, and one asked for directly).
    Hooks: :attr:`admission_hooks` (in-process mutating admission, ``hook(rt, operation, obj, old) -> obj`` or raise
    :class:`ApiError`), :attr:`pod_update_hooks` (extra pod update checks,
    ``hook(new, old) -> [(reason, field, message)]``), :attr:`webhooks` (the
    :class:`WebhookDispatcher`; set ``webhooks.service_resolver`` for
    webhooks referenced by Service).
    """

    def __init__(self, *, history: int = 10000, bookmark_interval: float = 1.0,
                 types: Iterable[ResourceType] = BUILTIN_TYPES + REVIEW_TYPES, tls: bool = False,
                 host: str = "127.0.0.1", port: int = 0, tls_names: Iterable[str] = (), authorize: bool = False):
        """``tls``: serve HTTPS with a CA of its own (:attr:`ca_pem`); the
        serving certificate names ``kubernetes.default.svc`` and friends,
        10.96.0.1, localhost, 127.0.0.1, ::1, ``host``, ``tls_names``, and the
        local address each connection came in on (so ``host="0.0.0.0"`` is
        verified on every interface, even one made later). ``host``/``port``:
        where to listen. ``authorize``: authenticate every request and
        authorize it with RBAC (see the module docstring); off, every
        request is allowed, as before."""
        self._cond = threading.Condition()
        self._rv = 0
        self._objects: dict[tuple[str, str, str], dict] = {}  # (storage key, ns, name) -> stored object
        self._history: deque[_Event] = deque()
        self._history_max = history
        self._oldest = 0  # the oldest resourceVersion a watch may start from
        self._snapshots: dict[str, _Snapshot] = {}
        self._snapshot_ids = itertools.count(1)
        self._ips = itertools.count(10)
        self.bookmark_interval = bookmark_interval
        self.types: dict[tuple[str, str, str], ResourceType] = {}  # (group, version, plural)
        self.pod_update_hooks: list[Callable[[dict, dict], list]] = []
        # issue 14: called as hook(rt, operation, obj, old) -> obj (mutated) or raises ApiError
        self.admission_hooks: list[Callable[[ResourceType, str, dict, dict | None], dict]] = []
        self.webhooks = WebhookDispatcher(self)  # see its docstring (service_resolver)
        # bearer token -> userInfo, only to tell webhooks who asks (no authentication: an unknown or absent
        # token is system:admin); add_token() adds one, write_kubeconfig(token=...) uses it
        self.tokens: dict[str, dict] = {ADMIN_TOKEN: copy.deepcopy(USER_INFO)}
        self.authorize = authorize
        self.audit: list[dict] = []  # every authorization decision (authorize=True), oldest first
        self.requests: collections.Counter = collections.Counter()  # (method, path without query) -> count
        self._rbac_generation = 0  # bumped by every write of an RBAC object
        self._rbac_index: tuple[int, _RbacIndex] | None = None
        self._sa_key = None  # the service-account token signing key (RSA), made at the first issue_token
        self._sa_key_lock = threading.Lock()
        self.host, self._port = host, port
        self.tls = tls
        self.ca_pem: bytes | None = None
        self._tls_contexts: dict[str, ssl.SSLContext] = {}
        self._tls_lock = threading.Lock()
        if tls:
            from hamid.control import certs
            self._ca = certs.make_ca("hamid apiserver stand-in CA")
            self.ca_pem = self._ca.cert_pem
            names = ["kubernetes", "kubernetes.default", "kubernetes.default.svc",
                     "kubernetes.default.svc.cluster.local", "localhost", "127.0.0.1", "::1", "10.96.0.1"]
            if host not in ("0.0.0.0", "::", ""):
                names.append(host)
            self._tls_names = list(dict.fromkeys([*names, *tls_names]))
        self._stopped = False
        self._watch_epoch = 0  # close_watches() ends every stream started in an earlier epoch
        self._watches_held = 0  # while > 0, new watch requests wait (hold_watches)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        for rt in types:
            self.register(rt)
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        if (RBAC_GROUP, "v1", "clusterroles") in self.types:
            for name, rules, groups in BOOTSTRAP_CLUSTER_ROLES:
                self.create({"apiVersion": f"{RBAC_GROUP}/v1", "kind": "ClusterRole",
                             "metadata": {"name": name, **copy.deepcopy(_BOOTSTRAP_META)}, "rules": rules})
                self.create({"apiVersion": f"{RBAC_GROUP}/v1", "kind": "ClusterRoleBinding",
                             "metadata": {"name": name, **copy.deepcopy(_BOOTSTRAP_META)},
                             "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": name},
                             "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": g} for g in groups]})

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> ApiServer:
        handler = type("Handler", (_Handler,), {"api": self})
        server_cls = _Server
        if ":" in self.host:
            server_cls = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
        self._server = server_cls((self.host, self._port), handler)
        self._server.daemon_threads = True
        self._server.tls_context = self._tls_context if self.tls else None
        self._thread = threading.Thread(target=self._server.serve_forever, name="apiserver-standin",
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        log.info("apiserver_standin_started", url=self.url)
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self.webhooks.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
            self._server = None

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """``http(s)://host:port``; a wildcard listen address is shown as loopback."""
        host = self._server.server_address[0]
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
        if ":" in host:
            host = f"[{host}]"
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def _tls_context(self, local_ip: str) -> ssl.SSLContext:
        """The TLS context for connections that came in on ``local_ip``: a
        serving certificate from :attr:`ca_pem`'s CA that names it too."""
        import os
        import tempfile

        from hamid.control import certs
        if local_ip.startswith("::ffff:"):
            local_ip = local_ip[7:]
        key = "" if local_ip in self._tls_names else local_ip
        with self._tls_lock:
            ctx = self._tls_contexts.get(key)
            if ctx is None:
                issued = certs.issue(self._ca, self._tls_names + ([key] if key else []))
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                ctx.set_alpn_protocols(["http/1.1"])
                with tempfile.TemporaryDirectory(prefix="apiserver-tls-") as d:
                    crt, k = os.path.join(d, "tls.crt"), os.path.join(d, "tls.key")
                    fd = os.open(k, os.O_WRONLY | os.O_CREAT, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        f.write(issued.key_pem)
                    with open(crt, "wb") as f:
                        f.write(issued.cert_pem)
                    ctx.load_cert_chain(crt, k)
                self._tls_contexts[key] = ctx
            return ctx

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

    def add_token(self, token: str, username: str, groups: Iterable[str] = ()) -> None:
        """Requests bearing ``token`` are made by ``username`` (what a webhook
        sees in ``userInfo``), e.g. ``system:serviceaccount:kube-system:hamid``."""
        if not token or not username:
            raise ValueError(f"add_token: a token and a username are required (got {token!r}, {username!r})")
        self.tokens[token] = {"username": username, "groups": [*groups, "system:authenticated"]}

    # -- authentication and authorization --------------------------------------

    def _signing_key(self):
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        with self._sa_key_lock:
            if self._sa_key is None:
                key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
                der = key.public_key().public_bytes(serialization.Encoding.DER,
                                                    serialization.PublicFormat.SubjectPublicKeyInfo)
                digest = hashes.Hash(hashes.SHA256())
                digest.update(der)
                kid = base64.urlsafe_b64encode(digest.finalize()).decode().rstrip("=")
                self._sa_key = (key, kid)
            return self._sa_key

    def issue_token(self, namespace: str, service_account: str, *, expiration_seconds: int = 3607,
                    audiences: Iterable[str] = (SA_ISSUER,), pod: str | None = None) -> str:
        """A service-account token as the TokenRequest API (and kubelet's
        projected volume) makes it: a JWT signed RS256 with a key of this
        server, claims ``iss``, ``sub`` (``system:serviceaccount:NS:NAME``),
        ``aud``, ``exp``, ``iat``, ``nbf``, ``jti`` and ``kubernetes.io``
        (namespace, serviceaccount name and uid; with ``pod=``, that pod's
        name and uid and, when it is bound, its node's). The ServiceAccount
        need not exist yet (its uid claim is then empty); the token
        authenticates only while it does (and while the pod does), as the
        real authenticator checks, and only for the audience
        ``https://kubernetes.default.svc.cluster.local`` (the server's own),
        as the real server accepts only its API audiences. Any
        ``expiration_seconds`` is taken (the real TokenRequest refuses less
        than 600), so a test may watch a token expire."""
        import jwt
        if not namespace or not service_account:
            raise ValueError(f"issue_token: a namespace and a service account name are required "
                             f"(got {namespace!r}, {service_account!r})")
        now = int(time.time())
        with self._cond:
            sa = self._objects.get(("serviceaccounts", namespace, service_account))
            k8s: dict = {"namespace": namespace, "serviceaccount": {
                "name": service_account, "uid": sa["metadata"]["uid"] if sa else ""}}
            if pod is not None:
                p = self._objects.get(("pods", namespace, pod))
                if p is None:
                    raise ValueError(f"issue_token: pod {namespace}/{pod} does not exist: a token is bound to an "
                                     f"existing pod")
                k8s["pod"] = {"name": pod, "uid": p["metadata"]["uid"]}
                node = (p.get("spec") or {}).get("nodeName")
                n = self._objects.get(("nodes", "", node)) if node else None
                if n is not None:
                    k8s["node"] = {"name": node, "uid": n["metadata"]["uid"]}
        claims = {"aud": list(audiences), "exp": now + int(expiration_seconds), "iat": now, "nbf": now,
                  "iss": SA_ISSUER, "jti": str(uuid.uuid4()), "kubernetes.io": k8s,
                  "sub": f"{SA_PREFIX}{namespace}:{service_account}"}
        key, kid = self._signing_key()
        return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid, "typ": None})

    def _token_user(self, token: str) -> dict | None:
        """The user of a service-account JWT this server signed, or None
        (bad signature, expired, wrong audience or issuer, the service account
        or bound pod gone or replaced)."""
        import jwt
        if self._sa_key is None or token.count(".") != 2:
            return None
        key, _kid = self._sa_key
        try:
            claims = jwt.decode(token, key.public_key(), algorithms=["RS256"], audience=SA_ISSUER, issuer=SA_ISSUER,
                                options={"require": ["exp", "iat", "sub"]})
        except jwt.PyJWTError as e:
            log.debug("apiserver_standin_token_refused", error=str(e))
            return None
        k8s = claims.get("kubernetes.io") or {}
        ns, sa = k8s.get("namespace") or "", (k8s.get("serviceaccount") or {}).get("name") or ""
        if claims["sub"] != f"{SA_PREFIX}{ns}:{sa}":
            return None
        with self._cond:
            stored = self._objects.get(("serviceaccounts", ns, sa))
            claimed = (k8s.get("serviceaccount") or {}).get("uid")
            if stored is None or (claimed and stored["metadata"]["uid"] != claimed):
                log.debug("apiserver_standin_token_refused", error=f"service account {ns}/{sa} not found "
                                                                   f"(or not uid {claimed})")
                return None
            extra = {"authentication.kubernetes.io/credential-id": [f"JTI={claims.get('jti')}"]}
            if "pod" in k8s:
                p = self._objects.get(("pods", ns, k8s["pod"].get("name")))
                if p is None or p["metadata"]["uid"] != k8s["pod"].get("uid"):
                    log.debug("apiserver_standin_token_refused", error=f"pod {ns}/{k8s['pod'].get('name')} gone")
                    return None
                extra["authentication.kubernetes.io/pod-name"] = [k8s["pod"]["name"]]
                extra["authentication.kubernetes.io/pod-uid"] = [k8s["pod"]["uid"]]
                if "node" in k8s:
                    extra["authentication.kubernetes.io/node-name"] = [k8s["node"]["name"]]
                    extra["authentication.kubernetes.io/node-uid"] = [k8s["node"]["uid"]]
            return {"username": claims["sub"], "uid": stored["metadata"]["uid"], "groups": service_account_groups(ns),
                    "extra": extra}

    def authenticate(self, authorization: str | None) -> dict:
        """The user of a request's ``Authorization`` header. A bearer token
        of :attr:`tokens` or from :meth:`issue_token` is its user; with
        ``authorize`` on, any other bearer token is 401 and a request without
        one is ``system:anonymous`` (group ``system:unauthenticated``); off,
        both are system:admin, as before."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token:
            info = self.tokens.get(token) or self._token_user(token)
            if info is not None:
                return copy.deepcopy(info)
            if self.authorize:
                raise unauthorized()
            return copy.deepcopy(USER_INFO)
        return copy.deepcopy(ANONYMOUS if self.authorize else USER_INFO)

    def impersonate(self, user: dict, headers) -> dict:
        """The user a request acts as: ``user`` unless it carries
        ``Impersonate-User`` (and ``Impersonate-Group``s), which ``user`` must
        be allowed to ``impersonate`` (resource ``users``, ``serviceaccounts``
        in the account's namespace, ``groups``), each check authorized and
        audited like a request; a service account impersonated without groups
        gets its own; ``system:authenticated`` is added (``system:unauthenticated``
        for ``system:anonymous``). ``Impersonate-Uid`` and ``-Extra-`` are
        refused (not implemented)."""
        name = headers.get("Impersonate-User")
        groups = headers.get_all("Impersonate-Group") or []
        if any(k.lower().startswith(("impersonate-uid", "impersonate-extra-")) for k in headers.keys()):
            raise bad_request("Impersonate-Uid and Impersonate-Extra-* are not implemented by the API-server "
                              "stand-in: impersonate a user and groups only")
        if not name:
            if groups:
                raise ApiError(500, "InternalError", "Internal error occurred: requested [" + ", ".join(
                    f"{{Group {g}}}" for g in groups) + "] without impersonating a user")
            return user
        if name.startswith(SA_PREFIX) and name.count(":") == 3:
            ns, sa = name[len(SA_PREFIX):].split(":")
            wanted = [RequestAttributes("impersonate", "", True, resource="serviceaccounts", namespace=ns, name=sa)]
        else:
            ns, wanted = "", [RequestAttributes("impersonate", "", True, resource="users", name=name)]
        wanted += [RequestAttributes("impersonate", "", True, resource="groups", name=g) for g in groups]
        for attrs in wanted:
            self.check(user, attrs)
        if ns and not groups:  # a service account's own groups come with it, unchecked
            groups = service_account_groups(ns)[:-1]
        extra = "system:unauthenticated" if name == ANONYMOUS["username"] else "system:authenticated"
        return {"username": name, "groups": [*groups, *([extra] if extra not in groups else [])]}

    def _rbac(self) -> _RbacIndex:
        with self._cond:
            if self._rbac_index is not None and self._rbac_index[0] == self._rbac_generation:
                return self._rbac_index[1]
            index = _RbacIndex({}, {}, [], {})
            for (skey, ns, name), obj in sorted(self._objects.items()):
                if skey == f"clusterroles.{RBAC_GROUP}":
                    index.cluster_roles[name] = obj
                elif skey == f"roles.{RBAC_GROUP}":
                    index.roles[(ns, name)] = obj
                elif skey == f"clusterrolebindings.{RBAC_GROUP}":
                    index.cluster_role_bindings.append(obj)
                elif skey == f"rolebindings.{RBAC_GROUP}":
                    index.role_bindings.setdefault(ns, []).append(obj)
            self._rbac_index = (self._rbac_generation, index)
            return index

    def decide(self, user: Mapping, attrs: RequestAttributes) -> tuple[bool, str]:
        """(allowed, reason) for ``user`` (a userInfo dict) doing ``attrs``:
        ``system:masters`` is allowed everything (the privileged-group
        authorizer before RBAC), else RBAC over the stored roles and bindings."""
        if MASTERS in (user.get("groups") or []):
            return True, ""
        return rbac_decide(self._rbac(), user, attrs)

    def check(self, user: Mapping, attrs: RequestAttributes) -> None:
        """Authorize one request: record the decision in :attr:`audit`; a
        denial raises the real 403. Everything is allowed (and nothing
        recorded) with ``authorize`` off."""
        if not self.authorize:
            return
        allowed, reason = self.decide(user, attrs)
        self.audit.append({"user": user.get("username"), "groups": list(user.get("groups") or []),
                           "verb": attrs.verb, "apiGroup": attrs.api_group, "resource": attrs.resource,
                           "subresource": attrs.subresource, "namespace": attrs.namespace, "name": attrs.name,
                           "path": attrs.path, "allowed": allowed, "reason": reason})
        if not allowed:
            raise forbidden(str(user.get("username")), attrs, reason)


    def write_kubeconfig(self, path, token: str = ADMIN_TOKEN, server: str | None = None) -> str:
        """A kubeconfig for kubectl and the Python client pointing here (mode
        0600; ``server`` instead of :attr:`url` if given), with ``token`` as
        its bearer token: the default is system:admin's (in system:masters);
        pass :meth:`issue_token`'s or :meth:`add_token`'s for another user.
        With TLS it carries the CA (``certificate-authority-data``)."""
        import os
        cluster: dict = {"server": server or self.url}
        if self.ca_pem is not None:
            cluster["certificate-authority-data"] = base64.b64encode(self.ca_pem).decode()
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "standin",
               "clusters": [{"name": "standin", "cluster": cluster}],
               "users": [{"name": "standin", "user": {"token": token}}],
               "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin",
                                                            "namespace": "default"}}]}
        fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(doc, f)
        return str(path)

    # -- types ---------------------------------------------------------------

    def register(self, rt: ResourceType) -> None:
        """Serve one more kind (e.g. admissionregistration.k8s.io/v1
        mutatingwebhookconfigurations)."""
        k = (rt.group, rt.version, rt.plural)
        if k in self.types:
            raise ValueError(f"resource {rt.plural} in {rt.group_version!r} is already registered")
        if rt.storage is not None and (rt.to_storage is None or rt.from_storage is None):
            raise ValueError(f"{rt.key}: storage={rt.storage!r} needs to_storage and from_storage")
        self.types[k] = rt

    def type_for(self, kind: str, api_version: str | None = None) -> ResourceType:
        """The type of a kind (``Pod``), a plural (``pods``) or ``plural.group``."""
        found = [rt for rt in self.types.values()
                 if kind in (rt.kind, rt.plural, rt.key) and (api_version is None or rt.group_version == api_version)
                 and rt.storage is None]
        if api_version is not None and not found:
            found = [rt for rt in self.types.values()
                     if kind in (rt.kind, rt.plural, rt.key) and rt.group_version == api_version]
        if len(found) != 1:
            known = sorted({rt.kind for rt in self.types.values()})
            raise KeyError(f"kind {kind!r} (apiVersion {api_version}) is {'ambiguous' if found else 'unknown'}; "
                           f"known kinds: {', '.join(known)}")
        return found[0]

    # -- helpers for tests (no HTTP) -----------------------------------------

    def create(self, obj: dict) -> dict:
        rt = self.type_for(obj["kind"], obj.get("apiVersion"))
        ns = (obj.get("metadata") or {}).get("namespace", "default") if rt.namespaced else ""
        return self.do_create(rt, ns, copy.deepcopy(obj))

    def get(self, kind: str, namespace: str | None, name: str) -> dict:
        rt = self.type_for(kind)
        return self.do_get(rt, namespace or "", name)

    def list(self, kind: str, namespace: str | None = None) -> list[dict]:
        rt = self.type_for(kind)
        return self.do_list(rt, namespace, {})["items"]

    def update(self, obj: dict) -> dict:
        rt = self.type_for(obj["kind"], obj.get("apiVersion"))
        meta = obj["metadata"]
        return self.do_update(rt, meta.get("namespace", "") if rt.namespaced else "", meta["name"],
                              lambda _old: copy.deepcopy(obj))

    def set_status(self, kind: str, namespace: str | None, name: str, status: dict) -> dict:
        """Merge ``status`` into the object's status (RFC 7386) as a kubelet
        or controller writing the status subresource would."""
        rt = self.type_for(kind)
        return self.do_update(rt, namespace or "", name,
                              lambda old: {**old, "status": merge_patch(old.get("status") or {}, status)},
                              subresource="status")

    def delete(self, kind: str, namespace: str | None, name: str, grace_period: int | None = None) -> dict:
        rt = self.type_for(kind)
        opts = {} if grace_period is None else {"gracePeriodSeconds": grace_period}
        return self.do_delete(rt, namespace or "", name, opts)[0]

    def finish_deletion(self, namespace: str, name: str) -> dict:
        """What kubelet does once a deleting pod's containers stopped: delete
        it with grace 0."""
        pod = self.get("Pod", namespace, name)
        if not pod["metadata"].get("deletionTimestamp"):
            raise ValueError(f"pod {namespace}/{name} is not being deleted; delete it first")
        return self.delete("Pod", namespace, name, grace_period=0)

    def close_watches(self) -> None:
        """End every open watch stream, as a restarting API server (or a proxy's
        idle timeout) does; clients resume from the last resourceVersion they saw."""
        with self._cond:
            self._watch_epoch += 1
            self._cond.notify_all()

    @contextlib.contextmanager
    def hold_watches(self):
        """Close the open watches and make new ones wait until the block ends, so a
        test can move the store on (writes, compact()) while no watch follows it:
        a client resuming from its last resourceVersion then meets the 410."""
        with self._cond:
            self._watches_held += 1
        self.close_watches()
        try:
            yield self
        finally:
            with self._cond:
                self._watches_held -= 1
                self._cond.notify_all()

    def compact(self) -> int:
        """Drop the watch history and list snapshots, like an etcd compaction:
        a watch from an older resourceVersion, or a continue token, is 410."""
        with self._cond:
            self._history.clear()
            self._snapshots.clear()
            self._oldest = self._rv
            self._cond.notify_all()
            return self._rv

    # -- the store -----------------------------------------------------------

    def _view(self, rt: ResourceType, stored: dict) -> dict:
        obj = rt.from_storage(stored) if rt.from_storage else copy.deepcopy(stored)
        return obj

    def _bump(self) -> int:
        self._rv += 1
        return self._rv

    def _record(self, type_: str, skey: str, obj: dict, prev: dict | None) -> None:
        if skey.endswith(f".{RBAC_GROUP}"):
            self._rbac_generation += 1
        self._history.append(_Event(self._rv, type_, skey, copy.deepcopy(obj), prev))
        while len(self._history) > self._history_max:
            dropped = self._history.popleft()
            self._oldest = dropped.rv
        self._cond.notify_all()

    def _allocate_cluster_ip(self) -> str:
        return str(ipaddress.ip_address("10.96.0.0") + next(self._ips))

    def _check_namespace(self, rt: ResourceType, ns: str) -> None:
        if rt.namespaced and ("namespaces", "", ns) not in self._objects:
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})

    def do_create(self, rt: ResourceType, ns: str, body: dict) -> dict:
        """Create as the real server orders it: defaults, the in-process
        :attr:`admission_hooks`, mutating webhooks, then names, validation,
        validating webhooks, store. No lock is held while a webhook is called
        (a webhook may call this server)."""
        if not isinstance(body, dict):
            raise bad_request(f"the body of a create must be a JSON object, not {type(body).__name__}")
        self._check_kind(rt, body)
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if rt.namespaced:
            if meta.get("namespace") not in (None, "", ns):
                raise bad_request("the namespace of the provided object does not match the namespace sent "
                                  "on the request")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise ApiError(500, "InternalError", "resourceVersion should not be set on objects to be created",
                           {"causes": [{"message": "resourceVersion should not be set on objects to be created"}]})
        with self._cond:
            self._check_namespace(rt, ns)
        for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                  "generation", "managedFields", "selfLink"):
            meta.pop(k, None)
        if rt.defaults:
            rt.defaults(body)
        for hook in self.admission_hooks:
            body = hook(rt, "CREATE", body, None)
        body = self.webhooks.mutate(rt, "", "CREATE", ns, body, None, {})
        meta = body["metadata"]
        if rt.status_reset_on_create:
            body.pop("status", None)
        if rt.prepare_create:
            rt.prepare_create(self, body)
        with self._cond:
            if not meta.get("name") and meta.get("generateName"):
                while True:
                    suffix = "".join(_GENERATE_ALPHABET[b % len(_GENERATE_ALPHABET)] for b in uuid.uuid4().bytes[:5])
                    candidate = meta["generateName"] + suffix
                    if (rt.storage_key, ns, candidate) not in self._objects:
                        meta["name"] = candidate
                        break
        name = meta.get("name") or ""
        if not name:
            raise invalid(rt, "", [("FieldValueRequired", "metadata.name",
                                    "Required value: name or generateName is required")])
        causes = _name_errors(name, rt.name_rule)
        if causes:
            raise invalid(rt, name, causes)
        if rt.validate:
            causes = rt.validate(body)
            if causes:
                raise invalid(rt, name, causes)
        self.webhooks.validate(rt, "", "CREATE", ns, body, None, {})
        with self._cond:
            self._check_namespace(rt, ns)
            stored = rt.to_storage(body) if rt.to_storage else body
            key = (rt.storage_key, ns, name)
            if key in self._objects:
                raise already_exists(rt, name)
            smeta = stored["metadata"]
            smeta["uid"] = str(uuid.uuid4())
            smeta["creationTimestamp"] = _now()
            if rt.generation:
                smeta["generation"] = 1
            smeta["resourceVersion"] = str(self._bump())
            self._objects[key] = stored
            self._record("ADDED", rt.storage_key, stored, None)
            return self._view(rt, stored)

    def _check_kind(self, rt: ResourceType, body: dict) -> None:
        api_version, kind = body.get("apiVersion"), body.get("kind")
        if api_version not in (None, "", rt.group_version):
            raise bad_request(f"the API version in the data ({api_version}) does not match the expected API "
                              f"version ({rt.group_version})")
        if kind not in (None, "", rt.kind):
            raise bad_request(f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})")
        body["apiVersion"], body["kind"] = rt.group_version, rt.kind

    def do_get(self, rt: ResourceType, ns: str, name: str) -> dict:
        with self._cond:
            stored = self._objects.get((rt.storage_key, ns, name))
            if stored is None:
                raise not_found(rt, name)
            return self._view(rt, stored)

    def do_update(self, rt: ResourceType, ns: str, name: str, mutate: Callable[[dict], dict],
                  subresource: str | None = None) -> dict:
        """Read, ``mutate(view) -> new view``, check, admit, store: the one
        write path of PUT, PATCH, status and binding. Optimistic, as etcd's
        GuaranteedUpdate: nothing is locked while ``mutate`` and the webhooks
        run; if the object changed meanwhile, all of it runs again on the new
        one (so a request that carried the old resourceVersion gets its 409)."""
        key = (rt.storage_key, ns, name)
        while True:
            with self._cond:
                stored = self._objects.get(key)
                if stored is None:
                    raise not_found(rt, name)
                old = self._view(rt, stored)
            new = self._updated(rt, ns, name, mutate, subresource, old)
            with self._cond:
                if self._objects.get(key) is not stored:
                    continue  # written meanwhile: again, on the new object
                if new == old:
                    return old  # nothing changed: no write, no event
                meta, ometa = new["metadata"], old["metadata"]
                if rt.generation and _spec_of(new) != _spec_of(old):
                    meta["generation"] = int(ometa.get("generation", 0)) + 1
                stored_new = rt.to_storage(new) if rt.to_storage else new
                meta_s = stored_new["metadata"]
                if (meta_s.get("deletionTimestamp") and not meta_s.get("finalizers")
                        and meta_s.get("deletionGracePeriodSeconds", 0) == 0):
                    return self._remove(rt, key, stored_new)
                meta_s["resourceVersion"] = str(self._bump())
                self._objects[key] = stored_new
                self._record("MODIFIED", rt.storage_key, stored_new, stored)
                return self._view(rt, stored_new)

    def _updated(self, rt: ResourceType, ns: str, name: str, mutate: Callable[[dict], dict],
                 subresource: str | None, old: dict) -> dict:
        new = mutate(copy.deepcopy(old))
        if not isinstance(new, dict):
            raise bad_request(f"the updated object must be a JSON object, not {type(new).__name__}")
        self._check_kind(rt, new)
        meta = new.get("metadata")
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if meta.get("name") != name:
            raise bad_request(f"the name of the object ({meta.get('name')}) does not match the name on "
                              f"the URL ({name})")
        if rt.namespaced and meta.get("namespace") not in (None, "", ns):
            raise bad_request("the namespace of the provided object does not match the namespace sent on "
                              "the request")
        sent_rv = meta.get("resourceVersion")
        if sent_rv not in (None, "") and sent_rv != old["metadata"]["resourceVersion"]:
            raise stale(rt, name)
        ometa = old["metadata"]
        for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                  "generation", "resourceVersion"):
            if k in ometa:
                meta[k] = ometa[k]
            else:
                meta.pop(k, None)
        if rt.namespaced:
            meta["namespace"] = ns
        if "status" in rt.subresources:
            if subresource == "status":
                for k in set(new) | set(old):
                    if k not in ("metadata", "status", "apiVersion", "kind"):
                        if k in old:
                            new[k] = old[k]
                        else:
                            new.pop(k, None)
                if "ownerReferences" in ometa:
                    meta["ownerReferences"] = ometa["ownerReferences"]
                else:
                    meta.pop("ownerReferences", None)
            elif subresource is None:
                if "status" in old:
                    new["status"] = old["status"]
                else:
                    new.pop("status", None)
        if rt.kind == "Secret" and rt.group == "":
            _fold_string_data(new)
        if subresource is None:
            if rt.defaults:
                rt.defaults(new)  # every decoded object is defaulted, an update's too
            for hook in self.admission_hooks:
                new = hook(rt, "UPDATE", new, old)
        if subresource in (None, "status"):  # binding: admitted as a CREATE of the Binding (do_bind)
            new = self.webhooks.mutate(rt, subresource or "", "UPDATE", ns, new, old, {})
            meta = new["metadata"]
        if rt.prepare_update and subresource is None:
            rt.prepare_update(self, new, old)
        if rt.validate_update and subresource is None:
            causes = rt.validate_update(self, new, old)
            if causes:
                raise invalid(rt, name, causes)
        if rt.validate:
            causes = rt.validate(new)
            if causes:
                raise invalid(rt, name, causes)
        if ometa.get("deletionTimestamp") and len(meta.get("finalizers") or []) > len(ometa.get("finalizers") or []):
            raise invalid(rt, name, [("FieldValueForbidden", "metadata.finalizers",
                                      "Forbidden: no new finalizers can be added if the object is being deleted")])
        if subresource in (None, "status") and new != old:
            self.webhooks.validate(rt, subresource or "", "UPDATE", ns, new, old, {})
        return new

    def _remove(self, rt: ResourceType, key, last: dict) -> dict:
        prev = self._objects.pop(key)
        last = copy.deepcopy(last)
        last["metadata"]["resourceVersion"] = str(self._bump())
        self._record("DELETED", rt.storage_key, last, prev)
        return self._view(rt, last)

    def do_delete(self, rt: ResourceType, ns: str, name: str, options: dict) -> tuple[dict, bool]:
        """Returns (the object as it now is or was last, whether it is gone)."""
        if self.webhooks.configured():
            current = self.do_get(rt, ns, name)
            opts = {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", **options}
            self.webhooks.mutate(rt, "", "DELETE", ns, None, current, opts)
            self.webhooks.validate(rt, "", "DELETE", ns, None, current, opts)
        with self._cond:
            key = (rt.storage_key, ns, name)
            stored = self._objects.get(key)
            if stored is None:
                raise not_found(rt, name)
            meta = stored["metadata"]
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != meta["uid"]:
                raise conflict(rt, name, f"Precondition failed: UID in precondition: {pre['uid']}, UID in object "
                                         f"meta: {meta['uid']}")
            if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
                raise conflict(rt, name, f"Precondition failed: ResourceVersion in precondition: "
                                         f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                                         f"{meta['resourceVersion']}")
            if rt.key == "namespaces":
                for k in [k for k in self._objects if k[1] == name and k[0] != "namespaces"]:
                    self._remove(self._storage_type(k[0]), k, self._objects[k])
            grace = 0
            if rt.graceful:
                grace = options.get("gracePeriodSeconds")
                if grace is None:
                    grace = (stored.get("spec") or {}).get("terminationGracePeriodSeconds") or 0
                if not (stored.get("spec") or {}).get("nodeName"):
                    grace = 0
                if (stored.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    grace = 0
                grace = 1 if grace < 0 else int(grace)
                current = meta.get("deletionGracePeriodSeconds")
                if current is not None and grace >= current and grace != 0:
                    return self._view(rt, stored), False  # already deleting with a shorter or equal grace
            if grace == 0 and not meta.get("finalizers"):
                return self._remove(rt, key, stored), True
            new = copy.deepcopy(stored)
            nmeta = new["metadata"]
            if not nmeta.get("deletionTimestamp") or grace < (nmeta.get("deletionGracePeriodSeconds") or 0):
                nmeta["deletionTimestamp"] = _at(grace)
            nmeta["deletionGracePeriodSeconds"] = grace
            if new == stored:
                return self._view(rt, stored), False
            nmeta["resourceVersion"] = str(self._bump())
            self._objects[key] = new
            self._record("MODIFIED", rt.storage_key, new, stored)
            return self._view(rt, new), False

    def _storage_type(self, skey: str) -> ResourceType:
        return next(rt for rt in self.types.values() if rt.key == skey)

    def do_bind(self, ns: str, name: str, binding: dict) -> None:
        rt = self.types[("", "v1", "pods")]
        bmeta = binding.get("metadata") or {}
        if bmeta.get("name", name) != name:
            raise bad_request("name in URL does not match name in Binding object")
        target = binding.get("target") or {}
        if target.get("kind") not in (None, "", "Node"):
            raise bad_request(f"a pod can only be bound to a Node, not a {target.get('kind')!r}")
        node = target.get("name") or ""
        if not node:
            raise invalid(self.types[("", "v1", "pods")], name,
                          [("FieldValueRequired", "target.name", "Required value")])
        if self.webhooks.configured():  # pods/binding is admitted as the CREATE of a Binding
            obj = {**copy.deepcopy(binding), "apiVersion": "v1", "kind": "Binding"}
            obj["metadata"] = {**copy.deepcopy(bmeta), "name": name, "namespace": ns}
            obj = self.webhooks.mutate(rt, "binding", "CREATE", ns, obj, None, {})
            self.webhooks.validate(rt, "binding", "CREATE", ns, obj, None, {})
            binding, bmeta = obj, obj.get("metadata") or {}
            target = binding.get("target") or {}
            node = target.get("name") or ""

        def bind(pod: dict) -> dict:
            if pod["metadata"].get("deletionTimestamp"):
                raise conflict(rt, name, f"pod {name} is being deleted, cannot be assigned to a host", "pods/binding")
            spec = pod.setdefault("spec", {})
            if spec.get("nodeName"):
                raise conflict(rt, name, f'pod {name} is already assigned to node "{spec["nodeName"]}"',
                               "pods/binding")
            if spec.get("schedulingGates"):
                raise conflict(rt, name, f"pod {name} has non-empty .spec.schedulingGates", "pods/binding")
            if bmeta.get("uid") and bmeta["uid"] != pod["metadata"]["uid"]:
                raise conflict(rt, name, f"Precondition failed: UID in precondition: {bmeta['uid']}, UID in "
                                         f"object meta: {pod['metadata']['uid']}", "pods/binding")
            spec["nodeName"] = node
            for k in ("annotations", "labels"):
                if bmeta.get(k):
                    pod["metadata"].setdefault(k, {}).update(bmeta[k])
            status = pod.setdefault("status", {})
            status.pop("nominatedNodeName", None)
            conds = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
            conds.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                          "lastTransitionTime": _now()})
            status["conditions"] = conds
            return pod

        self.do_update(rt, ns, name, bind, subresource="binding")

    def do_list(self, rt: ResourceType, ns: str | None, query: Mapping[str, str]) -> dict:
        match = self._matcher(rt, query)
        limit = int(query.get("limit") or 0)
        token = query.get("continue")
        with self._cond:
            want_rv = query.get("resourceVersion")
            if want_rv not in (None, "", "0") and not token:
                self._wait_for_rv(_parse_rv(want_rv))
            if token:
                snap_id, _, start = _decode_continue(token)
                snap = self._snapshots.get(snap_id)
                if snap is None:
                    raise expired("The provided continue parameter is too old to display a consistent list "
                                  "result. You can start a new list without the continue parameter, or use the "
                                  "continue token in this response to retrieve the remainder of the results. "
                                  "Continuing with the provided token results in an inconsistent list - objects "
                                  "that were created, modified, or deleted between the time the first chunk was "
                                  "returned and now may show up in the list.")
                items = snap.items[start:]
                rv = snap.rv
            else:
                items = [self._view(rt, o) for (sk, ons, _n), o in sorted(self._objects.items())
                         if sk == rt.storage_key and (ns is None or ons == ns) and match(self._view(rt, o))]
                rv = self._rv
                start = 0
            meta: dict = {"resourceVersion": str(rv)}
            if limit and len(items) > limit:
                if not token:
                    snap_id = str(next(self._snapshot_ids))
                    self._snapshots[snap_id] = _Snapshot(rv, items)
                    while len(self._snapshots) > 100:
                        self._snapshots.pop(next(iter(self._snapshots)))
                meta["continue"] = _encode_continue(snap_id, rv, start + limit)
                meta["remainingItemCount"] = len(items) - limit
                items = items[:limit]
        for it in items:
            it.pop("kind", None)
            it.pop("apiVersion", None)
        return {"kind": f"{rt.kind}List", "apiVersion": rt.group_version, "metadata": meta, "items": items}

    def _wait_for_rv(self, rv: int) -> None:
        deadline = time.monotonic() + 3
        while self._rv < rv:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ApiError(504, "Timeout", f"Too large resource version: {rv}, current: {self._rv}",
                               {"causes": [{"reason": "ResourceVersionTooLarge",
                                            "message": "Too large resource version"}], "retryAfterSeconds": 1})
            self._cond.wait(left)

    def _matcher(self, rt: ResourceType, query: Mapping[str, str]) -> Callable[[dict], bool]:
        labels = parse_label_selector(query["labelSelector"]) if query.get("labelSelector") else None
        fields = parse_field_selector(rt, query["fieldSelector"]) if query.get("fieldSelector") else None

        def match(obj: dict) -> bool:
            if labels is not None and not labels((obj.get("metadata") or {}).get("labels") or {}):
                return False
            return fields is None or fields(obj)

        return match

    # -- watch ---------------------------------------------------------------

    def watch(self, rt: ResourceType, ns: str | None, query: Mapping[str, str], emit: Callable[[dict], None]) -> None:
        """Stream events to ``emit`` until the timeout, the server stops or
        ``emit`` raises (the client went away)."""
        match = self._matcher(rt, query)
        timeout = query.get("timeoutSeconds")
        deadline = time.monotonic() + (float(timeout) if timeout else 1800.0)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        initial = query.get("sendInitialEvents") in ("true", "1")
        want = query.get("resourceVersion") or ""

        def mine(ev: _Event) -> bool:
            m = ev.obj["metadata"]
            return ev.skey == rt.storage_key and (ns is None or m.get("namespace", "") == ns)

        def bookmark(rv: int, end_initial: bool = False) -> dict:
            meta: dict = {"resourceVersion": str(rv)}
            if end_initial:
                meta["annotations"] = {"k8s.io/initial-events-end": "true"}
            return {"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.group_version, "metadata": meta}}

        out: list[dict] = []
        with self._cond:
            while self._watches_held and not self._stopped:
                self._cond.wait(0.05)
            epoch = self._watch_epoch
            if want in ("", "0") or initial:
                for (sk, ons, _n), o in sorted(self._objects.items()):
                    if sk == rt.storage_key and (ns is None or ons == ns):
                        view = self._view(rt, o)
                        if match(view):
                            out.append({"type": "ADDED", "object": view})
                position = self._rv
                if initial and bookmarks:
                    out.append(bookmark(position, end_initial=True))
            else:
                position = _parse_rv(want)
                if position < self._oldest:
                    out.append({"type": "ERROR", "object": expired(
                        f"too old resource version: {position} ({self._oldest})").status()})
                    position = None
        for ev in out:
            emit(ev)
        if position is None:
            return
        next_bookmark = time.monotonic() + self.bookmark_interval
        while True:
            out = []
            with self._cond:
                while True:
                    if self._stopped or self._watch_epoch != epoch:
                        return
                    now = time.monotonic()
                    if now >= deadline:
                        return
                    if position < self._oldest:
                        out.append({"type": "ERROR", "object": expired(
                            f"too old resource version: {position} ({self._oldest})").status()})
                        break
                    events = [ev for ev in self._history if ev.rv > position]
                    if events:
                        for ev in events:
                            position = ev.rv
                            if not mine(ev):
                                continue
                            new_view = self._view(rt, ev.obj)
                            if ev.type == "ADDED":
                                if match(new_view):
                                    out.append({"type": "ADDED", "object": new_view})
                            elif ev.type == "DELETED":
                                old_view = self._view(rt, ev.prev) if ev.prev else new_view
                                if match(old_view):
                                    out.append({"type": "DELETED", "object": new_view})
                            else:
                                was, now_m = match(self._view(rt, ev.prev)), match(new_view)
                                if was and now_m:
                                    out.append({"type": "MODIFIED", "object": new_view})
                                elif now_m:
                                    out.append({"type": "ADDED", "object": new_view})
                                elif was:
                                    out.append({"type": "DELETED", "object": new_view})
                        if out:
                            break
                        continue
                    if bookmarks and now >= next_bookmark:
                        position = max(position, self._rv)
                        out.append(bookmark(self._rv))
                        next_bookmark = now + self.bookmark_interval
                        break
                    wait = deadline - now
                    if bookmarks:
                        wait = min(wait, next_bookmark - now)
                    self._cond.wait(max(wait, 0.001))
            for ev in out:
                emit(ev)
            if out and out[-1]["type"] == "ERROR":
                return


def _spec_of(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _parse_rv(text: str) -> int:
    try:
        rv = int(text)
    except ValueError:
        raise bad_request(f'invalid resource version "{text}": a decimal integer is accepted') from None
    if rv < 0:
        raise bad_request(f'invalid resource version "{text}": must not be negative')
    return rv


def _encode_continue(snap_id: str, rv: int, start: int) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "snapshot": snap_id, "start": start}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[str, int, int]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return str(raw["snapshot"]), int(raw["rv"]), int(raw["start"])
    except (ValueError, KeyError, TypeError):
        raise bad_request(f"invalid continue token {token!r}: pass the metadata.continue of a previous "
                          f"list response") from None


# ---------------------------------------------------------------------------
# HTTP

# gnostic openapi_v2.Document{swagger: "2.0", info: {title, version}} in protobuf
def _openapi_v2_proto() -> bytes:
    def ld(field_no: int, payload: bytes) -> bytes:
        return bytes([field_no << 3 | 2, len(payload)]) + payload
    info = ld(1, b"Kubernetes (hamid stand-in)") + ld(2, SERVER_VERSION["gitVersion"].encode())
    return ld(1, b"2.0") + ld(2, info)


_OPENAPI_V2_JSON = {"swagger": "2.0", "info": {"title": "Kubernetes (hamid stand-in)",
                                                "version": SERVER_VERSION["gitVersion"]},
                    "paths": {}, "definitions": {}}

_PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json",
                "application/strategic-merge-patch+json")


class _Server(ThreadingHTTPServer):
    tls_context: Callable[[str], ssl.SSLContext] | None = None  # local address -> context; None: plain HTTP

    def finish_request(self, request, client_address) -> None:
        """With TLS, the handshake happens here, in the connection's own
        thread, so a slow or failing client never holds up the others."""
        if self.tls_context is None:
            return super().finish_request(request, client_address)
        try:
            request.settimeout(10)
            conn = self.tls_context(request.getsockname()[0]).wrap_socket(request, server_side=True)
            conn.settimeout(None)
        except (ssl.SSLError, OSError) as e:
            log.debug("apiserver_standin_tls_handshake_failed", client=client_address, error=repr(e))
            return
        try:
            super().finish_request(conn, client_address)
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def handle_error(self, request, client_address) -> None:
        import sys
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionResetError, BrokenPipeError, ssl.SSLError)):
            return  # a client that hung up (or dropped a pooled connection)
        log.error("apiserver_standin_connection_error", client=client_address, error=repr(exc))


class _Handler(BaseHTTPRequestHandler):
    api: ApiServer
    protocol_version = "HTTP/1.1"
    server_version = "hamid-apiserver-standin"

    def setup(self) -> None:
        super().setup()
        # headers and body go out in separate writes: without this, delayed ACKs stall each answer ~40 ms
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):  # quiet: structlog below
        pass

    # -- plumbing ------------------------------------------------------------

    def _drain(self) -> None:
        """Read a request body nobody read (the request was refused before its
        handler ran), so the next request on this keep-alive connection
        starts where it should."""
        if getattr(self, "_body_read", True):
            return
        self._body_read = True
        length = int(self.headers.get("Content-Length") or 0)
        if length > 64 << 20 or (self.headers.get("Transfer-Encoding") or "").lower() == "chunked":
            self.close_connection = True
        elif length:
            self.rfile.read(length)

    def _send(self, code: int, body, content_type: str = "application/json") -> None:
        self._drain()
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        for w in getattr(_warnings, "items", None) or []:  # admission warnings, as RFC 7234 warn-code 299
            self.send_header("Warning", '299 - "%s"' % w.replace("\\", "\\\\").replace('"', '\\"'))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _body(self):
        self._body_read = True
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        ctype = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        try:
            if ctype in ("application/yaml", "application/apply-patch+yaml"):
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as e:
            raise bad_request(f"the body of the request is not valid {ctype}: {e}") from None

    def _query(self) -> dict[str, str]:
        q = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        return {k: v[-1] for k, v in q.items()}

    def _handle(self) -> None:
        started = time.monotonic()
        code = 200
        _warnings.items = []
        _user.info = None
        self._body_read = False
        try:
            _user.info = self.api.impersonate(self.api.authenticate(self.headers.get("Authorization")),
                                              self.headers)
            raw_path = urlsplit(self.path).path or "/"
            if self.api.authorize:
                self.api.check(_user.info, request_attributes(self.command, raw_path, self._query()))
            accept = self.headers.get("Accept") or "*/*"
            path = raw_path.rstrip("/") or "/"
            if path.startswith("/openapi/v2"):
                if "protobuf" in accept:
                    self._send(200, _openapi_v2_proto(), "application/octet-stream")
                else:
                    self._send(200, _OPENAPI_V2_JSON)
                return
            if not any(t in accept for t in ("json", "*/*", "application/*")):
                raise ApiError(406, "NotAcceptable", f"only the following media types are accepted: "
                                                     f"application/json, application/yaml (asked: {accept})")
            code = self._route(path)
        except ApiError as e:
            code = e.code
            self._send(e.code, e.status())
        except (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError):  # the client went away (a killed watcher)
            code = 499
        except Exception as e:  # a bug in the stand-in: say so loudly
            code = 500
            log.exception("apiserver_standin_bug", method=self.command, path=self.path)
            self._send(500, ApiError(500, "InternalError", f"stand-in bug: {e!r}").status())
        finally:
            self.api.requests[(self.command, urlsplit(self.path).path)] += 1
            log.debug("apiserver_standin_request", method=self.command, path=self.path, code=code,
                      ms=round((time.monotonic() - started) * 1000, 2))

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle

    # -- routing -------------------------------------------------------------

    def _route(self, path: str) -> int:
        api = self.api
        parts = [p for p in path.split("/") if p]
        if path in ("/healthz", "/livez", "/readyz"):
            self._send(200, b"ok", "text/plain; charset=utf-8")
            return 200
        if path == "/version":
            self._send(200, SERVER_VERSION)
            return 200
        if path == "/api":
            self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": "%s:%d" % self.server.server_address[:2]}]})
            return 200
        if path == "/apis":
            self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": self._groups()})
            return 200
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 2:
            group = parts[1]
            if len(parts) == 2:
                found = [g for g in self._groups() if g["name"] == group]
                if not found:
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
                self._send(200, {"kind": "APIGroup", "apiVersion": "v1", **found[0]})
                return 200
            version, rest = parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        served = [rt for rt in api.types.values() if rt.group == group and rt.version == version]
        if not served:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            self._send(200, self._resource_list(group, version, served))
            return 200
        watch_path = rest[0] == "watch"
        if watch_path:
            rest = rest[1:]
        ns: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and any(rt.plural == rest[2] and rt.namespaced for rt in served):
            ns, rest = rest[1], rest[2:]
        plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)
        if len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        rt = api.types.get((group, version, plural))
        if rt is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if rt.namespaced and ns is None and name is not None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if sub is not None and sub not in rt.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        query = self._query()
        method = self.command
        if query.get("dryRun"):
            # refused rather than ignored: an ignored dryRun would write
            raise bad_request(f"dryRun={query['dryRun']!r}: the API-server stand-in does not implement dry runs")
        if watch_path or query.get("watch") in ("1", "true"):
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", f"the server does not allow this method on the requested "
                                                        f"resource: {method} on a watch")
            if name is not None:  # /watch/.../name: a watch on one object
                query["fieldSelector"] = ",".join(filter(None, [query.get("fieldSelector"), f"metadata.name={name}"]))
            self._watch(rt, ns, query)
            return 200
        ns_key = ns if rt.namespaced else ""
        if rt.review is not None:
            if method != "POST" or name is not None:
                raise ApiError(405, "MethodNotAllowed", f"the server does not allow this method on the requested "
                                                        f"resource: {rt.plural} accepts POST (create) only")
            body = self._body() or {}
            if not isinstance(body, dict):
                raise bad_request(f"the body of a {rt.kind} must be a JSON object")
            self._check_review_kind(rt, body)
            self._send(201, rt.review(api, body, _current_user()))
            return 201
        if name is None:
            if method == "GET":
                self._send(200, api.do_list(rt, ns if rt.namespaced else None, query))
                return 200
            if method == "POST":
                if rt.namespaced and ns is None:
                    raise ApiError(405, "MethodNotAllowed", f"POST to the cluster-wide {rt.plural} is not allowed: "
                                                            f"create in /namespaces/<ns>/{rt.plural}")
                self._send(201, api.do_create(rt, ns_key, self._body() or {}))
                return 201
            raise ApiError(405, "MethodNotAllowed", f"the server does not allow this method on the requested "
                                                    f"resource: {method} on a {rt.plural} collection (the stand-in "
                                                    f"has no deletecollection)")
        if sub == "binding":
            if method != "POST":
                raise ApiError(405, "MethodNotAllowed", "pods/binding accepts POST only")
            api.do_bind(ns_key, name, self._body() or {})
            self._send(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
            return 201
        if method in ("GET", "HEAD"):
            self._send(200, api.do_get(rt, ns_key, name))
            return 200
        if method == "PUT":
            body = self._body()
            self._send(200, api.do_update(rt, ns_key, name, lambda _old: body, subresource=sub))
            return 200
        if method == "PATCH":
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if ctype not in _PATCH_TYPES:
                raise ApiError(415, "UnsupportedMediaType",
                               f"the body of the request was in an unknown format ({ctype or 'none'}) - accepted "
                               f"media types include: {', '.join(_PATCH_TYPES)} (the stand-in has no server-side "
                               f"apply)")
            patch = self._body()
            self._send(200, api.do_update(rt, ns_key, name, lambda old: _apply_patch(rt, ctype, old, patch),
                                          subresource=sub))
            return 200
        if method == "DELETE":
            if sub is not None:
                raise ApiError(405, "MethodNotAllowed", f"DELETE is not allowed on {rt.plural}/{sub}")
            opts = self._body() or {}
            if "gracePeriodSeconds" in query:
                opts["gracePeriodSeconds"] = int(query["gracePeriodSeconds"])
            obj, gone = api.do_delete(rt, ns_key, name, opts)
            if rt.return_deleted_object or not gone:
                self._send(200, obj)
            else:
                details = {"name": name, "kind": rt.plural, "uid": obj["metadata"]["uid"]}
                if rt.group:
                    details["group"] = rt.group
                self._send(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                 "details": details})
            return 200
        raise ApiError(405, "MethodNotAllowed", f"the server does not allow this method on the requested "
                                                f"resource: {method}")

    def _check_review_kind(self, rt: ResourceType, body: dict) -> None:
        api_version, kind = body.get("apiVersion"), body.get("kind")
        if api_version not in (None, "", rt.group_version) or kind not in (None, "", rt.kind):
            raise bad_request(f"the body is a {api_version}, Kind={kind}: expected {rt.group_version}, "
                              f"Kind={rt.kind}")

    def _groups(self) -> list[dict]:
        groups: dict[str, list[str]] = {}
        for rt in self.api.types.values():
            if rt.group:
                versions = groups.setdefault(rt.group, [])
                if rt.version not in versions:
                    versions.append(rt.version)
        out = []
        for g, versions in groups.items():
            vs = [{"groupVersion": f"{g}/{v}", "version": v} for v in versions]
            out.append({"name": g, "versions": vs, "preferredVersion": vs[0]})
        return out

    def _resource_list(self, group: str, version: str, served: list[ResourceType]) -> dict:
        resources = []
        for rt in served:
            verbs = ["create"] if rt.review else list(_ALL_VERBS)
            resources.append({"name": rt.plural, "singularName": rt.kind.lower(), "namespaced": rt.namespaced,
                              "kind": rt.kind, "verbs": verbs,
                              **({"shortNames": list(rt.short_names)} if rt.short_names else {}),
                              **({"categories": list(rt.categories)} if rt.categories else {})})
            for sub in rt.subresources:
                if sub == "binding":
                    resources.append({"name": f"{rt.plural}/binding", "singularName": "", "namespaced": True,
                                      "kind": "Binding", "verbs": ["create"]})
                else:
                    resources.append({"name": f"{rt.plural}/{sub}", "singularName": "", "namespaced": rt.namespaced,
                                      "kind": rt.kind, "verbs": ["get", "patch", "update"]})
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}

    def _watch(self, rt: ResourceType, ns: str | None, query: dict[str, str]) -> None:
        # validate before the 200: a bad selector is a 400, not a stream
        self.api._matcher(rt, query)
        if query.get("resourceVersion") not in (None, ""):
            _parse_rv(query["resourceVersion"])
        self._drain()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()

        def emit(ev: dict) -> None:
            data = json.dumps(ev).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        try:
            self.api.watch(rt, ns, query, emit)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True


def _apply_patch(rt: ResourceType, ctype: str, old: dict, patch) -> dict:
    if ctype == "application/merge-patch+json":
        if not isinstance(patch, dict):
            raise bad_request("a merge patch must be a JSON object")
        return merge_patch(old, patch)
    if ctype == "application/strategic-merge-patch+json":
        if not isinstance(patch, dict):
            raise bad_request("a strategic merge patch must be a JSON object")
        return strategic_merge_patch(old, patch, rt.merge_keys)
    if not isinstance(patch, list):
        raise bad_request("a JSON patch must be a JSON array of operations")
    try:
        return jsonpatch.apply_patch(old, patch)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
        # the real server's NewGenericServerResponse(422): the reason is in details.causes
        raise ApiError(422, "Invalid", "the server rejected our request due to an error in our request",
                       {"causes": [{"message": f"{type(e).__name__}: {e}"}]}) from None
