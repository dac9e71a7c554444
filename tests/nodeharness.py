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


def admit_docker(d, specs: dict[str, str], kind: str = "docker") -> tuple[dict[str, Path], str]:
    """Admits one Docker container per ``specs`` item (container id -> its HAMI_VGPU_SPEC) on GPU 0 of the
    prepared daemon ``d`` (``kind`` "pod": as pods ``ns/<id>`` with that uid); returns each one's limits file on
    the host and the GPU's UUID."""
    from hamid.node import layout
    from hamid.node.identity import Owner
    from hamid.node.realize import slot_assignment, slot_name
    from hamid.request import parse_docker_env

    got = {cid: d.core.admit(Owner(kind, cid, name=f"ns/{cid}" if kind == "pod" else ""),
                             parse_docker_env(["HAMI_VISIBLE_DEVICES=0", f"HAMI_VGPU_SPEC={spec}"], cid)).reservation
           for cid, spec in specs.items()}
    limits = {cid: Path(layout.limits_file(d.state_dir, slot_name(r, "main"))) for cid, r in got.items()}
    return limits, slot_assignment(next(iter(got.values())), "main").devices[0].uuid
