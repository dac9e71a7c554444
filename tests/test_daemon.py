"""The daemon as a user runs it: a real process, its unix socket, its metrics.

Each test starts ``hamid run`` as a subprocess on simulated GPUs with its own
state directory, so several daemons can run side by side.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from hamid.errors import HamidError

from hamid.localapi.client import Conflict as LedgerConflict
from hamid.localapi.client import LocalClient
from hamid.request import parse_docker_env
from hamid.node import released

HAMID = [sys.executable, "-m", "hamid.cli.main"]


def start(state: Path, port: int, *extra: str, node: str = "node-a") -> subprocess.Popen:
    p = subprocess.Popen([*HAMID, "run", "--state-dir", str(state), "--metrics-port", str(port),
                          "--node-name", node, "--log-format", "json", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sock = state / "hamid.sock"
    deadline = time.time() + 20
    while time.time() < deadline:
        if p.poll() is not None:
            raise AssertionError(f"daemon exited {p.returncode}: {p.stderr.read()}")
        if sock.exists():
            try:
                with LocalClient(state) as c:
                    c.status()
                return p
            except Exception:
                pass
        time.sleep(0.05)
    p.kill()
    raise AssertionError("daemon did not come up")


def stop(p: subprocess.Popen, sig=signal.SIGTERM) -> str:
    p.send_signal(sig)
    try:
        _, err = p.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    return err


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*HAMID, *args], capture_output=True, text=True, timeout=60)


def test_daemon_serves_reserve_status_metrics_and_survives_a_crash(tmp_path, free_port):
    state = tmp_path / "state"
    p = start(state, free_port, "--simulate", "H100-80GB-HBM3:2,T4")
    try:
        assert oct(state.stat().st_mode & 0o777) == "0o700"
        assert oct((state / "hamid.sock").stat().st_mode & 0o777) == "0o600"
        req = parse_docker_env({"HAMI_VISIBLE_DEVICES": "1", "HAMI_VGPU_SPEC": "mem=4g,cores=30"}, "abc")
        with LocalClient(state) as c:
            with pytest.raises(HamidError, match="key 'extra_files' may not be set by a caller"):
                c.reserve(req.to_dict(), "docker", {"extra_files": ["/etc/passwd"]})  # never a path from a caller
            res = c.reserve(req.to_dict(), "docker")
            dev = res["decision"]["containers"][0]["devices"][0]
            assert (dev["index"], dev["mem_mib"], dev["cores"]) == (1, 4096, 30)
            big = parse_docker_env({"HAMI_VISIBLE_DEVICES": "2", "HAMI_VGPU_SPEC": "mem=20g"}, "big")
            with pytest.raises(LedgerConflict, match="GPU 2 has 15360 MiB free, 20480 requested"):
                c.reserve(big.to_dict(), "docker")
            with pytest.raises(Exception, match="kind: bad value"):
                c.reserve(req.to_dict(), "vm")

        st = cli("status", "--state-dir", str(state), "-o", "json")
        assert st.returncode == 0, st.stderr
        doc = json.loads(st.stdout)
        assert doc["node"] == "node-a" and doc["backend"].startswith("simulated")
        g1 = doc["gpus"][1]
        assert (g1["memory_used_mib"], g1["cores_used"], g1["shares_used"]) == (4096, 30, 1)
        table = cli("status", "--state-dir", str(state)).stdout
        assert "4096/81559 MiB" in table and "docker:abc" in table and "#" in table

        metrics = httpx.get(f"http://127.0.0.1:{free_port}/metrics").text
        line = next(ln for ln in metrics.splitlines()
                    if ln.startswith("hami_gpu_memory_allocated_bytes") and 'device_index="1"' in ln)
        assert float(line.split()[-1]) == 4096 * 1024 * 1024
        assert 'hamid_ledger_commits_total{result="ok"} 1.0' in metrics
        assert 'hamid_ledger_commits_total{result="conflict"} 1.0' in metrics
    finally:
        err = stop(p, signal.SIGKILL)  # a crash: no clean shutdown

    first = json.loads(err.splitlines()[0])
    assert first["event"] == "hamid starting" and first["devices"] == "simulated"

    # Restarted on the same state: the reservation is still there; a stale socket is cleared.
    p = start(state, free_port, "--simulate", "H100-80GB-HBM3:2,T4")
    try:
        with LocalClient(state) as c:
            owners = [r["owner"] for r in c.reservations()]
            assert owners == ["docker:abc"]
            assert c.release("docker:abc")["released"] is True
            assert c.release("docker:abc")["released"] is False
    finally:
        stop(p)
    assert not (state / "hamid.sock").exists()


def test_poststop_marker_is_drained_as_it_appears(tmp_path, free_port):
    """The daemon watches the markers' directory: with the poll interval set to
    a minute, a marker is still drained within a second or two."""
    state = tmp_path / "state"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("releasePollInterval: 60\nreconcileInterval: 600\n")
    p = start(state, free_port, "--config", str(cfg), "--simulate", "T4")
    try:
        req = parse_docker_env({"HAMI_VISIBLE_DEVICES": "0", "HAMI_VGPU_SPEC": "mem=4g"}, "job")
        with LocalClient(state) as c:
            c.reserve(req.to_dict(), "docker")
            for cid in ("job", "gone"):  # the second: a marker with no reservation is just removed
                released.mark(str(state), cid)
            deadline = time.time() + 5
            while time.time() < deadline and (c.reservations() or released.pending(str(state))):
                time.sleep(0.05)
            assert c.reservations() == [] and released.pending(str(state)) == []
    finally:
        stop(p)


def test_status_without_daemon_reads_the_ledger(tmp_path, free_port):
    state = tmp_path / "s"
    p = start(state, free_port, "--simulate", "T4")
    stop(p)
    r = cli("status", "--state-dir", str(state))
    assert r.returncode == 0 and "Tesla T4" in r.stdout
    assert "showing the ledger" in r.stderr
    r = cli("status", "--state-dir", str(tmp_path / "never"))
    assert r.returncode == 1 and "is hamid running" in r.stderr


def test_two_daemons_side_by_side_but_not_on_one_state_dir(tmp_path, free_port):
    a = start(tmp_path / "a", free_port, "--simulate", "T4", node="a")
    try:
        b = start(tmp_path / "b", 0, "--simulate", "A30", node="b")
        try:
            doc = json.loads(cli("status", "--state-dir", str(tmp_path / "b"), "-o", "json").stdout)
            assert doc["node"] == "b" and doc["gpus"][0]["name"] == "NVIDIA A30"
        finally:
            stop(b)
        dup = subprocess.run([*HAMID, "run", "--state-dir", str(tmp_path / "a"), "--metrics-port", "0",
                              "--simulate", "T4"], capture_output=True, text=True, timeout=30)
        assert dup.returncode == 1 and "another hamid daemon is running" in dup.stderr
    finally:
        stop(a)


def test_bad_config_stops_start_up_with_the_key_named(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("deviceSplitCount: 0\n")
    r = subprocess.run([*HAMID, "run", "--config", str(cfg), "--state-dir", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "deviceSplitCount=0" in r.stderr
    r = subprocess.run([*HAMID, "run", "--simulate", "B200", "--state-dir", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "unknown model 'B200'" in r.stderr


def test_config_file_and_flag_precedence(tmp_path, free_port):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("simulate: T4:3\ndeviceSplitCount: 2\nnodeconfig:\n  - {name: edge-1, filterDevices: {index: [0]}}\n")
    state = tmp_path / "s"
    p = start(state, free_port, "--config", str(cfg), "--simulate", "A30:2", node="edge-1")
    try:
        doc = json.loads(cli("status", "--state-dir", str(state), "-o", "json").stdout)
        assert [g["name"] for g in doc["gpus"]] == ["NVIDIA A30", "NVIDIA A30"]  # the flag wins
        assert doc["gpus"][0]["filtered"] is True and doc["gpus"][1]["shares_total"] == 2
    finally:
        stop(p)


def test_version_and_usage_errors():
    r = cli("version")
    assert r.returncode == 0 and r.stdout.startswith("hamid ")
    r = cli("frobnicate")
    assert r.returncode == 2
