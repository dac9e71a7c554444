"""Hostile and broken frames against a real daemon, and the pure pieces
(keyring, codec, formulas, broadcast queue, capacity documents)."""

from __future__ import annotations

import base64
import os

import cbor2
import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket

from gossipharness import Node, listening_ports, new_key, wait_until
from hamid.gossip.broadcast import Broadcasts
from hamid.gossip.codec import VERSION, Codec, FrameRejected
from hamid.keyring import Keyring, KeyringError
from hamid.gossip.params import GossipParams, suspicion_timeout
from hamid.gossip.transport import RESOURCE


@pytest.mark.parametrize("front", [False, True], ids=["daemon", "front"])
async def test_malformed_and_oversized_frames_are_dropped_and_counted(tmp_path, front):
    """Without frontDir the daemon reads the frames; with it, ``hamid front`` (no capabilities) holds the
    port, answers and drops them, and the daemon, which listens on no TCP port for gossip, gets only
    the frames that passed and the front's counters."""
    key = new_key()
    node = Node(tmp_path, "a", keys=[key], front=front).start()
    try:
        await trio.to_thread.run_sync(node.ready)
        if front:
            await trio.to_thread.run_sync(lambda: wait_until(lambda: node.port in listening_ports(node.front_proc.pid),
                                                             30, "the front's gossip port"))
            assert node.port not in listening_ports(node.proc.pid)
        host, port = node.addr.split(":")
        good = Codec(Keyring([base64.b64decode(key)]), 256 * 1024)
        other = Codec(Keyring([os.urandom(32)]), 256 * 1024)
        plain = Codec(None, 256 * 1024)
        me = {"f": "prober", "a": "127.0.0.1:1"}  # undialable: the daemon must answer on this connection

        def ping(seq, **over):
            return {"v": VERSION, "t": "ping", "seq": seq, "to": "a", **me, **over}

        async with open_websocket(host, int(port), RESOURCE, use_ssl=False) as ws:
            await ws.send_message(b"\x01garbage that is not a sealed frame at all")   # key
            await ws.send_message(other.encode(ping(1)))                              # key (wrong key)
            await ws.send_message(plain.encode(ping(2)))                              # key (plain)
            await ws.send_message(good.keyring.seal(b"\xff\xfe not cbor"))            # decode
            await ws.send_message(good.encode(ping(3, v=99)))                         # version
            await ws.send_message(good.encode({**ping(4), "seq": "x"}))                     # schema
            await ws.send_message(good.encode({"v": VERSION, "t": "bogus", **me}))   # schema
            await ws.send_message(good.encode(ping(5, g=[{"t": "cap", "n": "z", "v": "one"}])))  # schema
            await ws.send_message("text frame")                                       # decode
            await ws.send_message(good.encode(ping(6)))                               # fine
            with trio.fail_after(10):
                reply = good.decode(await ws.get_message())
            assert reply["t"] == "ack" and reply["seq"] == 6

        # oversized: the daemon closes that connection (1009) and carries on
        async with open_websocket(host, int(port), RESOURCE, use_ssl=False) as ws:
            with pytest.raises(ConnectionClosed) as e, trio.fail_after(10):
                # the daemon may close before the whole frame is even sent: the send itself then raises
                await ws.send_message(b"\x01" + os.urandom(300 * 1024))
                await ws.get_message()
            assert e.value.reason.code == 1009

        want = {"key": 3, "decode": 2, "version": 1, "schema": 3, "size": 1}
        # with a front its counters reach the daemon within a second
        def counted():
            doc = node.cluster()
            return doc if doc["stats"]["dropped"] == want else None

        doc = await trio.to_thread.run_sync(lambda: wait_until(counted, 30, f"the drops counted as {want}"))
        assert [m["name"] for m in doc["members"]] == ["a"]  # nobody got in
        assert node.proc.poll() is None
        if front:
            assert node.front_proc.poll() is None
            assert "gossip front connection closed" not in node.log.read_text()  # nothing odd reached the daemon
    finally:
        node.stop()


def test_keyring_file(tmp_path):
    f = tmp_path / "k"
    k16, k32 = os.urandom(16), os.urandom(32)
    f.write_text(f"# rotation\n{base64.b64encode(k32).decode()}\n\n{base64.b64encode(k16).decode()}\n")
    ring = Keyring.load(f)
    assert ring.keys == [k32, k16]
    old = Keyring([k16])
    assert ring.open(old.seal(b"hello")) == b"hello"  # receives with every key
    assert old.open(ring.seal(b"x")) is None  # sends with the first
    f.write_text(base64.b64encode(os.urandom(20)).decode())
    with pytest.raises(KeyringError, match="line 1: a key of 20 bytes; accepted: 16, 24 or 32"):
        Keyring.load(f)
    f.write_text("not base64!\n")
    with pytest.raises(KeyringError, match="not base64"):
        Keyring.load(f)
    with pytest.raises(KeyringError, match="cannot read"):
        Keyring.load(tmp_path / "missing")


def test_codec_limits():
    c = Codec(None, 4096)
    msg = {"v": VERSION, "t": "ack", "seq": 1, "f": "a", "a": "h:1"}
    assert c.decode(c.encode(dict(msg))) == msg
    with pytest.raises(FrameRejected) as e:
        c.decode(b"\x00" + cbor2.dumps({**msg, "pad": "x" * 5000}))
    assert e.value.reason == "size"
    nested = b"\x00" + b"\x81" * 100 + b"\x00"
    with pytest.raises(FrameRejected) as e:
        c.decode(nested)
    assert e.value.reason == "decode"
    with pytest.raises(FrameRejected) as e:
        c.decode(c.encode({**msg, "seq": -1}))
    assert e.value.reason == "schema"


def test_formulas_follow_memberlist():
    p = GossipParams(suspicion_mult=4, suspicion_max_timeout_mult=6)
    assert p.suspicion_bounds(10) == (4.0, 24.0)
    assert p.suspicion_bounds(100) == (8.0, 48.0)
    assert p.retransmit_limit(100) == 4 * 3 and p.retransmit_limit(9) == 4
    assert p.push_pull_scaled(32) == 30 and p.push_pull_scaled(100) == 90
    assert p.confirmations_needed(3) == 0 and p.confirmations_needed(10) == 2
    assert suspicion_timeout(4, 24, 0, 2) == 24
    assert suspicion_timeout(4, 24, 2, 2) == 4
    assert 4 < suspicion_timeout(4, 24, 1, 2) < 24


def test_broadcasts_are_retired_after_the_limit_and_replaced_by_key():
    b = Broadcasts()
    b.add(("n1", "m"), {"t": "alive", "i": 1})
    b.add(("n1", "m"), {"t": "alive", "i": 2})
    b.add(("n2", "m"), {"t": "suspect"})
    sent = [b.take(limit=3, budget=10_000) for _ in range(4)]
    assert [len(s) for s in sent] == [2, 2, 2, 0]
    assert {"t": "alive", "i": 1} not in sent[0]
    b.add(("big", "cap"), {"x": "y" * 500})
    b.add(("small", "m"), {"t": "s"})
    assert b.take(limit=3, budget=100) == [{"t": "s"}]


async def test_an_inbound_connection_leaves_its_sources_share_once_a_frame_opens_with_the_keyring():
    """Gossip's listener counts a stranger's connection against its address until its first
    frame opens with the keyring: a peer's links never use up its address's share."""
    from hamid.gossip.stats import Stats
    from hamid.gossip.transport import Transport

    key = base64.b64decode(new_key())
    got: list[dict] = []
    t = Transport("a", "127.0.0.1:1", Codec(Keyring([key]), 256 * 1024), Stats(), connect_timeout=5.0,
                  on_message=got.append)
    codec = Codec(Keyring([key]), 256 * 1024)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(t.serve, "127.0.0.1", 0)
        async with open_websocket("127.0.0.1", port, RESOURCE, use_ssl=False) as stranger, \
                open_websocket("127.0.0.1", port, RESOURCE, use_ssl=False) as peer:
            with trio.fail_after(10):
                while t.connections.open < 2:
                    await trio.sleep(0.01)
            assert t.connections.held("127.0.0.1") == 2
            await stranger.send_message(b"\x01not sealed with the key")
            await peer.send_message(codec.encode({"v": VERSION, "t": "ping", "seq": 1, "to": "a",
                                                  "f": "b", "a": "127.0.0.1:2"}))
            with trio.fail_after(10):
                while not got:
                    await trio.sleep(0.01)
            assert t.connections.held("127.0.0.1") == 1 and t.connections.open == 2  # the stranger's still counts
        nursery.cancel_scope.cancel()
