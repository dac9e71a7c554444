"""A container the daemon refuses through its local API (the Python runtime's path) is logged with the reason."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_daemon import start, stop  # noqa: E402

from hamid.localapi.client import Conflict, LocalClient  # noqa: E402


def test_refusals_through_the_local_api_are_logged(tmp_path, free_port):
    state = tmp_path / "state"
    p = start(state, free_port, "--simulate", "T4")
    try:
        with LocalClient(state) as c:
            with pytest.raises(Conflict):
                c.call("POST", "/v1/containers", {"id": "ab" * 32, "env": ["HAMI_VGPU_SPEC=mem=100g"]})
            with pytest.raises(Exception, match="mem=4x"):
                c.call("POST", "/v1/containers", {"id": "cd" * 32, "env": ["HAMI_VGPU_SPEC=mem=4x"]})
    finally:
        err = stop(p)
    reasons = [json.loads(line).get("reason", "") for line in err.splitlines()
               if line.startswith("{") and json.loads(line).get("event") == "container refused"]
    assert any("no room for this container" in r and "102400 requested" in r for r in reasons), reasons
    assert any("'mem=4x'" in r for r in reasons), reasons
