"""This node's tenants as the page shows them: asked, given, live use, throttling.

Blocking (SQLite rows in, region files read): the face runs it in the node
service's threads. Live use comes from each container's shim regions, read
by :class:`hamid.shimregion.collector.ShimRegionCollector` under the same
rules as a metrics scrape (no links followed, owner and size checked, a time
budget), matched to reservations by their slot directory
(:func:`hamid.node.realize.slot_name`). Counters (GPU time, throttled time)
are totals since the region was made; the page turns two readings into rates.
Other nodes' tenants come from their status documents (the peer API's
``status``, which the daemon fetches for the face): asked and given, without
live use, which only the node that runs them reads.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from ..node.service import Reservation, missing_gpus
from ..node.realize import slot_name
from ..request.model import Request
from ..shimregion.collector import ShimRegionCollector

MIB = 1024 * 1024


def _names(r: Reservation) -> tuple[str, str]:
    """(namespace, name): a pod's (or DRA claim's) ``namespace/name``; a Docker container under ``docker``."""
    if r.kind in ("pod", "claim"):
        ns, sep, name = r.name.partition("/")
        return (ns, name) if sep else ("", r.name or r.owner.partition(":")[2])
    return "docker", r.name or r.owner.partition(":")[2][:12]


def _asked(request: Request | None, container: str) -> dict[str, Any] | None:
    g = request.gpu_of(container) if request is not None else None
    if g is None:
        return None
    return {"count": g.count, "mem_mib": g.mem_mib, "mem_percent": g.mem_percent, "cores": g.cores,
            "mig_profile": g.mig_profile, "mode": g.mode, "types": list(g.use_types), "devices": list(g.devices)}


def _usage(snap) -> dict[str, dict[str, Any]]:
    """Per GPU UUID: use, limit and counters from one region."""
    out = {}
    for d in snap.devices:
        out[d.uuid] = {"used_mib": d.used_bytes // MIB, "limit_mib": d.limit_bytes // MIB,
                       "peak_mib": d.peak_used_bytes // MIB, "sm_limit": d.sm_limit_percent,
                       "gpu_time_s": round(d.gpu_time_ns / 1e9, 3), "throttle_s": round(d.throttle_ns / 1e9, 3),
                       "oom_refusals": d.oom_count, "launches": d.launches}
    return out


def local_tenants(node: str, reservations: list[Reservation], regions: ShimRegionCollector | None,
                  gpus: Collection[str] | None = None) -> list[dict]:
    """Each reservation of this node with its containers: asked, given, and
    (where the shim left a region) live use per GPU. ``gpus``: the node's GPU
    UUIDs; a reservation holding one it does not have says so in its state."""
    usage: dict[str, dict[str, dict]] = {}
    if regions is not None:
        wanted = {slot_name(r, c.name) for r in reservations for c in r.decision.containers}
        if wanted:
            for slot, snap in regions.snapshots():
                if slot in wanted:
                    usage.setdefault(slot, {}).update(_usage(snap))
    out = []
    for r in reservations:
        ns, name = _names(r)
        conts = []
        for c in r.decision.containers:
            live = usage.get(slot_name(r, c.name), {})
            conts.append({"name": c.name, "init": c.init, "asked": _asked(r.request, c.name),
                          "given": [d.to_dict() for d in c.devices],
                          "live": {d.uuid: live[d.uuid] for d in c.devices if d.uuid in live}})
        gone = missing_gpus(r, gpus) if gpus is not None else []
        state = f"{r.state}, GPU not on this node: {', '.join(gone)}" if gone else r.state
        out.append({"node": node, "owner": r.owner, "kind": r.kind, "namespace": ns, "name": name,
                    "state": state, "created": r.created, "containers": conts, "missing_gpus": gone})
    out.sort(key=lambda t: (t["namespace"], t["name"], t["owner"]))
    return out


def tenants_from_status(node: str, status: dict) -> list[dict]:
    """Another node's tenants from its status document (``reservations``); a
    malformed row is left out rather than trusted."""
    rows = []
    for d in status.get("reservations") or ():
        try:
            rows.append(Reservation.from_dict(d))
        except (KeyError, TypeError, ValueError):
            continue
    return local_tenants(node, rows, None)
