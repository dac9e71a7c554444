"""Changing operatingMode while tenants hold a GPU: refused at start-up, naming them; allowed once they left."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_daemon import HAMID, start, stop  # noqa: E402

from hamid.localapi.client import LocalClient  # noqa: E402
from hamid.node.layout import RELEASED_DIR  # noqa: E402
from hamid.request import parse_docker_env  # noqa: E402


def test_mode_change_with_tenants_is_refused_until_they_leave(tmp_path, free_port):
    state = tmp_path / "state"
    mig = tmp_path / "mig.yaml"
    mig.write_text("operatingMode: mig\n")
    p = start(state, free_port, "--simulate", "H100-80GB-HBM3:1")
    try:
        with LocalClient(state) as c:
            c.reserve(parse_docker_env({"HAMI_VGPU_SPEC": "mem=4g"}, "abc").to_dict(), "docker")
    finally:
        stop(p)
    r = subprocess.run([*HAMID, "run", "--state-dir", str(state), "--metrics-port", "0", "--node-name", "node-a",
                        "--simulate", "H100-80GB-HBM3:1", "--config", str(mig)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "GPU 0 from hami-core to mig (held by docker:abc)" in last and "operatingMode as it was" in last, last
    # the container stopped (its poststop marker waits for the daemon): the change goes through
    (state / RELEASED_DIR / "abc").touch()
    p = start(state, free_port, "--simulate", "H100-80GB-HBM3:1", "--config", str(mig))
    try:
        with LocalClient(state) as c:
            doc = c.status()
        assert doc["gpus"][0]["mode"] == "mig" and doc["reservations"] == []
    finally:
        stop(p)
