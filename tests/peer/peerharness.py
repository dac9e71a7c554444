"""Peers for the peer API tests: each the real node service over its own ledger.

``LedgerNode`` is a :class:`hamid.node.service.NodeService` (the object the
daemon hands its faces) over a real :class:`hamid.ledger.Ledger` on simulated
GPUs, plus a few helpers the tests use to propose and to look.
"""

from __future__ import annotations

import base64
import os
from contextlib import asynccontextmanager

import trio

from simnodes import node_view

from hamid.devices.simulated import SimulatedBackend, parse_simulate_spec
from hamid.keyring import Keyring
from hamid.ledger import Ledger
from hamid.node.core import NodeCore
from hamid.node.facts import NodeFacts
from hamid.node.identity import Owner
from hamid.node.service import NodeService
from hamid.peer import PeerFace
from hamid.placement import place
from hamid.request import parse_docker_env


def new_keyring(tmp_path, name: str = "keys", *keys: bytes) -> Keyring:
    """A keyring loaded from a 0600 file, as the daemon loads it."""
    keys = keys or (os.urandom(32),)
    path = tmp_path / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# test keyring\n" + "".join(base64.b64encode(k).decode() + "\n" for k in keys))
    return Keyring.load(path)


class LedgerNode(NodeService):
    def __init__(self, tmp_path, name: str, spec: str = "T4:2") -> None:
        state = tmp_path / name
        state.mkdir(mode=0o700)
        self.ledger = Ledger(state / "ledger.db")
        self.ledger.set_inventory(name, node_view(name, spec).gpus)
        backend = SimulatedBackend(parse_simulate_spec(spec), name)
        facts = NodeFacts(node=name, state_dir=str(state),
                          backend={"kind": "simulated", "simulate": spec, "mig_enabled": False})
        super().__init__(NodeCore(self.ledger, facts, lambda: backend), "simulated")

    def propose(self, uid: str, spec: str = "mem=4g"):
        """(owner, decision) as a leader would choose it from this node's current view."""
        owner = Owner("pod", uid, f"default/{uid}")
        request = parse_docker_env({"HAMI_VGPU_SPEC": spec}, uid)
        return owner, place(request, [self.ledger.view()])

    def owners(self) -> list[str]:
        return [r.owner for r in self.ledger.list()]


@asynccontextmanager
async def serving(*faces: PeerFace):
    """Each face serving on its own port of 127.0.0.1; yields their addresses."""
    async with trio.open_nursery() as nursery:
        addrs = [await nursery.start(f.run) for f in faces]
        yield addrs
        nursery.cancel_scope.cancel()
