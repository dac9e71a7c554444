"""A leader finds a node's peer API through gossip and commits there: node A
publishes its peer address in its capacity document; node B reads it from its
cluster view, places on A's view as gossiped, and commits through the peer API."""

from __future__ import annotations

import pytest
import trio

from peerharness import LedgerNode, new_keyring
from hamid.cluster.capacity import doc_problem, view_from_doc
from hamid.gossip.params import GossipParams
from hamid.gossip.service import GossipService
from hamid.node.identity import Owner
from hamid.peer import PeerClient, PeerFace
from hamid.placement import place
from hamid.request import parse_docker_env

P = GossipParams(probe_interval=0.4, probe_timeout=0.2, gossip_interval=0.1, push_pull_interval=2,
                 capacity_interval=0.2)


async def test_the_peer_address_travels_in_gossip_and_the_leader_commits_there(tmp_path):
    keys = new_keyring(tmp_path)
    a, b = LedgerNode(tmp_path, "node-a"), LedgerNode(tmp_path, "node-b")
    async with trio.open_nursery() as nursery:
        peer_a = await nursery.start(PeerFace(a, keys, "127.0.0.1:0").run)
        gossip_a = GossipService("node-a", "127.0.0.1:0", params=P, keyring=keys, read_view=a.ledger.view,
                                 peer_address=peer_a)
        addr_a = await nursery.start(gossip_a.run)
        gossip_b = GossipService("node-b", "127.0.0.1:0", params=P, keyring=keys, read_view=b.ledger.view,
                                 seeds=(addr_a,))
        await nursery.start(gossip_b.run)
        with trio.fail_after(10):
            while True:
                docs = {m["name"]: m["capacity"] for m in gossip_b.cluster_document()["members"]}
                if docs.get("node-a"):
                    break
                await trio.sleep(0.05)
        doc = docs["node-a"]
        assert doc["peer"] == peer_a and "peer" not in (docs["node-b"] or {})
        request = parse_docker_env({"HAMI_VGPU_SPEC": "mem=5g"}, "uid-1")
        decision = place(request, [view_from_doc(doc)])  # as the leader would, from gossip
        async with PeerClient(keys, name="node-b") as client:
            res = await client.commit(doc["peer"], Owner("pod", "uid-1", "default/web"), decision)
        assert res["owner"] == "pod:uid-1" and a.owners() == ["pod:uid-1"] and b.owners() == []
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("peer", [7, "", "x" * 300])
def test_a_malformed_peer_address_in_a_document_is_refused(tmp_path, peer):
    doc = {"node": "n", "version": 1, "gpus": [], "profiles": {}, "peer": peer}
    assert doc_problem(doc) == "peer address malformed"
    assert doc_problem(dict(doc, peer="10.0.0.7:7948")) is None
