"""The peer API over real TCP on 127.0.0.1: two peers, each over its own
ledger, commit and release on each other; keys, replays, stale requests,
refusals and concurrent commits."""

from __future__ import annotations

import time

import cbor2
import httpx
import pytest
import trio
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from peerharness import LedgerNode, new_keyring, serving
from hamid.peer import (PeerClient, PeerFace, PeerProtocolError, PeerRefused, PeerUnauthenticated,
                        PeerUnreachable)
from hamid.peer import frames
from hamid.peer.server import FRAME_TYPE, PATH, PeerConfigError
from hamid.peer.stats import PeerCollector
from hamid.request import parse_docker_env


def url(addr: str) -> str:
    return f"http://{addr}{PATH}"


async def post(addr: str, body: bytes) -> httpx.Response:
    async with httpx.AsyncClient(trust_env=False) as http:
        return await http.post(url(addr), content=body, headers={"content-type": FRAME_TYPE})


def commit_request(node: LedgerNode, uid: str, spec: str = "mem=4g", **kw) -> dict:
    owner, decision = node.propose(uid, spec)
    return frames.new_request("commit", {"owner": owner.to_dict(), "decision": decision.to_dict()},
                              sender="test", to=node.name, **kw)


async def test_two_peers_commit_and_release_on_each_other(tmp_path):
    keys = new_keyring(tmp_path)
    a, b = LedgerNode(tmp_path, "node-a"), LedgerNode(tmp_path, "node-b")
    async with serving(PeerFace(a, keys, "127.0.0.1:0"), PeerFace(b, keys, "127.0.0.1:0")) as (addr_a, addr_b):
        async with PeerClient(keys, name="node-a") as from_a, PeerClient(keys, name="node-b") as from_b:
            owner, decision = b.propose("pod-on-b", "mem=6g")
            asked = parse_docker_env({"HAMI_VGPU_SPEC": "mem=6g"}, "pod-on-b")
            res = await from_a.commit(addr_b, owner, decision, request=asked.to_dict())
            assert res["owner"] == owner.key and res["decision"]["node"] == "node-b"
            assert b.owners() == [owner.key] and a.owners() == []
            assert b.ledger.get(owner.key).request == asked  # stored as the typed request it is
            assert sum(g.mem_used for g in b.ledger.view().gpus) == 6144

            owner2, decision2 = a.propose("pod-on-a", "mem=2g")
            await from_b.commit(addr_a, owner2, decision2)
            assert a.owners() == [owner2.key] and b.owners() == [owner.key]

            doc = await from_b.status(addr_a, node="node-a")
            assert doc["node"] == "node-a" and [r["owner"] for r in doc["reservations"]] == [owner2.key]

            assert (await from_a.commit(addr_b, owner, decision))["owner"] == owner.key  # idempotent
            got = await from_a.release(addr_b, owner.key, node="node-b")
            assert got["released"] is True and got["reservation"]["owner"] == owner.key
            assert (await from_a.release(addr_b, owner.key, node="node-b")) == {"released": False, "reservation": None}
            await from_b.release(addr_a, owner2.key, node="node-a")
            assert a.owners() == [] and b.owners() == []
            assert all(g.mem_used == 0 for g in b.ledger.view().gpus)


async def test_a_commit_whose_request_is_not_one_is_refused_and_nothing_is_stored(tmp_path):
    """The request rides to the node's ledger, which later reads priority and policy from it: a map that
    is not a request (no owner, a field of the wrong type) is refused naming the field, not stored."""
    keys = new_keyring(tmp_path)
    b = LedgerNode(tmp_path, "node-b")
    async with serving(PeerFace(b, keys, "127.0.0.1:0")) as (addr_b,):
        async with PeerClient(keys, name="node-a") as from_a:
            owner, decision = b.propose("pod-on-b", "mem=2g")
            with pytest.raises(PeerProtocolError, match="request.owner"):
                await from_a.commit(addr_b, owner, decision, request={"why": "test"})
            bad = parse_docker_env({"HAMI_VGPU_SPEC": "mem=2g"}, "pod-on-b").to_dict()
            bad["containers"][0]["gpu"]["priority"] = "high"
            with pytest.raises(PeerProtocolError, match="priority"):
                await from_a.commit(addr_b, owner, decision, request=bad)
            assert b.owners() == []


async def test_a_client_without_the_key_gets_nothing(tmp_path):
    b = LedgerNode(tmp_path, "node-b")
    face = PeerFace(b, new_keyring(tmp_path, "ours"), "127.0.0.1:0")
    async with serving(face) as (addr,):
        owner, decision = b.propose("intruder")
        async with PeerClient(new_keyring(tmp_path, "theirs"), name="x") as other, \
                PeerClient(None, insecure=True) as plain:
            for client in (other, plain):
                with pytest.raises(PeerUnauthenticated, match="could not authenticate"):
                    await client.commit(addr, owner, decision)
                with pytest.raises(PeerUnauthenticated):
                    await client.status(addr, node="node-b")
        assert b.owners() == []
        # what such a client sees: a 401 that names no node, GPU or reservation
        raw = await post(addr, frames.Sealer(new_keyring(tmp_path, "third")).seal(b"x" * 40, frames.AAD_REQUEST))
        assert raw.status_code == 401 and "node-b" not in raw.text and "GPU" not in raw.text
        assert face.stats.requests[("unknown", "unauthenticated")] == 5


async def test_a_server_without_the_key_cannot_fake_an_answer(tmp_path):
    keys = new_keyring(tmp_path, "ours")
    b = LedgerNode(tmp_path, "node-b")
    impostor = PeerFace(b, new_keyring(tmp_path, "theirs"), "127.0.0.1:0")
    genuine = PeerFace(b, keys, "127.0.0.1:0")
    recorded: list[bytes] = []

    async def replay_recorded(req):  # answers every request with a genuine answer it recorded
        await req.body()
        return Response(recorded[0], media_type=FRAME_TYPE)

    fake = Starlette(routes=[Route(PATH, replay_recorded, methods=["POST"])])
    async with serving(impostor, genuine) as (addr_imp, addr_gen):
        async with PeerClient(keys) as client:
            # a server holding another key answers: its 401 is not taken for an answer
            owner, decision = b.propose("p1")
            with pytest.raises(PeerUnauthenticated):
                await client.commit(addr_imp, owner, decision)
            # record a genuine, sealed answer to one request...
            msg = frames.new_request("status", {}, sender="t", to="node-b")
            raw = await post(addr_gen, frames.encode_request(frames.Sealer(keys), msg))
            assert frames.decode_answer(frames.Sealer(keys), raw.content, msg["id"])["ok"] is True
            recorded.append(raw.content)
            # ...and a server without the key replays it as the answer to new requests
            from hypercorn.config import Config
            from hypercorn.trio import serve
            cfg = Config()
            cfg.bind = ["127.0.0.1:0"]
            cfg.accesslog = cfg.errorlog = None
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(lambda task_status: serve(fake, cfg, task_status=task_status))
                addr_fake = binds[0].split("://")[1]
                with pytest.raises(PeerUnauthenticated, match="not sealed for this request"):
                    await client.status(addr_fake, node="node-b")
                with pytest.raises(PeerUnauthenticated, match="not sealed for this request"):
                    await client.commit(addr_fake, owner, decision)
                # forged "yes" answers: sealed with another key, and plain
                forged = {"v": 1, "re": b"\0" * 16, "ok": True, "result": {"owner": owner.key}}
                recorded[0] = frames.Sealer(new_keyring(tmp_path, "forger")).seal(cbor2.dumps(forged), b"")
                with pytest.raises(PeerUnauthenticated, match="no key of this keyring opens"):
                    await client.commit(addr_fake, owner, decision)
                recorded[0] = bytes([frames.PLAIN]) + cbor2.dumps(forged)
                with pytest.raises(PeerUnauthenticated, match="plain frame"):
                    await client.commit(addr_fake, owner, decision)
                nursery.cancel_scope.cancel()
    assert b.owners() == []


async def test_a_replayed_request_is_rejected_and_changes_nothing(tmp_path):
    keys = new_keyring(tmp_path)
    sealer = frames.Sealer(keys)
    b = LedgerNode(tmp_path, "node-b")
    face = PeerFace(b, keys, "127.0.0.1:0")
    async with serving(face) as (addr,):
        msg = commit_request(b, "replayed")
        frame = frames.encode_request(sealer, msg)
        first = await post(addr, frame)
        assert first.status_code == 200 and b.owners() == ["pod:replayed"]
        async with PeerClient(keys) as client:
            await client.release(addr, "pod:replayed", node="node-b")
        assert b.owners() == []
        again = await post(addr, frame)  # the recorded frame, sent again after the release
        assert again.status_code == 400
        got = frames.decode_answer(sealer, again.content, msg["id"])
        assert got["error"] == "replay" and "replayed request" in got["message"]
        assert b.owners() == []  # the replay did not commit again
        assert face.stats.requests[("commit", "replay")] == 1


@pytest.mark.parametrize("skew", [-31.0, +31.0])
async def test_a_stale_timestamp_is_rejected(tmp_path, skew):
    keys = new_keyring(tmp_path)
    b = LedgerNode(tmp_path, "node-b")
    async with serving(PeerFace(b, keys, "127.0.0.1:0", window_s=30.0)) as (addr,):
        msg = commit_request(b, "late", now=time.time() + skew)
        got = await post(addr, frames.encode_request(frames.Sealer(keys), msg))
        answer = frames.decode_answer(frames.Sealer(keys), got.content, msg["id"])
        assert got.status_code == 400 and answer["error"] == "stale"
        assert "accepted: within 30 s" in answer["message"]
        assert b.owners() == []


async def test_a_request_recorded_before_a_restart_is_rejected(tmp_path):
    keys = new_keyring(tmp_path)
    b = LedgerNode(tmp_path, "node-b")
    msg = commit_request(b, "before-restart")  # stamped now, the face starts after
    await trio.sleep(0.05)
    async with serving(PeerFace(b, keys, "127.0.0.1:0")) as (addr,):
        got = await post(addr, frames.encode_request(frames.Sealer(keys), msg))
        answer = frames.decode_answer(frames.Sealer(keys), got.content, msg["id"])
        assert answer["error"] == "stale" and "before this node's peer API started" in answer["message"]
    assert b.owners() == []


async def test_a_commit_that_does_not_fit_is_refused_with_the_ledgers_reasons(tmp_path):
    keys = new_keyring(tmp_path)
    b = LedgerNode(tmp_path, "node-b", "T4")
    async with serving(PeerFace(b, keys, "127.0.0.1:0")) as (addr,), PeerClient(keys) as client:
        first = b.propose("big", "mem=12g")
        stale = b.propose("late", "mem=8g")  # chosen from the same (now stale) view
        await client.commit(addr, *first)
        with pytest.raises(PeerRefused) as e:
            await client.commit(addr, *stale)
        assert "3072 MiB free, 8192 requested" in str(e.value)
        assert any("3072 MiB free, 8192 requested" in r for r in e.value.reasons)
        assert b.owners() == ["pod:big"]
        # a decision for another node is refused before the ledger is asked
        other = LedgerNode(tmp_path, "node-c", "T4").propose("elsewhere")
        with pytest.raises(PeerProtocolError, match="this is node 'node-b'") as e:
            await client.commit(addr, *other)
        assert e.value.kind == "wrong-node" and b.owners() == ["pod:big"]


async def test_concurrent_commits_from_two_clients_never_double_book(tmp_path):
    keys = new_keyring(tmp_path)
    b = LedgerNode(tmp_path, "node-b", "T4:2")  # 2 x 15360 MiB: room for 3 x 4 GiB on each
    proposals = [b.propose(f"p{i}", "mem=4g") for i in range(24)]  # all from the empty view
    ok, refused = [], []
    async with serving(PeerFace(b, keys, "127.0.0.1:0")) as (addr,), \
            PeerClient(keys) as c1, PeerClient(keys) as c2:
        async def one(client, owner, decision):
            try:
                await client.commit(addr, owner, decision)
                ok.append(owner.key)
            except PeerRefused:
                refused.append(owner.key)

        async with trio.open_nursery() as nursery:
            for i, (owner, decision) in enumerate(proposals):
                nursery.start_soon(one, (c1, c2)[i % 2], owner, decision)
    per_gpu = {}
    for owner, decision in proposals:
        if owner.key in ok:
            for c in decision.containers:
                for d in c.devices:
                    per_gpu[d.uuid] = per_gpu.get(d.uuid, 0) + d.mem_mib
    assert len(ok) + len(refused) == 24 and sorted(ok) == sorted(b.owners())
    assert all(v <= 15360 for v in per_gpu.values()), per_gpu
    assert all(g.mem_used <= g.mem_total for g in b.ledger.view().gpus)
    assert len(ok) == 3 * len(per_gpu)  # every GPU proposed is filled, none past full


async def test_bodies_are_bounded(tmp_path):
    keys = new_keyring(tmp_path)
    b = LedgerNode(tmp_path, "node-b")
    face = PeerFace(b, keys, "127.0.0.1:0", max_body_bytes=4096)
    async with serving(face) as (addr,), PeerClient(keys) as client:
        owner, decision = b.propose("huge")
        with pytest.raises(PeerProtocolError, match="over 4096 bytes") as e:
            await client.commit(addr, owner, decision, request={"pad": "x" * 5000})
        assert e.value.kind == "too-large" and b.owners() == []
        await client.commit(addr, owner, decision, request=parse_docker_env({"HAMI_VGPU_SPEC": "mem=4g"}, "x" * 100).to_dict())
        assert b.owners() == ["pod:huge"]


async def test_malformed_arguments_are_refused_with_the_reason(tmp_path):
    keys = new_keyring(tmp_path)
    b = LedgerNode(tmp_path, "node-b")
    async with serving(PeerFace(b, keys, "127.0.0.1:0")) as (addr,), PeerClient(keys) as client:
        _, decision = b.propose("x")
        bad_owner = {"owner": {"kind": "vm", "uid": "x"}, "decision": decision.to_dict()}
        with pytest.raises(PeerProtocolError, match="owner kind: bad value 'vm'") as e:
            await client.call(addr, "commit", bad_owner, to="node-b")
        assert e.value.kind == "bad-request"
        with pytest.raises(PeerProtocolError, match="'key' must be a non-empty string"):
            await client.call(addr, "release", {"key": 7}, to="node-b")
    assert b.owners() == []


async def test_unreachable_peer_and_unauthenticated_insecure_mode(tmp_path, free_port):
    with pytest.raises(PeerConfigError, match="needs the gossip keyring"):
        PeerFace(LedgerNode(tmp_path, "n"), None, "127.0.0.1:0")
    with pytest.raises(ValueError, match="insecure=True"):
        PeerClient(None)
    async with PeerClient(new_keyring(tmp_path), timeout_s=2) as client:
        with pytest.raises(PeerUnreachable, match=f"cannot reach peer 127.0.0.1:{free_port}") as e:
            await client.status(f"127.0.0.1:{free_port}", node="node-b")
        assert e.value.maybe_applied is False
    # insecure mode, explicitly: plain frames both ways, replays still refused
    b = LedgerNode(tmp_path, "node-b")
    async with serving(PeerFace(b, None, "127.0.0.1:0", insecure=True)) as (addr,), \
            PeerClient(None, insecure=True) as client:
        await client.commit(addr, *b.propose("plain"))
        assert b.owners() == ["pod:plain"]
        with pytest.raises(PeerUnauthenticated, match="sealed frame, but this side has no key"):
            async with PeerClient(new_keyring(tmp_path, "k2")) as sealed:
                await sealed.status(addr, node="node-b")


async def test_metrics_count_requests_by_method_and_result(tmp_path):
    keys = new_keyring(tmp_path)
    b = LedgerNode(tmp_path, "node-b", "T4")
    face = PeerFace(b, keys, "127.0.0.1:0")
    async with serving(face) as (addr,), PeerClient(keys) as client:
        first, second = b.propose("a", "mem=12g"), b.propose("b", "mem=12g")
        await client.commit(addr, *first)
        with pytest.raises(PeerRefused):
            await client.commit(addr, *second)
        await client.status(addr, node="node-b")
    samples = {(s.labels["method"], s.labels["result"]): s.value
               for m in PeerCollector(face.stats).collect() for s in m.samples}
    assert samples[("commit", "ok")] == 1 and samples[("commit", "refused")] == 1
    assert samples[("status", "ok")] == 1 and samples[("release", "ok")] == 0


def test_the_replay_cache_is_bounded_and_forgets_only_what_the_window_refuses():
    from hamid.peer.replay import ReplayGuard, Refused
    g = ReplayGuard(10.0, 3, now=1000.0)
    for i in range(3):
        g.admit(bytes([i]) * 16, 1000.0 + i, now=1001.0)
    with pytest.raises(Refused, match="replay cache's limit") as e:  # full of ids still inside the window
        g.admit(b"\x09" * 16, 1001.0, now=1001.0)
    assert e.value.kind == "busy" and len(g) == 3
    with pytest.raises(Refused) as e:
        g.admit(b"\x00" * 16, 1000.0, now=1009.0)
    assert e.value.kind == "replay"
    g.admit(b"\x09" * 16, 1011.0, now=1011.0)  # the id stamped 1000 left the window: room again
    assert len(g) == 3
    with pytest.raises(Refused) as e:  # and the window alone refuses it now
        g.admit(b"\x00" * 16, 1000.0, now=1011.0)
    assert e.value.kind == "stale"


async def test_the_face_and_client_follow_the_config(tmp_path):
    from hamid.config.schema import Config
    c = Config(peerListen="127.0.0.1:0", peerReplayWindow=5, peerMaxBodyBytes=8192, peerReplayCacheSize=99,
               peerTimeout=1.5)
    keys = new_keyring(tmp_path)
    face = PeerFace.from_config(LedgerNode(tmp_path, "n"), c, keys)
    assert (face.guard.window_s, face.guard.max_ids, face.max_body_bytes) == (5, 99, 8192)
    with pytest.raises(PeerConfigError, match="peerInsecure: true"):
        PeerFace.from_config(LedgerNode(tmp_path, "m"), c, None)
    insecure = PeerFace.from_config(LedgerNode(tmp_path, "o"), c.model_copy(update={"peerInsecure": True}), None)
    assert not insecure.sealer.secure
    async with PeerClient.from_config(c, keys, name="x") as client:
        assert client._http.timeout.read == 1.5
    with pytest.raises(Exception, match="peerListen: bad value 'nope'; accepted: HOST:PORT"):
        Config(peerListen="nope")


async def test_a_connection_that_brought_an_authenticated_request_leaves_its_sources_share(tmp_path):
    """The listener counts a connection against its source's share only until a request on it
    opened with the keyring: the leader's kept-alive connections never crowd it out of its own
    source's share, a stranger's (no key) stay counted."""
    keys = new_keyring(tmp_path)
    b = LedgerNode(tmp_path, "node-b")
    face = PeerFace(b, keys, "127.0.0.1:0")
    async with serving(face) as (addr,):
        async with PeerClient(new_keyring(tmp_path, "theirs"), name="x") as stranger:
            with pytest.raises(PeerUnauthenticated):
                await stranger.status(addr, node="node-b")
            assert face.connections.held("127.0.0.1") == 1  # kept alive by the client, still counted
        with trio.fail_after(10):  # the stranger's client closed it: the server sees it go
            while face.connections.open:
                await trio.sleep(0.01)
        async with PeerClient(keys, name="node-a") as leader:
            await leader.status(addr, node="node-b")
            assert face.connections.open == 1 and face.connections.held("127.0.0.1") == 0
