"""Gossip through ``hamid front``: daemons whose network side runs unprivileged, beside plain daemons.

With ``frontDir`` the front (every capability dropped) holds the gossip port
and dials the peers; the daemon keeps the membership and talks to the front
over ``frontDir/gossip.sock`` only. These daemons open no TCP listener at all,
converge with daemons that run gossip themselves (Docker hosts, plain
``hamid run``), carry on when their front restarts, and leave through it.
"""

from __future__ import annotations

import os
import signal

import pytest

from gossipharness import SETPRIV, Node, listening_ports, new_key, sees, start_all, wait_until

pytestmark = pytest.mark.skipif(SETPRIV is None, reason="setpriv (util-linux) drops the front's capabilities")


def test_daemons_behind_fronts_converge_with_plain_ones_survive_a_front_restart_and_leave_through_it(tmp_path):
    key = new_key()
    a = Node(tmp_path, "a", keys=[key], front=True)
    b = Node(tmp_path, "b", keys=[key], front=True, join=(a.addr,))
    c = Node(tmp_path, "c", keys=[key], join=(a.addr,))  # no frontDir: gossip in the daemon, as before
    nodes = start_all([a, b, c])
    late = None
    try:
        everyone = {"a": "alive", "b": "alive", "c": "alive"}
        for n in nodes:
            wait_until(lambda n=n: sees(n, everyone), 30, f"{n.name} to see every node alive")
        for n in (a, b):
            assert listening_ports(n.proc.pid) == set()  # the privileged daemon reads no network bytes
            assert n.port in listening_ports(n.front_proc.pid)
            st = os.stat(n.front_dir / "gossip.sock")
            assert oct(st.st_mode & 0o777) == "0o660" and st.st_gid == os.getgid() + 1  # frontGroup alone
        assert c.port in listening_ports(c.proc.pid)

        # a's front dies and comes back: its daemon takes the new connection; a node that joins after
        # (through b) reaches a's membership only through the new front
        a.stop_front(signal.SIGKILL)
        a.start_front()
        late = Node(tmp_path, "d", keys=[key], join=(b.addr,)).start().ready()
        wait_until(lambda: sees(a, {**everyone, "d": "alive"}), 30, "a to see d through its restarted front")
        wait_until(lambda: sees(late, everyone), 30, "d to see every node")
        assert "gossip front reconnected" in a.log.read_text() or "gossip front connected" in a.log.read_text()

        # b stops cleanly: its signed leave notice goes out through its front
        b.stop()
        for n in (a, c):
            wait_until(lambda n=n: n.states()["b"] == "left", 15, f"{n.name} to see b leave")
        # the front's counters reach the daemon once a second: the restarted front's first report may be on its way
        wait_until(lambda: (lambda st: st["bytes_received"] > 0 and st["bytes_sent"] > 0)(a.cluster()["stats"]),
                   15, "a's daemon to carry its front's counters")
    finally:
        for n in [*nodes, *([late] if late is not None else [])]:
            n.stop()


async def test_the_daemon_end_takes_only_checked_messages_and_a_reconnecting_front(tmp_path):
    """What the daemon reads from gossip.sock: a frame that passes the codec's check and the front's
    counters. Anything else (over the size limit, not CBOR, an unknown kind, a frame failing its
    schema) ends that connection and reaches no membership; the next front is served, and frames
    sent while none is connected are dropped and counted as ``relay``."""
    import trio

    from hamid.gossip.codec import VERSION
    from hamid.gossip.relay import RelayTransport
    from hamid.gossip.relaywire import HEADER, Reader, encode
    from hamid.gossip.stats import Stats

    got: list[dict] = []
    stats = Stats()
    path = str(tmp_path / "g.sock")
    rt = RelayTransport("n", "127.0.0.1:7", path, stats, group=os.getgid(), connect_timeout=2.0,
                        max_frame_bytes=4096, on_message=got.append)
    ping = {"v": VERSION, "t": "ping", "seq": 1, "to": "n", "f": "p", "a": "127.0.0.1:9"}
    async with trio.open_nursery() as nursery:
        await nursery.start(rt.serve, "127.0.0.1", 7)
        assert oct(os.stat(path).st_mode & 0o777) == "0o660"
        rt.send("127.0.0.1:9", {"t": "ack", "seq": 1})
        assert stats.dropped["relay"] == 1  # no front yet
        for bad in (HEADER.pack(1 << 20),                                      # over the limit
                    HEADER.pack(3) + b"\xff\xfe\xfd",                            # not CBOR
                    encode({"k": "hello", "n": "x", "a": "y:1"}),               # not a front's message
                    encode({"k": "msg", "m": {**ping, "seq": "one"}}),          # fails the frame schema
                    encode({"k": "stats", "c": {"bytes_sent": -1}, "d": {}})):  # malformed counters
            s = await trio.open_unix_socket(path)
            r = Reader(s, 1 << 16)
            assert (await r.next())["k"] == "hello"
            await s.send_all(bad)
            with trio.fail_after(10):
                assert await s.receive_some(10) == b""  # closed by the daemon
            await s.aclose()
        assert got == []
        s = await trio.open_unix_socket(path)
        r = Reader(s, 1 << 16)
        assert await r.next() == {"k": "hello", "n": "n", "a": "127.0.0.1:7"}
        await s.send_all(encode({"k": "msg", "m": ping}) + encode(
            {"k": "stats", "c": {"bytes_sent": 10, "bytes_received": 20, "frames_sent": 1, "frames_received": 2},
             "d": {"key": 3}}))
        with trio.fail_after(10):
            while not got or stats.dropped["key"] != 3:
                await trio.sleep(0.01)
        assert got == [ping] and stats.bytes_received == 20
        rt.send("127.0.0.1:9", {"t": "ack", "seq": 1})
        rt.send("127.0.0.1:7", {"t": "ack", "seq": 2})  # itself: never sent
        rt.forget("127.0.0.1:9")
        assert await r.next() == {"k": "send", "to": "127.0.0.1:9", "m": {"t": "ack", "seq": 1}}
        assert await r.next() == {"k": "forget", "to": "127.0.0.1:9"}
        await s.aclose()
        nursery.cancel_scope.cancel()
