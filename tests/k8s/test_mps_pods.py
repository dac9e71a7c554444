"""MPS pods (issue 27) through kubelet's device plugin: a real ``hamid run``, the kubelet and
API-server stand-ins of tests/k8s, and the stand-in ``nvidia-cuda-mps-control``.

Owns the proof that a pod annotated ``nvidia.com/vgpu-mode: mps`` gets the same edits as a Docker
container (the GPU's pipe directory at /run/hamid-mps, a limits file marked MPS with its thread
percentage), and that when its GPU's control daemon dies the daemon restarts it, keeps the pod's
reservation and records an Event ``HamidMpsFailed`` on the pod.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

from hamid.node import mps
from nodeenv import RESOURCE, NodeEnv, mib

pytestmark = pytest.mark.slow

STANDIN = str(Path(__file__).resolve().parents[1] / "standins" / "nvidia-cuda-mps-control")


@pytest.fixture
def node(api_server):
    root = Path(tempfile.mkdtemp(prefix="mk", dir="/tmp"))  # short: the control socket's path is a unix socket's
    env = NodeEnv(root, api_server, simulate="H100:1", mode="mps",
                  extra_config=f"mpsControl: {STANDIN}\nmpsCheckInterval: 0.2\n").start()
    yield env
    env.stop()
    ctl = mps.MpsControl(STANDIN, str(env.state))
    for uuid in ctl.gpus():
        ctl.stop(uuid)
    shutil.rmtree(root, ignore_errors=True)


def test_an_mps_pod_gets_the_pipe_and_an_event_when_its_daemon_dies(node, api_server):
    pod = node.pod("infer", [{"name": "main", "limits": {RESOURCE: 1, "nvidia.com/gpumem": 4096,
                                                           "nvidia.com/gpucores": 30}}],
                   annotations={"nvidia.com/vgpu-mode": "mps"})
    assert node.kubelet.admit(pod).admitted
    cfg = node.kubelet.start_container(pod, "main")
    lim = node.limits_of(cfg)
    (dev,) = lim.devices
    assert lim.mps and dev.sm_percent == 30 and dev.memory_bytes == mib(4096) and dev.slots == ()
    pipe = cfg.mount("/run/hamid-mps")
    assert not pipe.read_only and pipe.host_path == mps.pipe_dir(node.state, dev.uuid)
    assert cfg.env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/hamid-mps"
    ctl = mps.MpsControl(STANDIN, str(node.state))
    (daemon,) = ctl.daemon_pids(dev.uuid)
    os.kill(daemon, signal.SIGKILL)
    deadline = time.monotonic() + 15
    events = []
    while time.monotonic() < deadline and not events:
        events = [ev for ev in api_server.list("Event", "default")
                  if ev["involvedObject"]["name"] == "infer" and ev["reason"] == "HamidMpsFailed"]
        time.sleep(0.1)
    assert events, "no HamidMpsFailed event on the pod"
    assert dev.uuid in events[0]["message"] and "reservation is kept" in events[0]["message"]
    (res,) = node.reservations()
    assert res["details"]["mps_failure"]["gpu"] == dev.uuid
    assert ctl.running(dev.uuid)  # restarted
