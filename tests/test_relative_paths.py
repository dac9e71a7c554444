"""A relative ``--state-dir`` (issue 40 item 1): resolved to an absolute path at start.

runc resolves a container's mount sources against its bundle, so the container
edits must carry absolute host paths whatever directory the daemon was started
in; ``hamid inspect`` prints the same absolute paths.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from hamid.cli.main import main
from hamid.config import load_config
from hamid.docker.liveness import docker_alive
from hamid.ledger import Details
from hamid.request.model import Defaults
from nodeharness import make_node


def _paths(edits: dict) -> list[str]:
    out = []
    for e in edits.values():
        out += [m["hostPath"] for m in e.get("mounts", [])]
    return out


def test_a_relative_state_dir_is_made_absolute_when_the_config_is_loaded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config(None, {"stateDir": "st"}).stateDir == str(tmp_path / "st")
    assert load_config(None, {"kubeletDir": "kl"}).kubeletDir == str(tmp_path / "kl")


def test_containers_admitted_on_a_relative_state_dir_get_absolute_mounts_and_inspect_shows_them(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    d = make_node(Path("st"), simulate="T4", regionTmpfs=False)
    try:
        got = d.core.admit_container("c" * 64, ["HAMI_VGPU_SPEC=mem=2g,cores=30"], user=(0, 0),
                                     details=Details(container_id="c" * 64, display_name="web"),
                                     defaults=Defaults())
        paths = _paths(got.to_dict()["edits"])
        assert paths and all(os.path.isabs(p) for p in paths), paths
        assert any(p.startswith(str(tmp_path / "st")) for p in paths), paths
    finally:
        d.close()
    capsys.readouterr()
    assert main(["inspect", "web", "--state-dir", "st", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (c,) = doc["containers"]
    assert c["limits_file"]["path"].startswith(str(tmp_path / "st") + "/"), c["limits_file"]
    assert c["region"]["path"].startswith(str(tmp_path / "st") + "/"), c["region"]


def test_a_create_whose_bundle_is_gone_holds_no_room_for_the_start_grace(tmp_path):
    """containerd deletes the bundle when runc's create fails and on ``docker rm``:
    the reservation is released at the next reconcile, not 120 s later."""
    from hamid.ledger import Reservation

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text("{}")
    runc = tmp_path / "runc"
    runc.mkdir()
    r = Reservation.from_dict({"owner": "docker:" + "a" * 64, "kind": "docker", "state": "allocated",
                               "created": time.time(), "decision": {"node": "n", "containers": []},
                               "details": {"container_id": "a" * 64, "runc_root": str(runc),
                                           "bundle": str(bundle)}})
    alive = docker_alive(120.0)
    assert alive(r)  # within the grace, runc not there yet: still starting
    (bundle / "config.json").unlink()
    bundle.rmdir()
    assert not alive(r)
