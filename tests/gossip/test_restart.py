"""A restarted seed finds its group again; a port that cannot be bound stops the daemon in one line and
leaves no member behind (issue 40, items 2 and 3).

Real ``hamid run`` daemons on loopback (gossipharness), read through their unix sockets.
"""

from __future__ import annotations

import json
import socket

import pytest
from gossipharness import Node, new_key, sees, start_all, wait_until


@pytest.mark.slow  # several seconds of real time: whole suite only (make test-fast skips it)
def test_a_restarted_seed_without_join_rejoins_the_members_it_knew(tmp_path):
    key = new_key()
    seed = Node(tmp_path, "seed", keys=[key])  # the first node: nobody to --join
    b = Node(tmp_path, "b", keys=[key], join=(seed.addr,))
    c = Node(tmp_path, "c", keys=[key], join=(seed.addr,))
    nodes = start_all([seed, b, c])
    try:
        everyone = {"seed": "alive", "b": "alive", "c": "alive"}
        for n in nodes:
            wait_until(lambda n=n: sees(n, everyone), 30, f"{n.name} to see everyone")
        seed.stop()  # a clean stop: the others keep it as left (and the seed keeps the members it knew)
        for n in (b, c):
            wait_until(lambda n=n: n.states()["seed"] == "left", 15, f"{n.name} to see the seed leave")
        seed.start().ready()
        for n in nodes:
            wait_until(lambda n=n: sees(n, everyone), 30, f"{n.name} to see everyone after the seed's restart")
        lines = [json.loads(x) for x in seed.log.read_text().splitlines() if x.startswith("{")]
        said = [x for x in lines if x.get("event") == "gossip listening"]
        assert "rejoining the 2 member(s) it knew" in said[-1]["found_by"], said[-1]
        assert "nobody yet" in said[0]["found_by"] and f"--join {seed.addr}" in said[0]["found_by"]
    finally:
        for n in nodes:
            n.stop()


def test_a_gossip_port_in_use_is_one_line_with_the_fix(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        n = Node(tmp_path, "a", keys=[new_key()], port=port).start()
        n.proc.wait(60)
        err = n.log.read_text()
    assert n.proc.returncode == 1, err
    assert "Traceback" not in err and "ExceptionGroup" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"hamid run: cannot listen on gossipListen 127.0.0.1:{port}: "), last
    assert "--gossip-listen HOST:PORT" in last


def test_a_port_that_fails_after_gossip_leaves_no_member_behind(tmp_path):
    key = new_key()
    a = start_all([Node(tmp_path, "a", keys=[key])])[0]
    try:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            b = Node(tmp_path, "b", keys=[key], join=(a.addr,), metrics_port=taken.getsockname()[1]).start()
            b.proc.wait(60)
        log = b.log.read_text()
        assert b.proc.returncode == 1 and "pick another port with --metrics-port" in log
        # b bound every other listener before gossip and stopped before joining: it never started gossip
        # (before, it had: whether a then kept it as "left" depended on how fast its join went out)
        assert '"gossip listening"' not in log, log
        assert set(a.members()) == {"a"}, a.members()
    finally:
        a.stop()
