"""Reservations checked against the node's GPUs at start (issue 40 item 4).

Restarted under another ``--node-name`` (simulated UUIDs derive from it), a
running container's reservation names a GPU the node no longer has: start-up
logs it, and status, inspect and the web view's tenants say so beside its
state instead of showing its memory as simply free.
"""

from __future__ import annotations

import json

from structlog.testing import capture_logs

from hamid.cli.main import main
from hamid.ledger import Details
from hamid.request.model import Defaults
from hamid.web.tenants import local_tenants
from nodeharness import make_node


def test_a_reservation_on_a_gpu_the_node_no_longer_has_is_logged_and_shown(tmp_path, capsys):
    state = tmp_path / "st"
    d = make_node(state, simulate="T4", node="node-a", regionTmpfs=False)
    try:
        got = d.core.admit_container("c" * 64, ["HAMI_VGPU_SPEC=mem=2g,cores=30"], user=(0, 0),
                                     details=Details(container_id="c" * 64, display_name="web"), defaults=Defaults())
        old_uuid = got.reservation.decision.containers[0].devices[0].uuid
    finally:
        d.close()

    with capture_logs() as logs:
        d = make_node(state, simulate="T4", node="node-b", regionTmpfs=False)
    try:
        new_uuids = {g.uuid for g in d.core.ledger.view().gpus}
        assert old_uuid not in new_uuids  # simulated UUIDs derive from the node name
        warned = [e for e in logs if "does not have" in e["event"]]
        assert warned and warned[0]["owner"] == "docker:" + "c" * 64 and warned[0]["missing_gpus"] == [old_uuid]
        assert "--node-name" in warned[0]["fix"]

        doc = d.core.status("test")
        (r,) = doc["reservations"]
        assert r["missing_gpus"] == [old_uuid]
        (t,) = local_tenants("node-b", d.core.ledger.list(), None, new_uuids)
        assert t["missing_gpus"] == [old_uuid] and "not on this node" in t["state"]
    finally:
        d.close()

    capsys.readouterr()
    assert main(["inspect", "web", "--state-dir", str(state), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["missing_gpus"] == [old_uuid]
    assert main(["inspect", "web", "--state-dir", str(state)]) == 0
    assert "not on this node" in capsys.readouterr().out
    assert main(["status", "--state-dir", str(state)]) == 0
    assert f"GPU {old_uuid} not on this node" in capsys.readouterr().out
