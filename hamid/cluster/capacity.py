"""Capacity documents: what one node has and has free, as gossiped.

A document is built from the node's ledger view (capacity after the node's
scaling and split settings, plus what is booked) and carries a version that
only grows, so a newer document replaces an older one everywhere. MIG profile
tables are stored once per GPU model (``profiles``), not once per GPU, to keep
documents small. ``view_from_doc`` turns a peer's document back into the
placement engine's :class:`NodeView`. No I/O here: the service reads the
ledger (in a worker thread) and hands the view in.
"""

from __future__ import annotations

import time
from typing import Any

from ..nodekey import valid_public_key
from ..placement.view import (MODE_MIG, MigSlot, NodeView, gpu_view_from_dict, gpu_view_to_dict,
                              mig_profiles_from_list)
from ..devices.types import MigPlacement


def new_version() -> int:
    """A starting version above any a previous life of this node used
    (milliseconds of wall clock), so a restarted node's document wins."""
    return time.time_ns() // 1_000_000


def doc_from_view(view: NodeView, version: int) -> dict[str, Any]:
    profiles: dict[str, list] = {}
    gpus = []
    for g in view.gpus:
        d = gpu_view_to_dict(g)
        profs = d.pop("mig_profiles")
        if profs:
            profiles.setdefault(g.name, profs)
        d["use"] = [g.mem_used, g.cores_used, g.shares_used, g.exclusive,
                    [[s.profile, s.placement.start, s.placement.size] for s in g.mig_used]]
        if g.mps_used:
            d["use"].append(g.mps_used)  # a sixth item only when some shares are MPS clients
        gpus.append(d)
    return {"node": view.name, "version": version, "policy": view.gpu_policy, "gpus": gpus,
            "profiles": profiles}


def same_content(a: dict | None, b: dict | None) -> bool:
    """Equal apart from the version."""
    if a is None or b is None:
        return a is b
    return {k: v for k, v in a.items() if k != "version"} == {k: v for k, v in b.items() if k != "version"}


# Parsed MIG profile tables, by their JSON text: a cluster has a few GPU models, and every document
# of every node repeats its models' tables; sharing one parsed table spares each view ~50 objects per
# GPU (memory, and garbage-collector work). Bounded: cleared when full (a table is cheap to parse again).
_TABLES: dict[str, tuple] = {}
TABLES_MAX = 256


def _table(items: list) -> tuple:
    if not items:
        return ()
    key = repr(items)
    got = _TABLES.get(key)
    if got is None:
        if len(_TABLES) >= TABLES_MAX:
            _TABLES.clear()
        got = _TABLES[key] = mig_profiles_from_list(items)
    return got


def view_from_doc(doc: dict) -> NodeView:
    gpus = []
    tables = {name: _table(items) for name, items in doc.get("profiles", {}).items()}
    for d in doc["gpus"]:
        mem, cores, shares, excl, mig, *rest = d["use"]
        gpus.append(gpu_view_from_dict(d, tables.get(d["name"], ()), (
            int(mem), int(cores), int(shares), bool(excl),
            tuple(MigSlot(p, MigPlacement(int(s), int(z))) for p, s, z in mig) if mig else (),
            int(rest[0]) if rest else 0)))
    return NodeView(doc["node"], tuple(gpus), doc.get("policy", "spread"))


def doc_problem(doc: Any) -> str | None:
    """Why ``doc`` is not a valid capacity document, or None."""
    if type(doc) is not dict:
        return "not a map"
    if type(doc.get("node")) is not str or not doc["node"]:
        return "node missing"
    v = doc.get("version")
    if type(v) is not int or not 0 <= v < 1 << 63:
        return "version missing"
    if type(doc.get("gpus")) is not list or type(doc.get("profiles", {})) is not dict:
        return "gpus or profiles malformed"
    if len(doc["gpus"]) > 256:
        return "too many GPUs"
    peer = doc.get("peer")  # the node's peer API address (hamid/peer), when it serves one
    if peer is not None and (type(peer) is not str or not 0 < len(peer) <= 256):
        return "peer address malformed"
    pk = doc.get("pk")  # the node's peer identity (hamid/nodekey.py), when it serves the peer API
    if pk is not None and not valid_public_key(pk):
        return "identity key malformed"
    ext = doc.get("extender")  # the node's extender URL (hamid/scheduling), when it serves one
    if ext is not None and (type(ext) is not str or not ext.startswith(("http://", "https://")) or len(ext) > 256):
        return "extender address malformed"
    try:
        view_from_doc(doc)
    except Exception as e:  # any shape error in a peer's document
        return f"malformed GPU entry ({type(e).__name__})"
    return None


def summary(doc: dict | None) -> dict[str, Any]:
    """Per-node totals for tables: GPUs, memory and cores total/used/free."""
    out = {"gpus": 0, "memory_total_mib": 0, "memory_used_mib": 0, "cores_total": 0, "cores_used": 0}
    if not doc:
        return out
    for g in view_from_doc(doc).gpus:
        if g.filtered:
            continue
        out["gpus"] += 1
        if g.mode == MODE_MIG and g.memory_slices:
            used = g.mem_total * sum(s.placement.size for s in g.mig_used) // g.memory_slices
        else:
            used = g.mem_used
        out["memory_total_mib"] += g.mem_total
        out["memory_used_mib"] += used
        out["cores_total"] += g.cores_total
        out["cores_used"] += g.cores_used
    out["memory_free_mib"] = out["memory_total_mib"] - out["memory_used_mib"]
    return out


def gpu_rows(doc: dict) -> list[dict[str, Any]]:
    """Each GPU of a document as a flat row (for ``status --cluster``)."""
    rows = []
    for g in view_from_doc(doc).gpus:
        rows.append({"index": g.index, "uuid": g.uuid, "name": g.name, "mode": g.mode, "healthy": g.healthy,
                     "filtered": g.filtered, "memory_total_mib": g.mem_total, "memory_used_mib": g.mem_used,
                     "memory_free_mib": g.mem_total - g.mem_used, "cores_total": g.cores_total,
                     "cores_used": g.cores_used, "shares_total": g.shares_total, "shares_used": g.shares_used,
                     "exclusive": g.exclusive, "dra": g.dra, "serves": list(g.serves), "share_mode": g.share_mode,
                     "mps_shares": g.mps_used,
                     "mig_instances": [{"profile": s.profile, "start": s.placement.start, "size": s.placement.size}
                                       for s in g.mig_used]})
    return rows
