"""The document the page draws: nodes, GPUs, tenants, gossip and leader health.

Pure functions over what the face gathered: the gossiped cluster document
(``/v1/cluster``'s, the same one ``hamid status --cluster`` prints, through
:func:`hamid.gossip.report.cluster_status`, so the page lists exactly what the
CLI lists), or, without gossip, this node's status document; plus this node's
tenants (:mod:`.tenants`). Per GPU it adds what the CLI table leaves out and
the page draws: cordon, MIG slices and the profiles' placements.
"""

from __future__ import annotations

from typing import Any

from ..gossip.capacity import view_from_doc
from ..gossip.report import cluster_status
from ..placement.view import MODE_MIG, GpuView


def _gpu_extra(g: GpuView) -> dict[str, Any]:
    out: dict[str, Any] = {"cordoned": g.cordoned, "type": g.hami_type}
    if g.mode == MODE_MIG or g.mig_used:
        out["mig_slices"] = g.memory_slices
        out["mig_compute_slices"] = g.compute_slices
    return out


def _members_from_cluster(doc: dict) -> tuple[dict, list[dict]]:
    st = cluster_status(doc)
    by_name = {m["name"]: m for m in doc["members"]}
    for m in st["members"]:
        cap = by_name[m["name"]].get("capacity")
        if not cap:
            continue
        extra = {g.uuid: _gpu_extra(g) for g in view_from_doc(cap).gpus}
        for row in m["gpus"]:
            row.update(extra.get(row["uuid"], {}))
    gossip = {"enabled": True, "node": st["node"], "addr": st["addr"], "incarnation": st["incarnation"],
              "health": st["health"], "encrypted": st["encrypted"], "members_by_state": st["members_by_state"],
              "stats": doc.get("stats", {})}
    return gossip, st["members"]


def _member_from_status(status: dict, view_gpus: dict[str, GpuView]) -> dict:
    gpus = []
    for g in status["gpus"]:
        row = {k: g[k] for k in ("index", "uuid", "name", "mode", "healthy", "filtered", "memory_total_mib",
                                 "memory_used_mib", "memory_free_mib", "cores_total", "cores_used",
                                 "shares_total", "shares_used", "exclusive", "mig_instances")}
        if g["uuid"] in view_gpus:
            row.update(_gpu_extra(view_gpus[g["uuid"]]))
        gpus.append(row)
    usable = [g for g in gpus if not g["filtered"]]
    summary = {"gpus": len(usable), "memory_total_mib": sum(g["memory_total_mib"] for g in usable),
               "memory_used_mib": sum(g["memory_used_mib"] for g in usable),
               "cores_total": sum(g["cores_total"] for g in usable),
               "cores_used": sum(g["cores_used"] for g in usable)}
    summary["memory_free_mib"] = summary["memory_total_mib"] - summary["memory_used_mib"]
    return {"name": status["node"], "addr": None, "state": "alive", "incarnation": None, "self": True,
            "since_s": None, "capacity_version": None, "summary": summary, "gpus": gpus}


def build(*, node: str, cluster: dict | None, status: dict | None, view_gpus: dict[str, GpuView],
          tenants: list[dict], leader: dict | None, backend: str) -> dict[str, Any]:
    """The page's document. ``cluster``: the gossiped view (None without gossip);
    ``status``: this node's status document (used when there is no gossip);
    ``view_gpus``: this node's GPU views by UUID (for cordon and MIG slices);
    ``leader``: ``{"mode", "holder"}`` (None outside Kubernetes)."""
    if cluster is not None:
        gossip, members = _members_from_cluster(cluster)
    else:
        gossip = {"enabled": False}
        members = [_member_from_status(status, view_gpus)] if status is not None else []
    return {"node": node, "backend": backend, "gossip": gossip, "leader": leader, "members": members,
            "tenants": tenants}
