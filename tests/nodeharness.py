"""A node core over a fresh state directory, as the daemon would set it up
(``hamid.daemon.service.prepare``: lock, inventory, shim, facts), for tests
that drive the node without starting a daemon process."""

from __future__ import annotations

from pathlib import Path

from hamid.config import load_config, resolve_node
from hamid.daemon import service


def make_node(state: Path, simulate: str = "H100:2", mode: str = "hami-core", node: str = "node-t", **extra):
    """A prepared :class:`hamid.daemon.service.Daemon`; call ``.close()`` when done."""
    overrides = {"stateDir": str(state), "simulate": simulate, "operatingMode": mode, "nodeName": node,
                 **extra}
    config = load_config(None, overrides)
    settings = resolve_node(config, node)
    return service.prepare(config, settings, node)
