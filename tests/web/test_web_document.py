"""The page's document (hamid/web): other nodes' tenants as their status documents
give them, and a node that does not answer named as not listed."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nodeharness import make_node  # noqa: E402
from simnodes import node_view  # noqa: E402

from hamid.cluster.capacity import doc_from_view  # noqa: E402
from hamid.web.face import WebFace  # noqa: E402


def _cluster(d) -> dict:
    members = [{"name": "w", "addr": "127.0.0.1:1", "state": "alive", "incarnation": 1, "self": True,
                "since_s": 1.0, "capacity": dict(doc_from_view(d.ledger.view(), 1))}]
    for name in ("far", "mute"):
        cap = dict(doc_from_view(node_view(name, "T4"), 5), peer=f"{name}.example:7948")
        members.append({"name": name, "addr": "127.0.0.1:2", "state": "alive", "incarnation": 1, "self": False,
                        "since_s": 1.0, "capacity": cap})
    return {"node": "w", "addr": "127.0.0.1:1", "incarnation": 1, "health": 0, "encrypted": True,
            "members": members, "stats": {}}


async def test_other_nodes_tenants_and_the_ones_that_cannot_be_asked(tmp_path):
    d = make_node(tmp_path / "state", simulate="T4", node="w")
    far_row = {"owner": "pod:uid-1", "kind": "pod", "name": "ml/trainer", "state": "running", "created": 1.0,
               "request": {"owner": "pod:ml/trainer", "containers": [
                   {"name": "main", "init": False, "gpu": {"count": 1, "mem_mib": 4096, "cores": 30}}]},
               "decision": {"node": "far", "containers": [{"name": "main", "init": False, "devices": [
                   {"uuid": "GPU-x", "index": 0, "mem_mib": 4096, "cores": 30}]}]}}
    asked = []

    async def remote_status(node: str, address: str) -> dict:
        asked.append((node, address))
        if node == "mute":
            raise OSError("connection refused")
        return {"node": node, "reservations": [far_row, {"owner": "broken"}]}  # a malformed row is left out

    doc = _cluster(d)
    face = WebFace(d.service, "127.0.0.1:0", settings=d.settings, cluster=lambda: doc,
                   remote_status=remote_status)
    try:
        async with trio.open_nursery() as n:
            url = (await n.start(face.run))[0]
            async with httpx.AsyncClient(base_url=url) as c:
                state = {}
                with trio.fail_after(5):
                    while not state.get("tenants") or "mute" not in state.get("tenants_unknown", []):
                        state = (await c.get("/api/state")).json()
                        await trio.sleep(0.05)
            (t,) = state["tenants"]
            assert (t["node"], t["namespace"], t["name"], t["kind"]) == ("far", "ml", "trainer", "pod")
            c0 = t["containers"][0]
            assert c0["asked"]["mem_mib"] == 4096 and c0["given"][0]["cores"] == 30 and c0["live"] == {}
            assert state["tenants_unknown"] == ["mute"]
            # each asked once: again only when its capacity document moves
            assert sorted(asked) == [("far", "far.example:7948"), ("mute", "mute.example:7948")]
            n.cancel_scope.cancel()
    finally:
        d.close()
