"""Shared fixtures for the top-level tests."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
