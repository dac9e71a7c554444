"""The kinds the stand-in serves: defaults, validation and merge keys, kind by kind.

Part of the kube-apiserver stand-in (see the package's docstring); names of its other
parts are linked in by the package at import (``_link``)."""

from __future__ import annotations

from ._base import Callable, Mapping, base64, copy, dataclass, field, json, re, urlsplit  # noqa: F401

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
    # a controller's reaction to an object as written (create, update, status): it acts later, through the API
    controller: Callable[[ApiServer, dict], None] | None = None
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


# -- quantities ---------------------------------------------------------------

_BINARY_SUFFIX = re.compile(r"(Ki|Mi|Gi|Ti|Pi|Ei)$")
_EXPONENT_SUFFIX = re.compile(r"[eE][+-]?[0-9]+$")
_DECIMAL_SUFFIX = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}


def canonical_quantity(value):
    """A quantity as the real server stores it (apimachinery's ``Quantity.String()``, the form
    kept from parsing): decimal ``30000`` is ``30k``, ``0.5`` is ``500m``, ``1500`` stays;
    binary ``1024Mi`` is ``1Gi``, one not a whole multiple of 1024 is written in units; an
    exponent form keeps ``e``. What does not parse is left for validation."""
    from hamid.request.quantity import NANO, nanos

    try:
        n = nanos(value)
    except ValueError:
        return value
    if n == 0:
        return "0"
    s, sign, a = str(value), "-" if n < 0 else "", abs(n)
    if _BINARY_SUFFIX.search(s) and a % NANO == 0 and a // NANO >= 1024:
        v = a // NANO
        for k, suffix in ((60, "Ei"), (50, "Pi"), (40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki")):
            if v % (1 << k) == 0:
                return f"{sign}{v >> k}{suffix}"
        return f"{sign}{v}"
    exp, m = -9, a
    while m % 1000 == 0 and exp < 18:
        m //= 1000
        exp += 3
    if _EXPONENT_SUFFIX.search(s) and not _BINARY_SUFFIX.search(s):
        return f"{sign}{m}" + (f"e{exp}" if exp else "")
    return f"{sign}{m}{_DECIMAL_SUFFIX[exp]}"


def _canonical_resources(c: dict) -> None:
    res = c.get("resources") or {}
    for part in ("limits", "requests"):
        if isinstance(res.get(part), dict):
            res[part] = {k: canonical_quantity(v) for k, v in res[part].items()}


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
            _canonical_resources(c)  # decoded and written back: quantities in canonical form


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


NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
NOT_READY_LIFT_S = 0.2  # how long after a node is Ready the stand-in's node lifecycle controller lifts the taint


def _node_ready(obj: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or ())


def _node_prepare_create(server: ApiServer, obj: dict) -> None:
    labels = obj.setdefault("metadata", {}).setdefault("labels", {})
    labels.setdefault("kubernetes.io/hostname", obj["metadata"]["name"])
    # the TaintNodesByCondition admission plugin: every new Node is not-ready until the node
    # lifecycle controller sees it Ready
    taints = obj.setdefault("spec", {}).setdefault("taints", [])
    if not any(t.get("key") == NOT_READY_TAINT["key"] and t.get("effect") == "NoSchedule" for t in taints):
        taints.append(dict(NOT_READY_TAINT))


def _node_controller(server: ApiServer, node: dict) -> None:
    if _node_ready(node) and any(t.get("key") == NOT_READY_TAINT["key"]
                                 for t in (node.get("spec") or {}).get("taints") or ()):
        _lift_not_ready_soon(server, node["metadata"]["name"])


def _lift_not_ready_soon(server: ApiServer, name: str) -> None:
    """The node lifecycle controller (kube-controller-manager): it removes the not-ready taint of a
    Node that is Ready, moments after it sees it so (a watch event later, not in the same write)."""
    import threading

    def lift() -> None:
        try:
            node = server.get("Node", None, name)
        except Exception:
            return  # deleted meanwhile
        taints = (node.get("spec") or {}).get("taints") or []
        if not _node_ready(node) or not any(t.get("key") == NOT_READY_TAINT["key"] for t in taints):
            return
        node["spec"]["taints"] = [t for t in taints if t.get("key") != NOT_READY_TAINT["key"]]
        if not node["spec"]["taints"]:
            del node["spec"]["taints"]
        try:
            server.update(node)
        except Exception:
            _lift_not_ready_soon(server, name)  # a conflicting write: the controller tries again

    t = threading.Timer(NOT_READY_LIFT_S, lift)
    t.daemon = True
    t.start()


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
                 NODE_MERGE_KEYS, prepare_create=_node_prepare_create, controller=_node_controller,
                 return_deleted_object=False),
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


from .dra import DRA_TYPES  # noqa: E402  (it builds on this module's helpers)

BUILTIN_TYPES = BUILTIN_TYPES + DRA_TYPES
