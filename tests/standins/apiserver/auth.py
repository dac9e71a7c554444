"""Authentication and RBAC authorization: users, service-account tokens, access reviews.

Part of the kube-apiserver stand-in (see the package's docstring); names of its other
parts are linked in by the package at import (``_link``)."""

from __future__ import annotations

from ._base import Mapping, dataclass, re  # noqa: F401
from .kinds import ResourceType  # used while this part loads

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
