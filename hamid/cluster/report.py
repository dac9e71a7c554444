"""The cluster view for people and for ``hamid plan --live``.

Turns the daemon's ``/v1/cluster`` document into the ``status --cluster``
JSON (members with per-node totals and per-GPU rows), its table, and the
placement engine's node views. Pure functions; no I/O.
"""

from __future__ import annotations

from typing import Any

from ..placement.view import NodeView
from .capacity import gpu_rows, summary, view_from_doc


def cluster_status(doc: dict) -> dict[str, Any]:
    members = []
    for m in doc["members"]:
        cap = m.get("capacity")
        members.append({"name": m["name"], "addr": m["addr"], "state": m["state"],
                        "incarnation": m["incarnation"], "self": m.get("self", False),
                        "since_s": m.get("since_s"),
                        "capacity_version": cap["version"] if cap else None,
                        "summary": summary(cap) if cap else None,
                        "gpus": gpu_rows(cap) if cap else []})
    counts: dict[str, int] = {}
    for m in members:
        counts[m["state"]] = counts.get(m["state"], 0) + 1
    return {"node": doc["node"], "addr": doc["addr"], "incarnation": doc["incarnation"],
            "health": doc["health"], "encrypted": doc["encrypted"], "members_by_state": counts,
            "members": members}


def live_views(doc: dict) -> list[NodeView]:
    """Node views of every alive or suspect member that has a capacity document."""
    return [view_from_doc(m["capacity"]) for m in doc["members"]
            if m["state"] in ("alive", "suspect") and m.get("capacity")]


class LiveNode:
    """A member's live view for ``hamid plan``: what the plan places goes on
    top of what the member's ledger has already booked."""

    def __init__(self, view: NodeView, settings) -> None:
        self.name = view.name
        self.settings = settings
        self.base = view
        self.decisions: list = []

    def view(self) -> NodeView:
        from ..placement.usage import with_usage

        if not self.decisions:
            return self.base
        fresh = [g.with_use(0, 0, 0, False, ()) for g in self.base.gpus]
        added = {g.uuid: g for g in with_usage(self.name, fresh, self.decisions).gpus}
        gpus = tuple(g.with_use(g.mem_used + a.mem_used, g.cores_used + a.cores_used, g.shares_used + a.shares_used,
                                g.exclusive or a.exclusive, g.mig_used + a.mig_used,
                            g.mps_used + a.mps_used)
                     for g in self.base.gpus for a in (added[g.uuid],))
        return NodeView(self.name, gpus, self.base.gpu_policy)
