"""Shared fixtures for the top-level tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The stand-ins (kube-apiserver, kubelet, kube-scheduler, the pod runner: tests/standins/) and the
# Kubernetes harnesses (tests/k8s/: a node, a cluster) are imported by name from any test folder.
for _d in ("standins", "k8s"):
    _p = str(Path(__file__).resolve().parent / _d)
    if _p not in sys.path:
        sys.path.insert(0, _p)


@pytest.fixture
def api_server():
    """A running kube-apiserver stand-in (tests/standins/apiserver/), bookmarks every 0.2 s."""
    from apiserver import ApiServer

    with ApiServer(bookmark_interval=0.2) as api:
        yield api


@pytest.fixture
def kubeconfig(api_server, tmp_path) -> str:
    return api_server.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def free_port() -> int:
    """A port for a daemon to listen on (tests/k8s/netports.py: outside the ephemeral range)."""
    from netports import free_port as pick

    return pick()


@pytest.fixture(scope="session", autouse=True)
def _unmount_region_tmpfs(tmp_path_factory):
    """Daemons keep containers' region tmpfs mounted across their own restarts (running containers
    keep their regions); a test's daemon stopped with containers still booked leaves them behind.
    Detach the ones under this session's temporary directory when the session ends, so pytest can
    remove it (and no mount outlives the run)."""
    yield
    from hamid.node import regionfs

    base = str(tmp_path_factory.getbasetemp())
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    for point in sorted((p for p in points if p.startswith(base + "/")), key=len, reverse=True):
        try:
            regionfs.unmount(point)
        except Exception:
            pass
