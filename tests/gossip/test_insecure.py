"""Gossip without a key off loopback is refused before the daemon starts,
unless the operator says so (--gossip-insecure / gossipInsecure: true)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_daemon import HAMID, start, stop  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def test_run_refuses_keyless_gossip_on_a_wildcard_before_touching_the_state_dir(tmp_path):
    state = tmp_path / "state"
    listen = f"0.0.0.0:{_port()}"
    try:
        p = subprocess.run([*HAMID, "run", "--state-dir", str(state), "--metrics-port", "0", "--simulate", "T4",
                            "--gossip-listen", listen], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError("the daemon started with keyless gossip on a wildcard address") from None
    assert p.returncode == 1
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith(f"hamid run: config: gossip on {listen} without a key")
    assert "--gossip-insecure" in p.stderr and "--gossip-key-file" in p.stderr
    assert not state.exists()


def test_gossip_insecure_lets_it_run(tmp_path, free_port):
    state = tmp_path / "state"
    port = _port()
    d = start(state, free_port, "--simulate", "T4", "--gossip-listen", f"0.0.0.0:{port}",
              "--gossip-advertise", f"127.0.0.1:{port}", "--gossip-insecure")
    err = stop(d)
    assert "gossip without a key" in err
