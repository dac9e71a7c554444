"""A refusal's headline says what kind it is (issue 40 item 6): "no room" only
when room is what is missing; "not possible on this node" for what its GPUs
cannot do; "not configured" for what a setting of the node leaves out. The
MPS programs' help is said once, not once per GPU."""

from __future__ import annotations

import pytest

from hamid.errors import HamidError
from hamid.node.identity import Owner
from hamid.placement.reasons import NO_ROOM, NOT_CONFIGURED, NOT_POSSIBLE
from hamid.request import parse_docker_env
from hamid.runtime.access import NodeAccess
from nodeharness import make_node


def _refused(tmp_path, name: str, spec: str, **node) -> str:
    d = make_node(tmp_path / name, regionTmpfs=False, **node)
    d.close()
    with pytest.raises(HamidError) as e:
        NodeAccess(tmp_path / name, timeout_s=1.0).admit_container("c" * 64, [f"HAMI_VGPU_SPEC={spec}"], (0, 0), {})
    return str(e.value)


@pytest.mark.parametrize("name, spec, node, headline", [
    ("full", "mem=100g", {"simulate": "T4"}, NO_ROOM),
    ("t4mig", "1g.10gb", {"simulate": "T4"}, NOT_POSSIBLE),  # a T4 has no MIG at all
    ("migoff", "1g.10gb", {"simulate": "H100:1"}, NOT_CONFIGURED),  # MIG mode off: operatingMode
    ("nomps", "mode=mps,mem=2g", {"simulate": "H100:1"}, NOT_CONFIGURED),  # the node serves hami-core only
])
def test_a_refusal_is_headed_by_its_kind(tmp_path, name, spec, node, headline):
    msg = _refused(tmp_path, name, spec, **node)
    assert msg.startswith(headline + ":"), msg
    others = {NO_ROOM, NOT_CONFIGURED, NOT_POSSIBLE} - {headline}
    assert not any(msg.startswith(o) for o in others)


def test_the_mps_programs_help_is_said_once_for_many_gpus(tmp_path):
    d = make_node(tmp_path / "s", "H100:4", mode="mps", mpsControl="/nonexistent/nvidia-cuda-mps-control",
                  regionTmpfs=False)
    try:
        with pytest.raises(HamidError) as e:
            d.core.admit(Owner("docker", "a"), parse_docker_env(["HAMI_VGPU_SPEC=mode=mps,mem=4g"], "a"))
        msg = str(e.value)
        for i in range(4):
            assert f"GPU {i} is set to serve mps but its node cannot run MPS" in msg
        assert msg.count("nvidia.driverCapabilities") == 1, msg
        doc = d.core.status("test")
        assert "PATH (" not in doc.get("mps_missing", "") and ":/" not in doc.get("mps_missing", "")
    finally:
        d.close()


def test_status_does_not_print_the_daemons_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/very/long/path/a:/very/long/path/b")
    d = make_node(tmp_path / "s", "H100:1", mode="mps", regionTmpfs=False)
    try:
        missing = d.core.status("test")["mps_missing"]
        assert "nvidia-cuda-mps-control" in missing and "/very/long/path" not in missing, missing
    finally:
        d.close()


def test_the_headline_comes_through_the_daemons_local_api(tmp_path, free_port):
    """With the daemon up, the runtime's refusal comes from the 409's body: its
    ``headline`` says the kind (the reasons' kinds do not survive JSON), and
    the daemon's log line says the same."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_daemon import start, stop

    from hamid.localapi.client import Conflict, LocalClient

    state = tmp_path / "state"
    p = start(state, free_port, "--simulate", "T4")
    try:
        with LocalClient(state) as c:
            with pytest.raises(Conflict) as e:
                c.call("POST", "/v1/containers", {"id": "ab" * 32, "env": ["HAMI_VGPU_SPEC=1g.10gb"]})
        assert e.value.headline == NOT_POSSIBLE
        with pytest.raises(HamidError) as e2:
            NodeAccess(state, timeout_s=10.0).admit_container("cd" * 32, ["HAMI_VGPU_SPEC=mem=100g"], (0, 0), {})
        assert str(e2.value).startswith(NO_ROOM + ":"), str(e2.value)
    finally:
        err = stop(p)
    reasons = [json.loads(line).get("reason", "") for line in err.splitlines()
               if line.startswith("{") and json.loads(line).get("event") == "container refused"]
    assert any(r.startswith(NOT_POSSIBLE + ":") for r in reasons), reasons
    assert any(r.startswith(NO_ROOM + ":") for r in reasons), reasons
