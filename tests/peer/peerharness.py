"""Peers for the peer API tests: each a real ledger behind a small node service.

``LedgerNode`` stands in for ``hamid.node.service.NodeService`` (the same
three async methods over a real :class:`hamid.ledger.Ledger`, each in a worker
thread) until the daemon serves the real one; the peer API sees only those
methods.
"""

from __future__ import annotations

import base64
import os
from contextlib import asynccontextmanager

import trio

from simnodes import node_view

from hamid.gossip.keyring import Keyring
from hamid.ledger import Ledger
from hamid.ledger.report import status_document
from hamid.node.identity import Owner
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


class LedgerNode:
    def __init__(self, tmp_path, name: str, spec: str = "T4:2") -> None:
        self.name = name
        self.ledger = Ledger(tmp_path / f"{name}.db")
        self.ledger.set_inventory(name, node_view(name, spec).gpus)

    async def commit(self, owner: Owner, decision, *, request=None, details=None):
        return await trio.to_thread.run_sync(lambda: self.ledger.commit(
            owner.key, decision, kind=owner.kind, request=request or {}, details=details or {}))

    async def release(self, key: str):
        return await trio.to_thread.run_sync(self.ledger.release, key)

    async def status(self) -> dict:
        view = await trio.to_thread.run_sync(self.ledger.view)
        res = await trio.to_thread.run_sync(self.ledger.list)
        return status_document(view, res, "simulated")

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
