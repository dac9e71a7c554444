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
        doc = a.cluster()
        assert doc["stats"]["bytes_received"] > 0 and doc["stats"]["bytes_sent"] > 0  # the front's counters
    finally:
        for n in [*nodes, *([late] if late is not None else [])]:
            n.stop()
