"""Node views of simulated GPUs for the placement and ledger tests."""

from __future__ import annotations

from hamid.config import NodeSettings
from hamid.node.capacity import capacity_views
from hamid.devices.simulated import SimulatedBackend, parse_simulate_spec
from hamid.placement import NodeView


def node_view(name: str, spec: str, **settings) -> NodeView:
    s = NodeSettings(**settings)
    backend = SimulatedBackend(parse_simulate_spec(spec), name, mig_enabled=s.operatingMode == "mig")
    return NodeView(name, tuple(capacity_views(backend.gpus(), s)), s.gpuSchedulerPolicy)
