"""The first five minutes: user errors end in a sentence saying what to do, never a traceback."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HAMID = [sys.executable, "-m", "hamid.cli.main"]
EXAMPLES = REPO / "docs" / "examples"


def test_busy_metrics_port_names_the_flag(tmp_path):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        r = subprocess.run([*HAMID, "run", "--state-dir", str(tmp_path / "st"), "--simulate", "T4",
                            "--metrics-port", str(port)], capture_output=True, text=True, timeout=60)
    finally:
        s.close()
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert f":{port}: Address already in use" in last and "--metrics-port" in last, last


def test_output_cut_short_by_the_reader_is_not_an_error_trace(tmp_path):
    # `hamid plan -o json | head -1`: enough output to fill the pipe, a reader that leaves.
    work = tmp_path / "w.yaml"
    one = (EXAMPLES / "workload.yaml").read_text()
    work.write_text("\n---\n".join([one] * 60))
    p = subprocess.Popen([*HAMID, "plan", "--cluster", str(EXAMPLES / "cluster.yaml"), "--workload", str(work),
                          "-o", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.read(10)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def _nobody_env() -> tuple[str, str, dict] | None:
    """An interpreter of this Python version that uid 65534 can run, with hamid importable (ours may
    live under /root, unreadable to others)."""
    runuser = shutil.which("runuser")
    if runuser is None:
        return None
    site = next(p for p in sys.path if p.endswith("site-packages"))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO}:{site}"}
    for cand in (sys.executable, f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"):
        if not os.path.exists(cand):
            continue
        r = subprocess.run([runuser, "-u", "nobody", "--", cand, "-c", "import hamid.cli.main"],
                           capture_output=True, text=True, env=env, cwd="/", timeout=60)
        if r.returncode == 0:
            return runuser, cand, env
    return None


def test_status_as_non_root_says_run_as_root():
    if os.geteuid() != 0:
        pytest.skip("needs root to make a root-only state dir and run as nobody")
    found = _nobody_env()
    if found is None:
        pytest.skip("no Python of this version with hamid importable that uid 65534 can run")
    runuser, py, env = found
    from hamid.daemon.service import LEDGER_NAME
    from hamid.ledger import Ledger

    root = Path(tempfile.mkdtemp(prefix="hamid-nonroot-"))
    try:
        os.chmod(root, 0o755)
        state = root / "state"  # as `hamid run` leaves it: root-only, with a ledger
        state.mkdir(mode=0o700)
        Ledger(state / LEDGER_NAME).close()
        r = subprocess.run([runuser, "-u", "nobody", "--", py, "-m", "hamid.cli.main", "status",
                            "--state-dir", str(state)], capture_output=True, text=True, timeout=60, env=env, cwd="/")
    finally:
        shutil.rmtree(root)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert "Permission denied" in r.stderr and "run it as root" in r.stderr, r.stderr
