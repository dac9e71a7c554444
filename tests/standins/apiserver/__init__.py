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
  authorizer, never stored: ``kubectl auth can-i [--list]``);
  ``resource.k8s.io/v1`` deviceclasses, resourceclaims with ``status``,
  resourceclaimtemplates and resourceslices (field selectors
  ``spec.nodeName``, ``spec.driver``, ``spec.pool.name``), validated as
  :mod:`apiserver.dra` says (and not: CEL compilation, feature gates,
  allocation transitions). Discovery lists
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
  :mod:`hamid.webhook.certs`), its PEM in :attr:`ApiServer.ca_pem` (a pod's
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
  requests copied from limits where missing, extended resources'
  included); every container's quantities stored in canonical form, as
  the real server decodes and writes them (``nvidia.com/gpumem: "30000"``
  is stored and read back as ``"30k"``, ``0.5`` as ``500m``, ``1024Mi`` as
  ``1Gi``); an update may change only what
  the real pod validation allows (container images, ``activeDeadlineSeconds``,
  added tolerations, removed ``schedulingGates``; node selector and affinity
  only while gated, the narrowing rules left to :attr:`ApiServer.pod_update_hooks`);
  ``binding`` sets ``spec.nodeName`` and the ``PodScheduled`` condition and is
  409 when the pod is bound, being deleted or gated; the main resource ignores
  ``status`` and ``status`` ignores everything but status, labels and annotations.
* nodes: a new Node gets the ``node.kubernetes.io/not-ready:NoSchedule``
  taint (the TaintNodesByCondition admission plugin); the node lifecycle
  controller's part is played too: ``NOT_READY_LIFT_S`` after a write shows
  the Node ``Ready`` (``status.conditions``), the taint is removed by a later
  write (a watch sees the Node tainted first).
* restart (:meth:`ApiServer.restart`): the same objects on the same port,
  every connection and watch ended, and for ``RBAC_SYNC_S`` (a second) RBAC
  answers 403 to everyone outside system:masters, as a restarted server does
  until its informers have synced.
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
ServiceAccount, no ``kube-root-ca.crt``: tests/standins/podrunner.py plays those;
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

# The stand-in is one server split by concern; its parts call each other's functions at request
# time, so each part gets the names it uses from the others once all are loaded (no part needs
# another's names while it loads, save the ones it imports itself).

import importlib

_PARTS = ('_base', 'errors', 'kinds', 'selectors', 'auth', 'webhooks', 'patches', 'store', 'http')
_CROSS = {
    'errors': ('ResourceType',),
    'kinds': ('ApiError', 'ApiServer', '_now', 'invalid', 'label_selector_matches'),
    'selectors': ('ResourceType', 'bad_request'),
    'auth': ('ApiError', 'ApiServer', 'RBAC_GROUP', 'ResourceType', '_go_quote', '_split_top'),
    'webhooks': ('ApiError', 'ApiServer', 'ResourceType', 'USER_INFO', 'bad_request'),
    'patches': ('bad_request',),
    'store': ('ADMIN_TOKEN', 'ANONYMOUS', 'ApiError', 'BOOTSTRAP_CLUSTER_ROLES', 'BUILTIN_TYPES', 'MASTERS', 'RBAC_GROUP', 'REVIEW_TYPES', 'RequestAttributes', 'ResourceType', 'SA_ISSUER', 'SA_PREFIX', 'USER_INFO', 'WebhookDispatcher', '_BOOTSTRAP_META', '_Handler', '_RbacIndex', '_Server', '_fold_string_data', '_name_errors', 'already_exists', 'bad_request', 'conflict', 'expired', 'forbidden', 'invalid', 'merge_patch', 'not_found', 'parse_field_selector', 'parse_label_selector', 'rbac_decide', 'service_account_groups', 'stale', 'unauthorized'),
    'http': ('ApiError', 'ApiServer', 'ResourceType', '_ALL_VERBS', '_current_user', '_parse_rv', '_user', '_warnings', 'bad_request', 'merge_patch', 'request_attributes', 'strategic_merge_patch'),
}


def _link() -> dict:
    mods = {n: importlib.import_module(f"{__name__}.{n}") for n in _PARTS}
    base = vars(mods["_base"])
    owner = {}  # a name's part: the first (in load order) that has it; the few a part imports come from earlier
    for n in _PARTS[1:]:
        for k in vars(mods[n]):
            if k not in base and not k.startswith("__"):
                owner.setdefault(k, n)
    for n, names in _CROSS.items():
        for k in names:
            setattr(mods[n], k, getattr(mods[owner[k]], k))
    everything = {}
    for n in _PARTS:
        everything.update({k: v for k, v in vars(mods[n]).items() if not k.startswith("__")})
    return everything


globals().update(_link())
