"""Would kube-scheduler take this pod to this node? Its default filters, as pure functions.

The leader places a gated pod on a node only if kube-scheduler, which binds
it afterwards, would also accept that node: otherwise the pod would be
committed on one node's ledger and stay pending. This module owns that
judgement, with no I/O: :func:`kube_filters`, kube-scheduler's default filter
plugins, in the order
its default profile runs them and stopping, as it does, at the first
plugin that rejects the node: NodeAffinity's PreFilter (``matchFields``
``metadata.name In`` in every term restricts the candidate nodes; the
others are "node(s) didn't satisfy plugin(s) [NodeAffinity]"),
NodeUnschedulable, NodeName, TaintToleration, NodeAffinity (nodeSelector
and required node affinity), NodePorts, NodeResourcesFit (requests
against ``status.allocatable`` minus the requests of the non-terminal
pods already there, with ``resourcehelper.PodRequests``' rules: app
containers and sidecars summed, each init container plus the sidecars
started before it, the larger of the two, pod-level cpu/memory requests,
``spec.overhead``; cpu counted in millicores and everything else in units,
each rounded up as ``Quantity.MilliValue()``/``Value()`` do). The GPU
resources hamid accounts itself are skipped (``ignored_resources``).
Quantities are parsed by :mod:`hamid.request.quantity`; the message for a pod
no node takes is :mod:`.fitsummary`'s, the patch pinning a pod to its node
:mod:`.narrow`'s.

Not modelled: the volume plugins, PodTopologySpread, InterPodAffinity and
DynamicResources (GPU pods that use them are judged by kube-scheduler
itself after the gate opens), preemption, and the scheduler's own
``addedAffinity``/``ignoredResourceGroups`` configuration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction

from ..request.quantity import NANO as _NANO, nanos as _nanos

# kube-scheduler's own words (its plugins' ErrReason constants)
REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_NODE_NAME = "node(s) didn't match the requested node name"
REASON_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
REASON_AFFINITY_PREFILTER = "node(s) didn't satisfy plugin(s) [NodeAffinity]"
REASON_AFFINITY_CONFLICT = "pod affinity terms conflict"  # a PreFilter rejection: said once, not per node
REASON_PORTS = "node(s) didn't have free ports for the requested pod ports"
REASON_TOO_MANY_PODS = "Too many pods"
PREFILTER_REJECTIONS = frozenset({REASON_AFFINITY_CONFLICT})


def _units(resource: str, nanos: int) -> int:
    """What kube-scheduler counts of a quantity: millicores for cpu, whole units otherwise, rounded up
    (``MilliValue()``/``Value()``)."""
    return -(-nanos // 10**6) if resource == "cpu" else -(-nanos // _NANO)


def _scalar(name: str) -> bool:
    """``IsScalarResourceName``: extended (a ``/`` name outside ``kubernetes.io/``, not ``requests.``),
    ``hugepages-*``, ``attachable-volumes-*`` or ``kubernetes.io/``-prefixed. Other names that are not
    cpu, memory, ephemeral-storage or pods are not counted by kube-scheduler at all."""
    if name.startswith(("hugepages-", "attachable-volumes-")):
        return True
    return "/" in name and not name.startswith("requests.")


_COUNTED = ("cpu", "memory", "ephemeral-storage")

# --------------------------------------------------------------------------------------------------
# requests


def _add(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        into[k] = into.get(k, 0) + v


def _max(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        if k not in into or v > into[k]:
            into[k] = v


def _container_requests(c: Mapping, where: str) -> dict[str, int]:
    res = c.get("resources") or {}
    req = dict(res.get("requests") or {})
    for k, v in (res.get("limits") or {}).items():
        req.setdefault(k, v)  # the API server's defaulting, for objects that did not go through it
    out = {}
    for k, v in req.items():
        try:
            out[k] = _nanos(v)
        except ValueError as e:
            raise ValueError(f"{where}.resources[{k!r}]: {e}") from None
    return out


def _pod_nanos(pod: Mapping) -> dict[str, int]:
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for i, c in enumerate(spec.get("containers") or ()):
        _add(total, _container_requests(c, f"spec.containers[{i}]"))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for i, c in enumerate(spec.get("initContainers") or ()):
        req = _container_requests(c, f"spec.initContainers[{i}]")
        if c.get("restartPolicy") == "Always":
            _add(total, req)
            _add(sidecars, req)
            step = dict(sidecars)
        else:
            step = dict(req)
            _add(step, sidecars)
        _max(init_peak, step)
    _max(total, init_peak)
    if spec.get("resources"):
        pod_level = _container_requests({"resources": spec["resources"]}, "spec")
        for k in ("cpu", "memory"):
            if k in pod_level:
                total[k] = pod_level[k]
    for k, v in (spec.get("overhead") or {}).items():
        try:
            _add(total, {k: _nanos(v)})
        except ValueError as e:
            raise ValueError(f"spec.overhead[{k!r}]: {e}") from None
    return total


def pod_requests(pod: Mapping) -> dict[str, Fraction]:
    """What ``pod`` asks of a node, exactly (``resourcehelper.PodRequests``).

    App containers are summed and restartable init containers (sidecars,
    ``restartPolicy: Always``) added to that sum; each other init container
    counts with the sidecars started before it; the larger of the two is
    taken per resource. Pod-level ``spec.resources`` requests replace the
    containers' cpu and memory (the resources pod-level requests cover), and
    ``spec.overhead`` is added. A container's limit stands in for a missing
    request, as the API server's defaulting would have written it.
    """
    return {k: Fraction(v, _NANO) for k, v in _pod_nanos(pod).items()}


_COUNTED_CACHE: dict[tuple[str, str], dict[str, int]] = {}
_COUNTED_CACHE_MAX = 65536


def _per_version(cache: dict, cap: int, obj: Mapping, compute):
    """``compute(obj)``, remembered in ``cache`` (at most ``cap`` entries, then emptied) per (uid,
    resourceVersion) for objects read from the API server (a resourceVersion names one content of the
    object); objects without both are computed each time."""
    meta = obj.get("metadata") or {}
    key = (meta.get("uid"), meta.get("resourceVersion"))
    if not (key[0] and key[1]):
        return compute(obj)
    hit = cache.get(key)
    if hit is None:
        hit = compute(obj)
        if len(cache) >= cap:
            cache.clear()
        cache[key] = hit
    return hit


def _counted(pod: Mapping) -> dict[str, int]:
    """A pod's requests as kube-scheduler's NodeInfo counts them (its ``Resource``): the exact total
    of the pod, then rounded up per resource. Remembered per version (:func:`_per_version`), since every
    pod on a node is counted again for each pod judged there."""
    return _per_version(_COUNTED_CACHE, _COUNTED_CACHE_MAX, pod, lambda p: {
        k: _units(k, v) for k, v in _pod_nanos(p).items() if k in _COUNTED or _scalar(k)})


# --------------------------------------------------------------------------------------------------
# the filters


def _tolerates(t: Mapping, taint: Mapping) -> bool:
    """``Toleration.ToleratesTaint``: effect and key match when given; Exists matches any value,
    Equal (the default) the same value."""
    if t.get("effect") and t["effect"] != taint.get("effect"):
        return False
    if t.get("key") and t["key"] != taint.get("key"):
        return False
    op = t.get("operator") or "Equal"
    if op == "Exists":
        return True
    if op == "Equal":
        return (t.get("value") or "") == (taint.get("value") or "")
    return False


def _tolerated(taint: Mapping, tolerations: Iterable[Mapping]) -> bool:
    return any(_tolerates(t, taint) for t in tolerations)


def _requirement(r: Mapping, value: str | None) -> bool:
    """One node selector requirement against a label's value (None: absent). A requirement that
    cannot be parsed matches nothing, as kube-scheduler ignores its parse errors."""
    op, values = r.get("operator"), r.get("values") or []
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        if value is None or len(values) != 1:
            return False
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _term_matches(term: Mapping, labels: Mapping[str, str], name: str | None) -> bool:
    exprs, fields = term.get("matchExpressions") or (), term.get("matchFields") or ()
    if not exprs and not fields:
        return False  # an empty term matches no objects
    if not all(_requirement(r, labels.get(r.get("key"))) for r in exprs):
        return False
    # metadata.name is the only field kube-scheduler supports; any other makes the term fail
    return all(r.get("key") == "metadata.name" and _requirement(r, name) for r in fields)


def _required_terms(pod: Mapping) -> list[Mapping] | None:
    req = (((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    return None if req is None else list(req.get("nodeSelectorTerms") or ())


def _prefilter_names(terms: list[Mapping] | None) -> set[str] | None:
    """NodeAffinity's PreFilter: the only nodes worth filtering when every term names nodes through
    ``matchFields metadata.name In`` (the union over terms of each term's intersection), else None."""
    if not terms:
        return None
    names: set[str] = set()
    for t in terms:
        term_names: set[str] | None = None
        for r in t.get("matchFields") or ():
            if r.get("key") == "metadata.name" and r.get("operator") == "In":
                s = set(r.get("values") or ())
                term_names = s if term_names is None else term_names & s
        if term_names is None:
            return None  # a term with no name requirement: every node is eligible
        names |= term_names
    return names


def _affinity_ok(pod: Mapping, node: Mapping) -> bool:
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    for k, v in ((pod.get("spec") or {}).get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    terms = _required_terms(pod)
    if not terms:
        return True  # no required affinity, or no terms: no constraint
    return any(_term_matches(t, labels, meta.get("name")) for t in terms)


def _host_ports(pod: Mapping) -> list[tuple[str, str, int]]:
    """``GetHostPorts``: host ports of the app containers and of the sidecars (restartable init
    containers); an empty hostIP is 0.0.0.0, an empty protocol TCP."""
    spec = pod.get("spec") or {}
    cs = [*(c for c in spec.get("initContainers") or () if c.get("restartPolicy") == "Always"),
          *(spec.get("containers") or ())]
    return [(p.get("hostIP") or "0.0.0.0", p.get("protocol") or "TCP", int(p["hostPort"]))
            for c in cs for p in c.get("ports") or () if int(p.get("hostPort") or 0) > 0]


def _port_conflict(want: list[tuple[str, str, int]], used: list[tuple[str, str, int]]) -> bool:
    """``HostPortInfo.CheckConflict``: same protocol and port, and the same IP or 0.0.0.0 on either side."""
    return any(port == uport and proto == uproto and (ip == uip or "0.0.0.0" in (ip, uip))
               for ip, proto, port in want for uip, uproto, uport in used)


def _live(pod: Mapping, pods_on_node: Iterable[Mapping]) -> list[Mapping]:
    """The pods kube-scheduler's cache holds for the node: not Succeeded or Failed (its informer
    filters those out), and not ``pod`` itself."""
    uid = (pod.get("metadata") or {}).get("uid")
    return [p for p in pods_on_node if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and (uid is None or (p.get("metadata") or {}).get("uid") != uid)]


class NodeLoad:
    """What the pods on a node hold as NodeResourcesFit and NodePorts count them (their number, their
    summed requests, their host ports), kept by adding and taking away one pod at a time so a caller
    judging many pods against one node does not sum its pods again for each (the leader's passes)."""

    __slots__ = ("pods", "used", "ports")

    def __init__(self) -> None:
        self.pods = 0
        self.used: dict[str, int] = {}
        self.ports: dict[tuple[str, str, int], int] = {}

    def add(self, pod: Mapping, sign: int = 1) -> None:
        """Count ``pod`` (``sign`` -1: stop counting it)."""
        self.pods += sign
        for k, v in _counted(pod).items():
            self.used[k] = self.used.get(k, 0) + sign * v
        for hp in _host_ports(pod):
            n = self.ports.get(hp, 0) + sign
            if n:
                self.ports[hp] = n
            else:
                self.ports.pop(hp, None)

    def plus(self, pods: Iterable[Mapping], minus: Iterable[Mapping] = ()) -> "NodeLoad":
        """A copy with ``pods`` added and ``minus`` taken away."""
        out = NodeLoad()
        out.pods, out.used, out.ports = self.pods, dict(self.used), dict(self.ports)
        for p in pods:
            out.add(p)
        for p in minus:
            out.add(p, -1)
        return out


def node_load(pods_on_node: Iterable[Mapping]) -> NodeLoad:
    """The load of ``pods_on_node`` (the live ones: not Succeeded or Failed)."""
    load = NodeLoad()
    for p in _live({}, pods_on_node):
        load.add(p)
    return load


_ALLOC_CACHE: dict[tuple[str, str], dict[str, int]] = {}
_ALLOC_CACHE_MAX = 16384


def _allocatable(node: Mapping) -> dict[str, int]:
    """The node's ``status.allocatable`` as kube-scheduler counts it, remembered per version
    (:func:`_per_version`; a leader judges many pods against one node object)."""
    return _per_version(_ALLOC_CACHE, _ALLOC_CACHE_MAX, node, _read_allocatable)


def _read_allocatable(node: Mapping) -> dict[str, int]:
    alloc: dict[str, int] = {}
    for k, v in ((node.get("status") or {}).get("allocatable") or {}).items():
        try:
            alloc[k] = _units(k, _nanos(v))
        except ValueError as e:
            raise ValueError(f"node {(node.get('metadata') or {}).get('name')!r} status.allocatable[{k!r}]: {e}") from None
    return alloc


def _resources(pod: Mapping, node: Mapping, live: list[Mapping] | NodeLoad, ignored: set[str]) -> list[str]:
    """NodeResourcesFit's ``fitsRequest``: every insufficient resource, in its order (pods, cpu, memory,
    ephemeral-storage, then the scalar resources, by name here where Go iterates a map)."""
    alloc = _allocatable(node)
    reasons = []
    if (live.pods if isinstance(live, NodeLoad) else len(live)) + 1 > alloc.get("pods", 0):
        reasons.append(REASON_TOO_MANY_PODS)
    want = _counted(pod)
    if isinstance(live, NodeLoad):
        used = live.used
    else:
        used = {}
        for p in live:
            for k, v in _counted(p).items():
                used[k] = used.get(k, 0) + v
    for k in _COUNTED:
        if want.get(k, 0) > 0 and want[k] > alloc.get(k, 0) - used.get(k, 0):
            reasons.append(f"Insufficient {k}")
    for k in sorted(r for r in want if _scalar(r)):
        if want[k] == 0 or k in ignored:
            continue
        if want[k] > alloc.get(k, 0) - used.get(k, 0):
            reasons.append(f"Insufficient {k}")
    return reasons


def kube_filters(pod: dict, node: dict, pods_on_node: list[dict] | NodeLoad, *,
                 ignored_resources: set[str]) -> list[str]:
    """kube-scheduler's reasons for not taking ``pod`` to ``node`` (``[]``: it would).

    ``pods_on_node`` are the pods bound to the node (terminal ones and
    ``pod`` itself are left out here), or their :class:`NodeLoad` (which
    must already leave out terminal pods and ``pod``); ``ignored_resources`` are resource
    names not checked (the GPU resources hamid accounts itself). As
    kube-scheduler, the first plugin that rejects the node gives all the
    reasons: NodeResourcesFit may give several, the others one. A quantity
    that cannot be parsed raises ``ValueError`` naming the field.
    """
    spec = pod.get("spec") or {}
    nspec = node.get("spec") or {}
    name = (node.get("metadata") or {}).get("name")
    names = _prefilter_names(_required_terms(pod))
    if names is not None:
        if not names:
            return [REASON_AFFINITY_CONFLICT]
        if name not in names:
            return [REASON_AFFINITY_PREFILTER]
    tolerations = spec.get("tolerations") or ()
    if nspec.get("unschedulable") and not _tolerated(
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}, tolerations):
        return [REASON_UNSCHEDULABLE]
    if spec.get("nodeName") and spec["nodeName"] != name:
        return [REASON_NODE_NAME]
    for t in nspec.get("taints") or ():
        if t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(t, tolerations):
            return [f"node(s) had untolerated taint {{{t.get('key')}: {t.get('value') or ''}}}"]
    if not _affinity_ok(pod, node):
        return [REASON_AFFINITY]
    live = pods_on_node if isinstance(pods_on_node, NodeLoad) else _live(pod, pods_on_node)
    mine = _host_ports(pod)
    if mine and _port_conflict(mine, list(live.ports) if isinstance(live, NodeLoad) else
                               [hp for p in live for hp in _host_ports(p)]):
        return [REASON_PORTS]
    return _resources(pod, node, live, set(ignored_resources))
