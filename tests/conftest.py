"""Shared fixtures: simulated nodes and a free TCP port."""

from __future__ import annotations

import socket

import pytest

from hamid.config import NodeSettings
from hamid.daemon.inventory import capacity_views
from hamid.devices.simulated import SimulatedBackend, parse_simulate_spec
from hamid.placement import NodeView


def node_view(name: str, spec: str, **settings) -> NodeView:
    s = NodeSettings(**settings)
    backend = SimulatedBackend(parse_simulate_spec(spec), name, mig_enabled=s.operatingMode == "mig")
    return NodeView(name, tuple(capacity_views(backend.gpus(), s)), s.gpuSchedulerPolicy)


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
