"""The document the page draws: nodes, GPUs, tenants, gossip and leader health.

Pure functions over what the face gathered: the gossiped cluster document
(``/v1/cluster``'s, the same one ``hamid status --cluster`` prints, each
member's rows made by the same functions, :func:`hamid.cluster.capacity.summary`
and :func:`~hamid.cluster.capacity.gpu_rows`, so the page lists exactly what
the CLI lists), or, without gossip, this node's status document; plus this node's
tenants (:mod:`.tenants`). Per GPU it adds what the CLI table leaves out and
the page draws: cordon, MIG slices and the profiles' placements.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..cluster.capacity import gpu_rows, summary, view_from_doc
from ..placement.view import MODE_MIG, GpuView


def _gpu_extra(g: GpuView) -> dict[str, Any]:
    out: dict[str, Any] = {"cordoned": g.cordoned, "type": g.hami_type}
    if g.mode == MODE_MIG or g.mig_used:
        out["mig_slices"] = g.memory_slices
        out["mig_compute_slices"] = g.compute_slices
        # the compute slices its instances hold (a profile's Ng), which the card shows instead of cores
        out["mig_compute_used"] = sum(p.slices for p in (g.profile(m.profile) for m in g.mig_used) if p)
    return out


def _members_from_cluster(doc: dict, cache: dict) -> tuple[dict, list[dict]]:
    """``status --cluster``'s members (its own ``summary`` and ``gpu_rows`` per
    member) plus the page's extras. ``cache`` keeps each member's rows per
    capacity version between calls (a document changes one member at a time)."""
    members = []
    counts: dict[str, int] = {}
    fresh: dict = {}
    for m in doc["members"]:
        cap = m.get("capacity")
        rows: tuple[dict | None, list[dict]] = (None, [])
        if cap:
            key = (m["name"], cap["version"])
            rows = cache.get(key) or _rows(cap)
            fresh[key] = rows
        counts[m["state"]] = counts.get(m["state"], 0) + 1
        members.append({"name": m["name"], "addr": m["addr"], "state": m["state"],
                        "incarnation": m["incarnation"], "self": m.get("self", False), "since_s": m.get("since_s"),
                        "capacity_version": cap["version"] if cap else None, "summary": rows[0], "gpus": rows[1]})
    cache.clear()
    cache.update(fresh)
    gossip = {"enabled": True, "node": doc["node"], "addr": doc["addr"], "incarnation": doc["incarnation"],
              "health": doc["health"], "encrypted": doc["encrypted"], "members_by_state": counts,
              "stats": doc.get("stats", {})}
    return gossip, members


def _rows(cap: dict) -> tuple[dict, list[dict]]:
    extra = {g.uuid: _gpu_extra(g) for g in view_from_doc(cap).gpus}
    return summary(cap), [dict(r, **extra.get(r["uuid"], {})) for r in gpu_rows(cap)]


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
          tenants: list[dict], leader: dict | None, backend: str, cache: dict | None = None,
          tenants_unknown: Sequence[str] = ()) -> dict[str, Any]:
    """The page's document. ``cluster``: the gossiped view (None without gossip);
    ``status``: this node's status document (used when there is no gossip);
    ``view_gpus``: this node's GPU views by UUID (for cordon and MIG slices);
    ``leader``: ``{"mode", "holder"}`` (None outside Kubernetes); ``cache``:
    kept by the caller between calls (see :func:`_members_from_cluster`);
    ``tenants_unknown``: nodes whose tenants cannot be had (no peer API, no answer)."""
    if cluster is not None:
        gossip, members = _members_from_cluster(cluster, {} if cache is None else cache)
    else:
        gossip = {"enabled": False}
        members = [_member_from_status(status, view_gpus)] if status is not None else []
    return {"node": node, "backend": backend, "gossip": gossip, "leader": leader, "members": members,
            "tenants": tenants, "tenants_unknown": sorted(tenants_unknown)}
