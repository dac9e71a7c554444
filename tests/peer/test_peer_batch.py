"""The peer API's batch commit (``commit_many``) over real TCP on 127.0.0.1, and the leader's
side that gathers a node's commits into it (hamid/scheduling/batches.py).

What the gate leader relies on: one request commits a burst on one node with a verdict per
placement (one refused does not refuse the others), the same checks as the single commit
(keys, leader only, bounded size), the same idempotency when a new leader sends a batch
again, and a node that does not know the verb (an older hamid) still gets its placements,
one per request.
"""

from __future__ import annotations

import pytest
import trio
from structlog.testing import capture_logs

from peerharness import LedgerNode, new_keyring, serving
from hamid.scheduling.batches import NodeBatches
from hamid.peer import PeerClient, PeerFace, PeerProtocolError, PeerRefused, PeerUnknownMethod
from hamid.peer import frames
from hamid.peer import server as peer_server
from hamid.request import parse_docker_env


A1, A2 = "a1" * 16, "a2" * 16  # attempt ids: 32 hex digits


def items(node: LedgerNode, specs: list[str], prefix: str = "p", attempt: str = A1) -> list[dict]:
    out = []
    for i, spec in enumerate(specs):
        owner, decision = node.propose(f"{prefix}{i}", spec)  # each from the node's view as it is now: stale
        out.append({"owner": owner, "decision": decision,
                    "request": parse_docker_env({"HAMI_VGPU_SPEC": spec}, f"{prefix}{i}").to_dict(),
                    "details": {"placed_by": "gate", "attempt": attempt}})
    return out


async def test_a_batch_commits_each_placement_with_its_own_verdict(tmp_path):
    keys = new_keyring(tmp_path)
    b = LedgerNode(tmp_path, "node-b", "T4")  # one GPU of 15360 MiB
    async with serving(PeerFace(b, keys, "127.0.0.1:0")) as (addr,), PeerClient(keys, name="leader") as c:
        batch = items(b, ["mem=8g", "mem=10g", "mem=4g"])  # the second no longer fits once the first is booked
        got = await c.commit_many(addr, "node-b", batch)
        assert got[0]["owner"] == "pod:p0" and got[2]["owner"] == "pod:p2"
        assert got[0]["details"]["attempt"] == A1
        assert isinstance(got[1], PeerRefused) and "does not fit" in str(got[1]) and got[1].reasons
        assert sorted(b.owners()) == ["pod:p0", "pod:p2"]

        # a new leader sends the same placements again (the first answer lost): the node answers with
        # what it holds, the first attempt's, and books nothing twice
        again = [dict(it, details={"placed_by": "gate", "attempt": A2}) for it in batch]
        second = await c.commit_many(addr, "node-b", again)
        assert [r["details"]["attempt"] for r in (second[0], second[2])] == [A1, A1]
        assert isinstance(second[1], PeerRefused)
        assert sorted(b.owners()) == ["pod:p0", "pod:p2"] and b.ledger.view().gpus[0].mem_used == 12288

        # an item the node cannot read is refused alone
        good = items(b, ["mem=1g"], prefix="q")[0]
        args = {"items": [{"owner": {"kind": "vm", "uid": "x"}, "decision": good["decision"].to_dict()},
                          {"owner": good["owner"].to_dict(), "decision": good["decision"].to_dict()}]}
        raw = await c.call(addr, "commit_many", args, to="node-b")
        assert raw["results"][0]["ok"] is False and raw["results"][0]["error"] == "bad-request"
        assert "owner kind: bad value 'vm'" in raw["results"][0]["message"]
        assert raw["results"][1]["ok"] is True and "pod:q0" in b.owners()


async def test_an_oversize_batch_is_refused_whole_with_the_limit_named(tmp_path):
    keys = new_keyring(tmp_path)
    b = LedgerNode(tmp_path, "node-b", "A100-80GB:8")
    face = PeerFace(b, keys, "127.0.0.1:0", max_body_bytes=64 * 1024)
    async with serving(face) as (addr,), PeerClient(keys) as c:
        many = items(b, ["mem=1g"] * (frames.MAX_BATCH + 1))
        with pytest.raises(ValueError, match=f"accepted: 1 to {frames.MAX_BATCH}"):
            await c.commit_many(addr, "node-b", many)
        wire = {"items": [{"owner": it["owner"].to_dict(), "decision": it["decision"].to_dict()} for it in many]}
        with pytest.raises(PeerProtocolError, match=f"'items' must be a list of 1 to {frames.MAX_BATCH} commits; "
                                                    f"got {frames.MAX_BATCH + 1} items") as e:
            await c.call(addr, "commit_many", wire, to="node-b")
        assert e.value.kind == "bad-request"
        with pytest.raises(PeerProtocolError, match="got 0 items"):
            await c.call(addr, "commit_many", {"items": []}, to="node-b")
        with pytest.raises(PeerProtocolError, match="got a str"):
            await c.call(addr, "commit_many", {"items": "x"}, to="node-b")
        # within the count but over the body limit: refused before it is read
        padded = [dict(it, request={"pad": "x" * 2048}) for it in many[:40]]
        with pytest.raises(PeerProtocolError, match="over 65536 bytes") as e:
            await c.commit_many(addr, "node-b", padded)
        assert e.value.kind == "too-large"
        assert b.owners() == []


async def test_only_the_leader_commits_a_batch(tmp_path):
    keys = new_keyring(tmp_path)
    b = LedgerNode(tmp_path, "node-b")
    face = PeerFace(b, keys, "127.0.0.1:0", leader=lambda: "node-a")
    async with serving(face) as (addr,), PeerClient(keys, name="node-c") as c:
        with pytest.raises(PeerProtocolError, match="'node-c' is not the leader") as e:
            await c.commit_many(addr, "node-b", items(b, ["mem=1g", "mem=2g"]))
        assert e.value.kind == "forbidden" and b.owners() == []


def old_node(monkeypatch) -> None:
    """The peer server as a hamid from before ``commit_many``: its frame check knew three methods."""
    real = frames.decode_request

    def decode(sealer, frame):
        msg = real(sealer, frame)
        if msg["m"] == "commit_many":
            raise frames.FrameError("schema", "method 'commit_many'; accepted: commit, release, status")
        return msg

    monkeypatch.setattr(peer_server.frames, "decode_request", decode)


async def test_the_leader_gathers_a_nodes_commits_into_one_request(tmp_path):
    keys = new_keyring(tmp_path)
    a, b = LedgerNode(tmp_path, "node-a", "T4"), LedgerNode(tmp_path, "node-b", "T4")
    async with serving(PeerFace(a, keys, "127.0.0.1:0"), PeerFace(b, keys, "127.0.0.1:0")) as addrs, \
            PeerClient(keys, name="leader") as c:
        batches = NodeBatches(c)
        addr = {"node-a": addrs[0], "node-b": addrs[1]}
        work = items(a, ["mem=4g", "mem=4g", "mem=8g", "mem=2g"], "a") + items(b, ["mem=2g"] * 5, "b")
        out: dict[str, object] = {}

        async def one(it):
            try:
                out[it["owner"].key] = await batches.commit(addr[it["decision"].node], it["owner"], it["decision"],
                                                            request=it["request"], details=it["details"])
            except PeerRefused as e:
                out[it["owner"].key] = e

        async with trio.open_nursery() as nursery:  # as a gate pass starts its pods' commits: all at once
            for it in work:
                nursery.start_soon(one, it)
        assert batches.requests == 2  # one per node
        # 4 + 4 + 8 + 2 GiB > 15 GiB: one of node-a's (whichever came last of a 4 and the 8) is refused, alone
        assert sum(isinstance(v, PeerRefused) for v in out.values()) == 1
        assert sorted(k for k, v in out.items() if isinstance(v, dict)) == sorted(a.owners() + b.owners())
        assert len(a.owners()) == 3 and len(b.owners()) == 5


async def test_a_leader_falls_back_to_single_commits_on_a_node_without_the_batch_verb(tmp_path, monkeypatch):
    old_node(monkeypatch)
    keys = new_keyring(tmp_path)
    b = LedgerNode(tmp_path, "node-b", "A100-80GB:2")
    async with serving(PeerFace(b, keys, "127.0.0.1:0")) as (addr,), PeerClient(keys, name="leader") as c:
        with pytest.raises(PeerUnknownMethod, match="does not know the commit_many request"):
            await c.commit_many(addr, "node-b", items(b, ["mem=1g", "mem=1g"], "x"))
        assert b.owners() == []
        batches = NodeBatches(c)
        with capture_logs() as logs:
            for burst in ("p", "q"):
                work = items(b, ["mem=2g"] * 4, burst)
                async with trio.open_nursery() as nursery:
                    for it in work:
                        nursery.start_soon(lambda it=it: batches.commit(addr, it["owner"], it["decision"],
                                                                        request=it["request"], details=it["details"]))
        assert len(b.owners()) == 8
        # the first burst: one refused batch, then four singles; the second: singles at once
        assert batches.requests == 1 + 4 + 4
        said = [e for e in logs if "does not know the batch commit" in e["event"]]
        assert len(said) == 1 and said[0]["node"] == "node-b"
