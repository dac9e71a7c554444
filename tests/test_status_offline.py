"""``hamid status`` with no daemon answering: the devices come from node.json
and reservations whose release marker is pending are not counted."""

from __future__ import annotations

import json

from hamid.cli.main import main
from hamid.localapi.client import LocalClient
from hamid.node import released
from hamid.request import parse_docker_env
from test_daemon import start, stop


def test_status_without_a_daemon_shows_node_json_devices_and_leaves_out_pending_releases(
        tmp_path, free_port, capsys):
    state = tmp_path / "state"
    d = start(state, free_port, "--simulate", "T4")
    try:
        with LocalClient(state) as c:
            keep = c.reserve(parse_docker_env({"HAMI_VGPU_SPEC": "mem=2g,cores=20"}, "keep").to_dict(), "docker")
            gone = c.reserve(parse_docker_env({"HAMI_VGPU_SPEC": "mem=4g,cores=30"}, "gone").to_dict(), "docker")
    finally:
        stop(d)
    # the container exited while no daemon ran: only its poststop marker is there
    released.mark(str(state), gone["owner"].split(":", 1)[1])

    assert main(["status", "--state-dir", str(state), "-o", "json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert "daemon not running" in doc["backend"]
    assert doc["backend"].startswith("simulated") and "T4" in doc["backend"], doc["backend"]
    assert [r["owner"] for r in doc["reservations"]] == [keep["owner"]]
    assert doc["releasing"] == [gone["owner"]]
    (gpu,) = doc["gpus"]
    assert (gpu["memory_used_mib"], gpu["cores_used"], gpu["shares_used"]) == (2048, 20, 1)
    assert gone["owner"] in err and "release pending" in err

    assert main(["status", "--state-dir", str(state)]) == 0
    table = capsys.readouterr().out
    assert "devices: simulated" in table and "reservations: 1" in table
    assert "2048/" in table and gone["owner"] not in table
