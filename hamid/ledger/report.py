"""The node's status as a plain document (for the local API and the CLI)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from ..placement.usage import with_usage
from ..placement.view import MODE_MIG, NodeView
from .store import Reservation


def missing_gpus(r: Reservation, uuids: Collection[str]) -> list[str]:
    """The GPUs ``r`` holds a share of that are not among the node's ``uuids``
    (the node was restarted under another name, from which simulated UUIDs
    derive, or a GPU was taken out): its share counts on none of the node's
    GPUs, so status, inspect and the web view say so beside its state."""
    out: list[str] = []
    for c in r.decision.containers:
        for d in c.devices:
            if d.uuid not in uuids and d.uuid not in out:
                out.append(d.uuid)
    return out


def status_document(view: NodeView, reservations: list[Reservation], backend: str,
                    releasing: Collection[str] = ()) -> dict[str, Any]:
    """`releasing`: owners whose release is pending (a poststop marker not yet
    drained): left out of the reservations and of the GPUs' use, and listed
    under ``releasing``, since the next drain frees them."""
    gone = sorted(r.owner for r in reservations if r.owner in releasing)
    if gone:
        reservations = [r for r in reservations if r.owner not in releasing]
        view = with_usage(view.name, view.gpus, [r.decision for r in reservations], view.gpu_policy)
    gpus = []
    for g in view.gpus:
        gpus.append({
            "index": g.index, "uuid": g.uuid, "name": g.name, "mode": g.mode, "healthy": g.healthy,
            "filtered": g.filtered, "numa": g.numa,
            "memory_total_mib": g.mem_total, "memory_used_mib": g.mem_used,
            "memory_free_mib": g.mem_total - g.mem_used,
            "cores_total": g.cores_total, "cores_used": g.cores_used,
            "shares_total": g.shares_total, "shares_used": g.shares_used, "exclusive": g.exclusive,
            "serves": list(g.serves) if g.mode != MODE_MIG else [], "share_mode": g.share_mode,
            "mps_shares": g.mps_used,
            "mps_missing": g.mps_missing,
            "dra": g.dra,
            "mig_slices_total": g.memory_slices if g.mode == MODE_MIG else 0,
            "mig_slices_used": sum(s.placement.size for s in g.mig_used),
            "mig_instances": [{"profile": s.profile, "start": s.placement.start, "size": s.placement.size}
                              for s in g.mig_used],
        })
    uuids = {g.uuid for g in view.gpus}
    return {"node": view.name, "backend": backend, "gpus": gpus,
            "reservations": [{**r.to_dict(), "missing_gpus": missing_gpus(r, uuids)} for r in reservations],
            "releasing": gone}
