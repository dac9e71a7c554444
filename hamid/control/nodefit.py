"""Would kube-scheduler take this pod to this node? Its default filters, as pure functions.

The leader places a gated pod on a node only if kube-scheduler, which binds
it afterwards, would also accept that node: otherwise the pod would be
committed on one node's ledger and stay pending. The checks follow
kube-scheduler's default filter plugins and their messages:
NodeUnschedulable, NodeName, TaintToleration, NodeAffinity (nodeSelector
and required node affinity), NodeResourcesFit (requests against
``status.allocatable`` minus the requests of the pods already there, the
larger of init containers and the sum of app containers, pod overhead) and
NodePorts. The GPU resources hamid accounts itself are skipped. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def quantity(text: Any) -> Decimal:
    """A Kubernetes quantity (``100m``, ``4Gi``, ``1e3``, ``2``) as an exact number."""
    s = str(text).strip()
    for suf in sorted(_SUFFIX, key=len, reverse=True):
        if suf and s.endswith(suf) and not (suf == "E" and _is_exponent(s)):
            try:
                return Decimal(s[: -len(suf)]) * Decimal(_SUFFIX[suf])
            except InvalidOperation:
                break
    try:
        return Decimal(s)
    except InvalidOperation:
        raise ValueError(f"bad quantity {text!r}") from None


def _is_exponent(s: str) -> bool:
    head = s[:-1]
    return any(c in head for c in "eE")


def _requests(c: dict) -> dict[str, Decimal]:
    res = c.get("resources") or {}
    out = {k: quantity(v) for k, v in (res.get("limits") or {}).items()}  # limits default the requests
    out.update({k: quantity(v) for k, v in (res.get("requests") or {}).items()})
    return out


def pod_requests(pod: dict) -> dict[str, Decimal]:
    """What a pod asks of a node: the larger of each init container and the sum of the others
    (sidecars, init containers that keep running, count with the app containers), plus overhead."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for c in spec.get("containers") or ():
        for k, v in _requests(c).items():
            total[k] = total.get(k, Decimal(0)) + v
    sidecars: dict[str, Decimal] = {}
    for c in spec.get("initContainers") or ():
        req = _requests(c)
        if c.get("restartPolicy") == "Always":
            for k, v in req.items():
                sidecars[k] = sidecars.get(k, Decimal(0)) + v
            continue
        for k, v in req.items():
            total[k] = max(total.get(k, Decimal(0)), v + sidecars.get(k, Decimal(0)))
    for k, v in sidecars.items():
        total[k] = total.get(k, Decimal(0)) + v
    for k, v in (spec.get("overhead") or {}).items():
        total[k] = total.get(k, Decimal(0)) + quantity(v)
    return total


def _tolerated(taint: dict, tolerations: Iterable[dict]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if op == "Exists":
            if not t.get("key") or t["key"] == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _match_expression(e: dict, value: str | None) -> bool:
    op, values = e.get("operator"), e.get("values") or []
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        try:
            a, b = int(value), int(values[0])
        except (TypeError, ValueError, IndexError):
            return False
        return a > b if op == "Gt" else a < b
    return False


def _affinity_ok(pod: dict, node: dict) -> bool:
    spec = pod.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    req = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = req.get("nodeSelectorTerms")
    if not terms:
        return True
    fields = {"metadata.name": (node.get("metadata") or {}).get("name")}
    for t in terms:  # terms are ORed, the requirements of one term ANDed
        if not t.get("matchExpressions") and not t.get("matchFields"):
            continue  # an empty term matches nothing
        if all(_match_expression(e, labels.get(e.get("key"))) for e in t.get("matchExpressions") or ()) and \
                all(_match_expression(e, fields.get(e.get("key"))) for e in t.get("matchFields") or ()):
            return True
    return False


def _host_ports(pod: dict) -> set[tuple[str, str, int]]:
    out = set()
    for c in [*((pod.get("spec") or {}).get("containers") or ()), *((pod.get("spec") or {}).get("initContainers")
                                                                     or ())]:
        for p in c.get("ports") or ():
            if p.get("hostPort"):
                out.add((p.get("hostIP") or "0.0.0.0", p.get("protocol") or "TCP", int(p["hostPort"])))
    return out


def _ports_conflict(a: set, b: set) -> bool:
    for ip, proto, port in a:
        for ip2, proto2, port2 in b:
            if port == port2 and proto == proto2 and (ip == ip2 or "0.0.0.0" in (ip, ip2)):
                return True
    return False


def fit_node(pod: dict, node: dict, pods_on_node: list[dict], *, ignored_resources: set[str]) -> list[str]:
    """kube-scheduler's reasons for not taking ``pod`` to ``node`` ([] = it would)."""
    spec = pod.get("spec") or {}
    nspec = node.get("spec") or {}
    name = (node.get("metadata") or {}).get("name")
    reasons: list[str] = []
    if nspec.get("unschedulable") and not _tolerated(
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}, spec.get("tolerations") or ()):
        reasons.append("node(s) were unschedulable")
    if spec.get("nodeName") and spec["nodeName"] != name:
        reasons.append("node(s) didn't match the requested node name")
    for t in nspec.get("taints") or ():
        if t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(t, spec.get("tolerations") or ()):
            shown = f"{{{t.get('key')}: {t.get('value')}}}" if t.get("value") else f"{{{t.get('key')}}}"
            reasons.append(f"node(s) had untolerated taint {shown}")
            break
    if not _affinity_ok(pod, node):
        reasons.append("node(s) didn't match Pod's node affinity/selector")
    alloc = {k: quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
    live = [p for p in pods_on_node if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and (p.get("metadata") or {}).get("uid") != (pod.get("metadata") or {}).get("uid")]
    if "pods" in alloc and len(live) + 1 > alloc["pods"]:
        reasons.append("Too many pods")
    used: dict[str, Decimal] = {}
    for p in live:
        for k, v in pod_requests(p).items():
            used[k] = used.get(k, Decimal(0)) + v
    for k, v in sorted(pod_requests(pod).items()):
        if k in ignored_resources or v == 0:
            continue
        if v + used.get(k, Decimal(0)) > alloc.get(k, Decimal(0)):
            reasons.append(f"Insufficient {k}")
    mine = _host_ports(pod)
    if mine and any(_ports_conflict(mine, _host_ports(p)) for p in live):
        reasons.append("node(s) didn't have free ports for the requested pod ports")
    return reasons


def summarize(reasons_by_node: dict[str, list[str]], total: int) -> str:
    """kube-scheduler's message: "0/5 nodes are available: 3 Insufficient cpu, 2 node(s) had ..."
    (each distinct reason counted over the nodes, sorted by reason, as kube-scheduler sorts them)."""
    counts: dict[str, int] = {}
    for why in reasons_by_node.values():
        for r in dict.fromkeys(why):
            counts[r] = counts.get(r, 0) + 1
    parts = ", ".join(f"{n} {r}" for r, n in sorted(counts.items()))
    return f"0/{total} nodes are available: {parts}." if parts else f"0/{total} nodes are available."
