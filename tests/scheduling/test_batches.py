"""The gate leader's per-node batching of commits (hamid/scheduling/batches.py), against an in-memory peer.

The peer here is a stand-in that records what it was sent and answers when the test says so
(the real peer API is exercised in tests/peer/test_peer_batch.py). What the leader relies on:
one batch in flight per node, the commits that arrive meanwhile go together in the next one,
a batch is cut at the client's ``max_batch``, and a commit whose caller gives up (the leader
stops) never leaves the others of its node waiting forever (the one sending a batch fails
that batch's others with ``NotSent``; one waiting just leaves the queue).
"""

from __future__ import annotations

from types import SimpleNamespace

import trio

from hamid.scheduling.batches import NodeBatches


class HeldPeer:
    """A peer stand-in: every ``commit_many`` waits for ``release`` and answers each item with a
    reservation-like dict."""

    max_batch = 4

    def __init__(self) -> None:
        self.sent: list[list[str]] = []
        self.release = trio.Event()

    async def commit_many(self, address, node, items):
        self.sent.append([it["owner"] for it in items])
        await self.release.wait()
        return [{"owner": it["owner"]} for it in items]

    async def commit(self, address, owner, decision, *, request=None, details=None):
        self.sent.append([owner])
        await self.release.wait()
        return {"owner": owner}


def dec(node: str = "n1"):
    return SimpleNamespace(node=node)


async def test_commits_arriving_while_a_batch_is_in_flight_go_together_next_and_batches_are_cut():
    peer = HeldPeer()
    b = NodeBatches(peer)
    got = {}

    async def one(name):
        got[name] = await b.commit("addr", name, dec())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "a")
        nursery.start_soon(one, "b")
        await trio.testing.wait_all_tasks_blocked()
        for x in "cdefgh":  # arrive while a+b are in flight: 6, cut into 4 + 2
            nursery.start_soon(one, x)
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(peer.sent[0]) == ["a", "b"] and len(peer.sent) == 1
        peer.release.set()
    assert [len(x) for x in peer.sent] == [2, 4, 2]  # (trio starts tasks in no fixed order)
    assert sorted(sum(peer.sent[1:], [])) == list("cdefgh")
    assert got == {x: {"owner": x} for x in "abcdefgh"}


async def test_a_commit_given_up_on_does_not_stall_its_node():
    peer = HeldPeer()
    b = NodeBatches(peer)
    got = {}
    scopes = {}

    async def one(name):
        with trio.CancelScope() as scopes[name]:
            got[name] = await b.commit("addr", name, dec())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "a")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(one, "b")
        nursery.start_soon(one, "c")
        await trio.testing.wait_all_tasks_blocked()
        assert peer.sent == [["a"]]  # b and c wait behind a's request
        scopes["b"].cancel()  # a waiting commit gives up
        await trio.testing.wait_all_tasks_blocked()
        peer.release.set()
    assert peer.sent == [["a"], ["c"]] and sorted(got) == ["a", "c"]

    # the sender itself gives up while its batch is gathering: the next commit still goes
    peer2 = HeldPeer()
    peer2.release.set()
    b2 = NodeBatches(peer2)
    got2 = {}
    async with trio.open_nursery() as nursery:
        async def first():
            with trio.CancelScope() as s:
                s.cancel()  # cancelled at its first checkpoint: the gathering one
                got2["x"] = await b2.commit("addr", "x", dec())

        async def second():
            got2["y"] = await b2.commit("addr", "y", dec())

        nursery.start_soon(first)
        nursery.start_soon(second)
    assert got2 == {"y": {"owner": "y"}}
