"""The RFC 6902 JSON Patch that narrows a gated pod's required node affinity to one node,
which is all KEP-3838 lets an update of a gated pod do."""

from __future__ import annotations

_REQUIRED = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"


def narrow_to_node(pod: dict, node_name: str) -> list[dict]:
    """The RFC 6902 JSON Patch operations that narrow ``pod``'s required node affinity to ``node_name``.

    ``metadata.name In [node_name]`` is appended to the ``matchFields`` of
    every existing required term (terms are ORed, a term's requirements
    ANDed: each term keeps all it required, and now also names the node);
    where the pod has no required terms, one term holding only that field is
    set. That is exactly what KEP-3838 lets an update do while the pod is
    gated (the number of terms kept, existing requirements kept as a prefix,
    new ones appended; a nil affinity or one with no terms may be set), and
    after the update kube-scheduler's NodeAffinity PreFilter considers that
    node alone. The operations address the pod as it is now: send them with
    a ``test`` of ``/metadata/resourceVersion`` (or apply them locally and
    update with the resourceVersion) so a pod changed meanwhile is not
    patched blindly. ``nodeSelector`` is left as it is.
    """
    if not isinstance(node_name, str) or not node_name:
        raise ValueError(f"node name {node_name!r}: a non-empty string is accepted")
    pin = {"key": "metadata.name", "operator": "In", "values": [node_name]}
    fresh = {"nodeSelectorTerms": [{"matchFields": [pin]}]}
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise ValueError("pod has no spec: a Pod object with spec is accepted")
    aff = spec.get("affinity")
    if not aff:
        return [{"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": fresh}}}]
    na = aff.get("nodeAffinity")
    if not na:
        return [{"op": "add", "path": "/spec/affinity/nodeAffinity",
                 "value": {"requiredDuringSchedulingIgnoredDuringExecution": fresh}}]
    req = na.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not req:
        return [{"op": "add", "path": _REQUIRED, "value": fresh}]
    terms = req.get("nodeSelectorTerms") or []
    if not terms:
        return [{"op": "add", "path": f"{_REQUIRED}/nodeSelectorTerms", "value": fresh["nodeSelectorTerms"]}]
    ops: list[dict] = []
    for i, t in enumerate(terms):
        if t.get("matchFields"):
            ops.append({"op": "add", "path": f"{_REQUIRED}/nodeSelectorTerms/{i}/matchFields/-", "value": pin})
        else:
            ops.append({"op": "add", "path": f"{_REQUIRED}/nodeSelectorTerms/{i}/matchFields", "value": [pin]})
    return ops
