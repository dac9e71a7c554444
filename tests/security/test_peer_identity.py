"""A peer key is not a master key.

The gossip keyring is shared by every daemon pod, so holding it proved only
membership: one holder could commit on any node, release any reservation
(Docker ones too), omit the target node (any node accepted the request) and
advertise another node's name. Now each node signs its peer requests with
its own Ed25519 key, whose public half it gossips; a node accepts commits
only from the node the current leader runs on, releases only reservations
that node placed (pods only), requires the target node; the identity a
node's name carries in gossip is its own (test_gossip_identity.py). The keyring itself is reloaded
from its file while the daemon runs (a rotated Secret).
"""

from __future__ import annotations

import base64
import os
import sys

import pytest
import trio

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "peer"))

from peerharness import LedgerNode, new_keyring, serving  # noqa: E402

from hamid.keyring import Keyring, watch_key_file  # noqa: E402
from hamid.node.identity import Owner  # noqa: E402
from hamid.nodekey import NodeIdentity  # noqa: E402
from hamid.peer import PeerClient, PeerProtocolError, PeerRefused, PeerUnauthenticated, frames  # noqa: E402
from hamid.peer.server import PeerFace  # noqa: E402


class Cluster:
    """The identities node-b's peer API knows from gossip, and who leads."""

    def __init__(self) -> None:
        self.ids = {n: NodeIdentity.generate() for n in ("node-a", "node-c")}
        self.leader = "node-a"

    def identity_of(self, node: str):
        i = self.ids.get(node)
        return i.public_b64 if i is not None else None


async def test_requests_must_be_signed_by_the_sender_the_cluster_knows(tmp_path):
    keys = new_keyring(tmp_path)
    cl = Cluster()
    b = LedgerNode(tmp_path, "node-b")
    face = PeerFace(b, keys, "127.0.0.1:0", identities=cl.identity_of, leader=lambda: cl.leader)
    async with serving(face) as (addr,):
        owner, decision = b.propose("p1")
        for client in (PeerClient(keys, name="node-a"),  # unsigned
                       PeerClient(keys, name="node-a", identity=NodeIdentity.generate()),  # another key
                       PeerClient(keys, name="node-z", identity=NodeIdentity.generate())):  # not a member
            async with client:
                with pytest.raises(PeerUnauthenticated, match="could not authenticate"):
                    await client.commit(addr, owner, decision)
        assert b.owners() == []
        # the target node is required: a request that names none is refused before anything else
        msg = frames.new_request("status", {}, sender="node-a", to=None)
        with pytest.raises(frames.FrameError, match="'to' must name the node"):
            frames.decode_request(frames.Sealer(keys), frames.encode_request(frames.Sealer(keys), msg,
                                                                              cl.ids["node-a"]))
        async with PeerClient(keys, name="node-a", identity=cl.ids["node-a"]) as a:
            res = await a.commit(addr, owner, decision, details={"placed_by": "gate", "attempt": "b" * 32})
            assert res["details"]["placer"] == "node-a"  # recorded by the node, not sent by the caller


async def test_only_the_leader_commits_and_only_the_placer_releases(tmp_path):
    keys = new_keyring(tmp_path)
    cl = Cluster()
    b = LedgerNode(tmp_path, "node-b")
    face = PeerFace(b, keys, "127.0.0.1:0", identities=cl.identity_of, leader=lambda: cl.leader)
    async with serving(face) as (addr,), \
            PeerClient(keys, name="node-a", identity=cl.ids["node-a"]) as a, \
            PeerClient(keys, name="node-c", identity=cl.ids["node-c"]) as c:
        owner, decision = b.propose("p1")
        with pytest.raises(PeerProtocolError, match="'node-c' is not the leader") as e:
            await c.commit(addr, owner, decision)
        assert e.value.kind == "forbidden" and b.owners() == []
        await a.commit(addr, owner, decision)
        with pytest.raises(PeerProtocolError, match="was not placed by node 'node-c'"):
            await c.release(addr, owner.key, node="node-b")
        assert b.owners() == [owner.key]

        # a Docker container's reservation is never the peers' to release
        _, dec = b.propose("c0ffee", "mem=1g")
        b.ledger.commit(Owner("docker", "c0ffee"), dec)
        with pytest.raises(PeerProtocolError, match="only its placer may release it"):
            await a.release(addr, "docker:c0ffee", node="node-b")
        assert sorted(b.owners()) == sorted([owner.key, "docker:c0ffee"])

        # leadership moves: the new leader commits, the old placer still undoes only its own
        cl.leader = "node-c"
        owner2, decision2 = b.propose("p2")
        with pytest.raises(PeerProtocolError, match="not the leader"):
            await a.commit(addr, owner2, decision2)
        await c.commit(addr, owner2, decision2)
        assert (await a.release(addr, owner.key, node="node-b"))["released"] is True
        assert sorted(b.owners()) == sorted([owner2.key, "docker:c0ffee"])


def test_the_identity_key_is_kept_in_the_state_directory(tmp_path):
    first = NodeIdentity.load_or_create(tmp_path)
    assert NodeIdentity.load_or_create(tmp_path).public_b64 == first.public_b64
    assert oct(os.stat(tmp_path / "peer-identity.key").st_mode & 0o777) == "0o600"
    os.unlink(tmp_path / "peer-identity.key")
    os.symlink("/etc/hostname", tmp_path / "peer-identity.key")
    with pytest.raises(Exception, match="cannot read"):
        NodeIdentity.load_or_create(tmp_path)


async def test_a_rotated_key_file_takes_effect_without_a_restart(tmp_path):
    old, new = os.urandom(32), os.urandom(32)
    path = tmp_path / "gossip.keys"
    path.write_text(base64.b64encode(old).decode() + "\n")
    keyring = Keyring.load(path)
    b = LedgerNode(tmp_path, "node-b")
    async with serving(PeerFace(b, keyring, "127.0.0.1:0")) as (addr,), trio.open_nursery() as nursery:
        nursery.start_soon(lambda: watch_key_file(keyring, path, interval=0.05))
        async with PeerClient(Keyring([new]), name="x") as rotated:
            with pytest.raises(PeerUnauthenticated):
                await rotated.status(addr, node="node-b")
            # the Secret gains the new key first (both accepted), then drops the old one
            path.write_text(base64.b64encode(new).decode() + "\n" + base64.b64encode(old).decode() + "\n")
            await trio.sleep(0.3)
            assert (await rotated.status(addr, node="node-b"))["node"] == "node-b"
            path.write_text("not base64 at all\n")  # a broken file: the keys in use are kept
            await trio.sleep(0.3)
            assert keyring.keys == [new, old]
        nursery.cancel_scope.cancel()


async def test_a_new_leaders_first_commits_are_taken_once_its_lease_is_valid(tmp_path, api_server, kubeconfig):
    """Right after a leader change a node's view of the leader (its elector's last read of the
    Lease, every retry period) still names the old one; the new leader's commits must not be
    refused for that: the node reads the Lease again before refusing."""
    from hamid.kube.client import api_client
    from hamid.kube.election import LeaderElector
    from hamid.request.model import Defaults
    from hamid.scheduling.face import SchedulingFace
    from hamid.scheduling.gates import refusal_reason
    from hamid.scheduling.placer import ClusterView

    def elector(ident: str, **kw) -> LeaderElector:
        return LeaderElector(api_client(kubeconfig), identity=ident, namespace="kube-system",
                             **{"lease_duration": 2, "renew_deadline": 1.5, "retry_period": 0.3, **kw})

    keys = new_keyring(tmp_path)
    cl = Cluster()
    b = LedgerNode(tmp_path, "node-b")
    # node-b's elector re-reads the Lease only every 30 s or more: its view of the leader goes stale
    follower = elector("node-b", lease_duration=100, renew_deadline=60, retry_period=30)
    scheduling = SchedulingFace(api=None, peer=None, cluster=ClusterView(read=dict, to_view=lambda d: d),
                                elector=follower, mode="gate", defaults=Defaults(), node_policy="binpack", ignored=set())
    face = PeerFace(b, keys, "127.0.0.1:0", identities=cl.identity_of, leader=lambda: scheduling.leader_node,
                    confirm_leader=scheduling.confirm_leader)
    old, new = elector("node-a"), elector("node-c")
    old_term = trio.CancelScope()

    async def run_in(scope, e):
        with scope:
            await e.run()

    async with trio.open_nursery() as n:
        n.start_soon(run_in, old_term, old)
        await old.wait_leading()
        await n.start(follower.run)  # its first round reads the Lease: node-a leads
        while follower.leader_identity is None:
            await trio.sleep(0.02)
        scheduling.leader_node = await follower.leader_node()
        assert scheduling.leader_node == "node-a"
        # node-a stops cleanly and node-c takes the Lease; node-b's elector has not looked since
        n.start_soon(new.run)
        old_term.cancel()
        await new.wait_leading()
        assert scheduling.leader_node == "node-a" and follower.leader_identity == "node-a"  # stale, as in the report
        async with serving(face) as (addr,), PeerClient(keys, name="node-c", identity=cl.ids["node-c"]) as c, \
                PeerClient(keys, name="node-a", identity=cl.ids["node-a"]) as a:
            owner, decision = b.propose("p1")
            await c.commit(addr, owner, decision)  # taken at once, not a retry period later
            assert b.owners() == [owner.key] and scheduling.leader_node == "node-c"
            owner2, decision2 = b.propose("p2")
            with pytest.raises(PeerProtocolError, match="'node-a' is not the leader") as refused:  # the old one is
                await a.commit(addr, owner2, decision2)
            # and the pod's reason says so, not that the node's ledger refused it
            why = refusal_reason(refused.value)
            assert "does not see it as the leader" in why and "ledger" not in why, why
            b.ledger.commit(Owner("docker", "hog"), b.propose("hog", "mem=15g")[1])  # the GPU fills meanwhile
            with pytest.raises(PeerRefused) as full:
                await c.commit(addr, owner2, decision2)
            assert "ledger refused" in refusal_reason(full.value)
        n.cancel_scope.cancel()
